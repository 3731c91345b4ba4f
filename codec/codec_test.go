package codec

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// refShuffle is the textbook byte shuffle of one block (c-blosc's generic
// shuffle): byte j of element i goes to j*n+i; trailing bytes stay put.
func refShuffle(src []byte, ts int) []byte {
	out := make([]byte, len(src))
	n := len(src) / ts
	for i := 0; i < n; i++ {
		for j := 0; j < ts; j++ {
			out[j*n+i] = src[i*ts+j]
		}
	}
	copy(out[n*ts:], src[n*ts:])
	return out
}

// refBitShuffle is the bitshuffle layout written bit by bit: row 8j+k, bit
// position e holds bit k of byte j of element e.
func refBitShuffle(src []byte, ts int) []byte {
	out := make([]byte, len(src))
	n := len(src) / ts
	if n%8 != 0 {
		copy(out, src)
		return out
	}
	for e := 0; e < n; e++ {
		for j := 0; j < ts; j++ {
			for k := 0; k < 8; k++ {
				bit := (src[e*ts+j] >> k) & 1
				pos := (8*j+k)*n + e
				out[pos/8] |= bit << (pos % 8)
			}
		}
	}
	copy(out[n*ts:], src[n*ts:])
	return out
}

func TestUnshuffle(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, ts := range []int{1, 2, 3, 4, 5, 7, 8, 16, 255} {
		for _, size := range []int{0, 1, 7, 8, 31, 32, 33, 100, 1021, 4096, 4099} {
			src := make([]byte, size)
			for i := range src {
				src[i] = byte(r.Uint32())
			}
			got := make([]byte, size)
			Unshuffle(got, refShuffle(src, max(ts, 1)), ts)
			if !bytes.Equal(got, src) {
				t.Errorf("Unshuffle ts %d size %d: differs at %d", ts, size, firstDiff(got, src))
			}
			got = make([]byte, size)
			if err := BitUnshuffle(got, refBitShuffle(src, ts), ts); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, src) {
				t.Errorf("BitUnshuffle ts %d size %d: differs at %d", ts, size, firstDiff(got, src))
			}
		}
	}
	if err := BitUnshuffle(make([]byte, 3), make([]byte, 4), 1); err == nil {
		t.Error("BitUnshuffle with unequal lengths: no error")
	}
}

func TestBlosclz(t *testing.T) {
	tests := []struct {
		name string
		src  []byte
		want string // "" means: must fail
		size int    // len(dst)
	}{
		{"literal", []byte{2, 'a', 'b', 'c'}, "abc", 3},
		// literal "ab", then a match (ctrl 0x20: length 0+3, distance code
		// 1 + 1 = 2), then literal "z".
		{"match", []byte{1, 'a', 'b', 0x20, 1, 0, 'z'}, "ababaz", 6},
		// run: distance 1 repeats the last byte.
		{"run", []byte{0, 'x', 0x40, 0, 0, 'y'}, "xxxxxy", 6},
		// long match length: ctrl top bits 7 -> extra length bytes 255, 1.
		{"long", append([]byte{0, 'q', 0xe0, 255, 1, 0}, 0, 'e'), "q" + string(bytes.Repeat([]byte{'q'}, 6+255+1+3)) + "e", 1 + 6 + 255 + 1 + 3 + 1},
		// c-blosc wants a byte after a short match's distance byte.
		{"match at end", []byte{1, 'a', 'b', 0x20, 1}, "", 5},
		// A long-distance match that ends the stream is dropped, as in c-blosc.
		{"trailing far match", append(append([]byte{31}, bytes.Repeat([]byte{'v'}, 32)...), 0x3f, 0xff, 0, 0), "", 40},
		{"distance before start", []byte{0, 'a', 0x20, 5, 0, 'z'}, "", 8},
		{"literal past src", []byte{5, 'a'}, "", 8},
		{"literal past dst", []byte{3, 'a', 'b', 'c', 'd'}, "", 2},
		{"match past dst", []byte{0, 'a', 0x40, 0, 0, 'y'}, "", 3},
		{"truncated match", []byte{0, 'a', 0x20}, "", 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]byte, tc.size)
			n := blosclzDecode(dst, tc.src)
			if tc.want == "" {
				if n >= 0 && n == tc.size {
					t.Fatalf("decoded %d bytes %q, want failure", n, dst[:n])
				}
				return
			}
			if n < 0 || string(dst[:n]) != tc.want {
				t.Fatalf("got %d %q, want %q", n, dst[:max(n, 0)], tc.want)
			}
		})
	}
}

