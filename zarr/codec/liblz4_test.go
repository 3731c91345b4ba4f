package codec

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/pierrec/lz4/v4"
)

// libLZ4OrSkip returns liblz4, or skips where the machine has none (the Go
// decoder then decodes every block, as the rest of the package's tests
// check); with ZARRFS_EXPECT_LIBLZ4 set (CI), a missing liblz4 fails
// instead.
func libLZ4OrSkip(t testing.TB) *libLZ4 {
	t.Helper()
	l, err := nativeLZ4()
	if l == nil {
		skipWithout(t, "liblz4", "ZARRFS_EXPECT_LIBLZ4", err)
	}
	return l
}

// agreeLZ4 decodes src into n bytes with both decoders (agreeOn) and
// returns liblz4's verdict. An LZ4 block has no checksum: what a damaged
// block decodes to, when it still parses, is data to both decoders, so
// only their agreement is checked there.
func agreeLZ4(t *testing.T, l *libLZ4, what string, src []byte, n int, want []byte) error {
	t.Helper()
	return agreeOn(t, what, n, want,
		func(dst []byte) error { return decodeLZ4Go(dst, src) },
		func(dst []byte) error { return l.decode(dst, src) })
}

// lz4Corpus is LZ4 blocks as blosc writes them (a shuffled block of an
// ERA5-like field, split into its byte streams) and as edge cases make
// them: data that does not compress, runs of one byte, sizes around
// nativeLZ4Min.
func lz4Corpus(t testing.TB) (blocks, datas [][]byte) {
	chunk := era5Chunk()
	rng := rand.New(rand.NewPCG(1, 2))
	noise := make([]byte, 300<<10)
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	add := func(data []byte) {
		c := make([]byte, lz4.CompressBlockBound(len(data)))
		n, err := lz4.CompressBlock(data, c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 { // incompressible: pierrec writes nothing; an LZ4 block of literals only
			c = lz4Literals(data)
			n = len(c)
		}
		blocks = append(blocks, c[:n])
		datas = append(datas, data)
	}
	shuffled := refShuffle(chunk[4<<20:][:512<<10], 4)
	for s := range 4 {
		add(shuffled[s*128<<10:][:128<<10]) // blosc's split streams
	}
	add(shuffled)
	add(chunk[:nativeLZ4Min])
	add(chunk[:nativeLZ4Min+1])
	add(noise)
	add(noise[:5000])
	add(bytes.Repeat([]byte{7}, 1<<20))
	return blocks, datas
}

// lz4Literals is data as one LZ4 sequence of literals only: a valid
// block that does not compress.
func lz4Literals(data []byte) []byte {
	n := len(data)
	out := []byte{0xf0}
	if n < 15 {
		out[0] = byte(n << 4)
	} else {
		for r := n - 15; ; r -= 255 {
			if r < 255 {
				out = append(out, byte(r))
				break
			}
			out = append(out, 255)
		}
	}
	return append(out, data...)
}

// TestLibLZ4Agrees checks liblz4 against the Go decoder over the corpus
// and damaged forms of it: a wrong dst size, truncation, trailing bytes and
// changed bytes anywhere. Every block decodes to its data with both; where
// both accept a damaged block, they give the same bytes; neither writes
// past the buffer or fails with another error than ErrCorrupt.
func TestLibLZ4Agrees(t *testing.T) {
	l := libLZ4OrSkip(t)
	blocks, datas := lz4Corpus(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for i, src := range blocks {
		n := len(datas[i])
		if err := agreeLZ4(t, l, fmt.Sprintf("block %d", i), src, n, datas[i]); err != nil {
			t.Fatalf("block %d: liblz4 refuses it: %v", i, err)
		}
		for _, m := range []int{n - 1, n + 1, n / 2, 2 * n} {
			if err := agreeLZ4(t, l, fmt.Sprintf("block %d into %d", i, m), src, m, nil); err == nil {
				t.Fatalf("block %d: accepted into %d bytes, decodes to %d", i, m, n)
			}
		}
		for _, cut := range []int{0, 1, len(src) / 2, len(src) - 1} {
			if err := agreeLZ4(t, l, fmt.Sprintf("block %d cut to %d", i, cut), src[:cut], n, nil); err == nil {
				t.Fatalf("block %d: accepted cut to %d bytes", i, cut)
			}
		}
		agreeLZ4(t, l, fmt.Sprintf("block %d with trailing bytes", i), append(bytes.Clone(src), 0, 1, 2), n, nil)
		for range 64 {
			bad := bytes.Clone(src)
			bad[rng.IntN(len(bad))] ^= byte(1 + rng.IntN(255))
			agreeLZ4(t, l, fmt.Sprintf("block %d damaged", i), bad, n, nil)
		}
	}
}

// TestLibLZ4Used checks which blocks go through liblz4: from nativeLZ4Min
// decoded bytes up to the int32 the library takes, and that Decode of a
// blosc-lz4 chunk, as the CPU workers call it, gives its data.
func TestLibLZ4Used(t *testing.T) {
	l := libLZ4OrSkip(t)
	if got := LZ4Decoder(); !strings.HasPrefix(got, "liblz4 1.") {
		t.Fatalf("LZ4Decoder: %q", got)
	}
	for _, c := range []struct {
		n, m int
		want bool
	}{{nativeLZ4Min, 100, true}, {nativeLZ4Min - 1, 100, false}, {math.MaxInt32, 1 << 20, true}, {math.MaxInt32 + 1, 1 << 20, false}, {1 << 20, math.MaxInt32 + 1, false}} {
		if got := lz4Native(c.n, c.m); (got == l) != c.want || (got != nil && got != l) {
			t.Errorf("lz4Native(%d, %d) = %v, want liblz4 %v", c.n, c.m, got, c.want)
		}
	}
	chunk := era5Chunk()[:2<<20]
	src := bloscEncode(t, chunk, 4, bloscLZ4, ByteShuffle, 256<<10, true)
	dst := make([]byte, len(chunk))
	if err := Decode(Blosc, dst, src); err != nil || !bytes.Equal(dst, chunk) {
		t.Fatalf("blosc-lz4 chunk: %v, equal %v", err, bytes.Equal(dst, chunk))
	}
}

// TestLoadLibLZ4 checks the settings of ZARRFS_LIBLZ4: off, and a path that
// is not a library, both leave the Go decoder with a reason.
func TestLoadLibLZ4(t *testing.T) {
	if l, err := loadLibLZ4("off"); l != nil || err == nil || !strings.Contains(err.Error(), "ZARRFS_LIBLZ4=off") {
		t.Fatalf("off: %v %v", l, err)
	}
	if l, err := loadLibLZ4(t.TempDir() + "/liblz4.so.1"); l != nil || err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Fatalf("missing path: %v %v", l, err)
	}
}

// FuzzLZ4Decoders feeds both decoders the same input: neither writes past
// dst or fails with another error than ErrCorrupt, and where both accept
// it they give the same bytes.
func FuzzLZ4Decoders(f *testing.F) {
	blocks, datas := lz4Corpus(f)
	for i, src := range blocks {
		if len(src) <= 1<<14 {
			f.Add(uint32(len(datas[i])), src)
		}
	}
	l := libLZ4OrSkip(f)
	f.Fuzz(func(t *testing.T, size uint32, src []byte) {
		agreeLZ4(t, l, "fuzzed", src, int(size%(1<<20)), nil)
	})
}

// BenchmarkLZ4Decoders times the Go decoder and liblz4, one goroutine, on
// blosc-lz4 blocks as the benchmark stores hold them: 512 KiB of an
// ERA5-like chunk, byte-shuffled and split into its four streams.
func BenchmarkLZ4Decoders(b *testing.B) {
	l := libLZ4OrSkip(b)
	chunk := era5Chunk()
	var srcs [][]byte
	for off := 0; off+512<<10 <= len(chunk); off += 512 << 10 {
		blk := refShuffle(chunk[off:][:512<<10], 4)
		for s := range 4 {
			st := blk[s*128<<10:][:128<<10]
			c := make([]byte, lz4.CompressBlockBound(len(st)))
			n, err := lz4.CompressBlock(st, c, nil)
			if err != nil || n == 0 {
				b.Fatal(n, err)
			}
			srcs = append(srcs, c[:n])
		}
	}
	dst := make([]byte, 128<<10)
	for _, dec := range []struct {
		name string
		fn   func(dst, src []byte) error
	}{{"go", decodeLZ4Go}, {"liblz4", l.decode}} {
		b.Run(dec.name, func(b *testing.B) {
			b.SetBytes(int64(len(srcs) * len(dst)))
			for b.Loop() {
				for _, src := range srcs {
					if err := dec.fn(dst, src); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// TestLibLZ4OffsetZero: liblz4 decodes a match offset of 0, which the
// format forbids and the Go decoder refuses, rather than refusing it. What
// it writes must not depend on what the buffer held before (a reused
// buffer would otherwise leak a previous chunk's bytes into this one).
func TestLibLZ4OffsetZero(t *testing.T) {
	l := libLZ4OrSkip(t)
	lead := append([]byte{0xfa}, bytes.Repeat([]byte{255}, 16)...) // 15+16*255+... literals, then a match of 14
	lead = append(lead, 1)
	nlit := 15 + 16*255 + 1
	blk := append(append(lead, bytes.Repeat([]byte("abcdefgh"), nlit/8+1)[:nlit]...), 0, 0)
	blk = append(blk, 0xc0)
	blk = append(blk, "twelve bytes"...)
	n := nlit + 14 + 12
	var outs [][]byte
	for _, fill := range []byte{0x00, 0xa5, 0xff} {
		dst := bytes.Repeat([]byte{fill}, n)
		if err := l.decode(dst, blk); err != nil {
			t.Logf("liblz4 refuses offset 0: %v", err) // what the format asks
			return
		}
		outs = append(outs, dst)
	}
	if !bytes.Equal(outs[0], outs[1]) || !bytes.Equal(outs[0], outs[2]) {
		t.Fatalf("offset 0 decodes to what the buffer held: % x / % x", outs[0][nlit:nlit+14], outs[2][nlit:nlit+14])
	}
	t.Logf("offset 0 decodes to % x", outs[0][nlit:nlit+14])
}