// bloscFrame builds a blosc frame by hand: one block per element of blocks,
// each a list of streams given as (csize-prefixed) payloads.
func bloscFrame(flags, typesize byte, nbytes, blocksize int, blocks [][][]byte) []byte {
	hdr := make([]byte, 16+4*len(blocks))
	hdr[0], hdr[1], hdr[2], hdr[3] = 2, 1, flags, typesize
	binary.LittleEndian.PutUint32(hdr[4:], uint32(nbytes))
	binary.LittleEndian.PutUint32(hdr[8:], uint32(blocksize))
	body := []byte{}
	for i, b := range blocks {
		binary.LittleEndian.PutUint32(hdr[16+4*i:], uint32(len(hdr)+len(body)))
		for _, s := range b {
			body = binary.LittleEndian.AppendUint32(body, uint32(len(s)))
			body = append(body, s...)
		}
	}
	out := append(hdr, body...)
	binary.LittleEndian.PutUint32(out[12:], uint32(len(out)))
	return out
}

func TestBloscHostile(t *testing.T) {
	lit := func(s string) []byte { return append([]byte{byte(len(s) - 1)}, s...) } // blosclz literal run
	good := bloscFrame(0x10, 1, 8, 4, [][][]byte{{lit("abcd")}, {[]byte("efgh")}})
	if err := Decode(Blosc, make([]byte, 8), good); err != nil {
		t.Fatalf("hand-made frame: %v", err)
	}
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	put := func(off int, v uint32) []byte {
		return mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b })
	}
	tests := []struct {
		name string
		src  []byte
		dst  int
		want error
	}{
		{"short", good[:10], 8, ErrCorrupt},
		{"version 3", mod(func(b []byte) []byte { b[0] = 3; return b }), 8, ErrUnsupported},
		{"future flag", mod(func(b []byte) []byte { b[2] |= 0x08; return b }), 8, ErrUnsupported},
		{"snappy", mod(func(b []byte) []byte { b[2] |= 2 << 5; return b }), 8, ErrUnsupported},
		{"codec 7", mod(func(b []byte) []byte { b[2] |= 7 << 5; return b }), 8, ErrUnsupported},
		{"lz version", mod(func(b []byte) []byte { b[1] = 9; return b }), 8, ErrUnsupported},
		{"typesize 0", mod(func(b []byte) []byte { b[3] = 0; return b }), 8, ErrCorrupt},
		{"nbytes huge", put(4, 1<<31-1), 8, ErrCorrupt},
		{"nbytes negative", put(4, 1<<31), 8, ErrCorrupt},
		{"blocksize 0", put(8, 0), 8, ErrCorrupt},
		{"blocksize > nbytes", put(8, 9), 8, ErrCorrupt},
		{"blocksize 1 (too many blocks)", put(8, 1), 8, ErrCorrupt},
		{"cbytes > len", put(12, uint32(len(good)+1)), 8, ErrCorrupt},
		{"cbytes < 16", put(12, 3), 8, ErrCorrupt},
		{"bstart past end", put(16, uint32(len(good))), 8, ErrCorrupt},
		{"bstart in table", put(16, 16), 8, ErrCorrupt},
		{"bstart negative", put(20, 1<<31), 8, ErrCorrupt},
		{"csize past end", put(24, 1000), 8, ErrCorrupt},
		{"csize negative", put(24, 1<<31), 8, ErrCorrupt},
		{"memcpyed size mismatch", mod(func(b []byte) []byte { b[2] |= 2; return b }), 8, ErrCorrupt},
		{"dst too small", good, 7, ErrCorrupt},
		{"dst too large", good, 9, ErrCorrupt},
		{"stream garbage", bloscFrame(0x10, 1, 8, 4, [][][]byte{{{31, 1}}, {[]byte("efgh")}}), 8, ErrCorrupt},
		{"stream short", bloscFrame(0x10, 1, 8, 4, [][][]byte{{lit("ab")}, {[]byte("efgh")}}), 8, ErrCorrupt},
		{"zstd stream too long", bloscFrame(0x10|4<<5, 1, 8, 4, [][][]byte{{zstdFrame(t, []byte("abcdefgh"))}, {[]byte("efgh")}}), 8, ErrCorrupt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Decode(Blosc, make([]byte, tc.dst), tc.src)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decode: %v, want %v", err, tc.want)
			}
		})
	}
	// A memcpyed frame decodes to its payload, shuffle flags ignored.
	mc := make([]byte, 16, 24)
	mc[0], mc[1], mc[2], mc[3] = 2, 1, 0x02|0x01, 4
	binary.LittleEndian.PutUint32(mc[4:], 8)
	binary.LittleEndian.PutUint32(mc[8:], 8)
	binary.LittleEndian.PutUint32(mc[12:], 24)
	mc = append(mc, "01234567"...)
	dst := make([]byte, 8)
	if err := Decode(Blosc, dst, mc); err != nil || string(dst) != "01234567" {
		t.Fatalf("memcpyed: %v %q", err, dst)
	}
}

func zstdFrame(t testing.TB, data []byte) []byte {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	if err != nil {
		t.Fatal(err)
	}
	return enc.EncodeAll(data, nil)
}

func TestDecodeHostile(t *testing.T) {
	data := bytes.Repeat([]byte("zarr chunk "), 100)
	zs := zstdFrame(t, data)
	badCRC := bytes.Clone(zs)
	badCRC[len(badCRC)-1] ^= 0xff
	lz := binary.LittleEndian.AppendUint32(nil, 1<<30)
	lz = append(lz, 0x1f, 'a', 1, 0, 0xff, 0xff, 0xff) // claims 1 GiB
	tests := []struct {
		name  string
		codec Name
		src   []byte
		dst   int
		want  error
	}{
		{"zstd bad checksum", Zstd, badCRC, len(data), ErrCorrupt},
		{"zstd truncated", Zstd, zs[:len(zs)-6], len(data), ErrCorrupt},
		{"zstd into smaller dst", Zstd, zs, len(data) - 1, ErrCorrupt},
		{"zstd into larger dst", Zstd, zs, len(data) + 1, ErrCorrupt},
		{"zstd empty src", Zstd, nil, 4, ErrCorrupt},
		{"lz4 huge header", LZ4, lz, 64, ErrCorrupt},
		{"lz4 short", LZ4, []byte{1, 0}, 1, ErrCorrupt},
		{"gzip garbage", Gzip, []byte("garbage!"), 8, ErrCorrupt},
		{"zlib garbage", Zlib, []byte("garbage!"), 8, ErrCorrupt},
		{"unknown", "snappy", []byte{1}, 1, ErrUnsupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := Decode(tc.codec, make([]byte, tc.dst), tc.src); !errors.Is(err, tc.want) {
				t.Fatalf("Decode: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestZstdHugeClaimAllocates checks that a frame whose header claims far more
// than dst holds fails without allocating what it claims.
func TestZstdHugeClaimAllocates(t *testing.T) {
	// A zstd frame header with a declared content size of 2^40 bytes
	// (single segment, 8-byte FCS), followed by one raw block of 4 bytes.
	src := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0}
	src = binary.LittleEndian.AppendUint64(src, 1<<40)
	src = append(src, 0x21, 0x00, 0x00, 'a', 'b', 'c', 'd')
	dst := make([]byte, 4)
	_ = Decode(Zstd, dst, src) // warm the pool
	allocs := testing.AllocsPerRun(20, func() {
		if err := Decode(Zstd, dst, src); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Decode: %v", err)
		}
	})
	if allocs > 10 {
		t.Errorf("%.0f allocations per hostile decode", allocs)
	}
}

func TestCPUCancel(t *testing.T) {
	c := must(NewCPU(Options{}))
	defer c.Close()
	if c.Workers() <= 0 {
		t.Fatalf("Workers %d", c.Workers())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	jobs := []Job{{Codec: Zstd, Src: zstdFrame(t, []byte("x")), Dst: make([]byte, 1)}}
	if err := c.DecodeBatch(ctx, jobs); !errors.Is(err, context.Canceled) {
		t.Fatalf("DecodeBatch: %v", err)
	}
	if !errors.Is(jobs[0].Err, context.Canceled) {
		t.Fatalf("job err %v", jobs[0].Err)
	}
	if err := c.DecodeBatch(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := c.DecodeBatch(context.Background(), jobs); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestCPUConcurrent runs many batches from many goroutines at once (run with
// -race).
func TestCPUConcurrent(t *testing.T) {
	c := must(NewCPU(Options{Workers: 2}))
	defer c.Close()
	data := bytes.Repeat([]byte("0123456789abcdef"), 512)
	src := zstdFrame(t, data)
	errc := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			jobs := make([]Job, 50)
			for i := range jobs {
				jobs[i] = Job{Codec: Zstd, Src: src, Dst: make([]byte, len(data))}
			}
			err := c.DecodeBatch(context.Background(), jobs)
			for i := range jobs {
				if err == nil && (jobs[i].Err != nil || !bytes.Equal(jobs[i].Dst, data)) {
					err = errors.New("job failed or wrong data")
				}
			}
			errc <- err
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

// Spare says how many workers no job waits for: all of them when the pool
// is idle, none while as many jobs are pending as it has workers.
// (decode's router asks it before it weighs the GPUs.)
func TestCPUSpare(t *testing.T) {
	cpu := must(NewCPU(Options{Workers: 2}))
	defer cpu.Close()
	data := bytes.Repeat([]byte("zarrfs spare "), 1000)
	enc := zstdEncode(t, data, false)
	if cpu.Spare() != 2 {
		t.Fatalf("idle pool: %d spare workers, want 2", cpu.Spare())
	}
	cpu.pending.Add(2) // every worker taken, as by another caller's batch
	if cpu.Spare() != 0 {
		t.Errorf("busy pool: %d spare workers, want 0", cpu.Spare())
	}
	cpu.pending.Add(-2)
	j := []Job{{Codec: Zstd, Src: enc, Dst: make([]byte, len(data))}}
	if err := cpu.DecodeBatch(context.Background(), j); err != nil || j[0].Err != nil || !bytes.Equal(j[0].Dst, data) {
		t.Fatalf("batch: %v, %v", err, j[0].Err)
	}
	if cpu.Spare() != 2 {
		t.Errorf("after the batch: %d spare workers, want 2", cpu.Spare())
	}
}
