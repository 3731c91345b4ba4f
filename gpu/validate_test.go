package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/zarrfs/zarrfs/codec"
)

// TestZstdChecksAcceptValid runs the block checks over streams of every
// encoder level and kind of content: they must never reject a valid stream
// (a false rejection would send good chunks to the CPU as corrupt).
func TestZstdChecksAcceptValid(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	noise := make([]byte, 300<<10)
	for i := range noise {
		noise[i] = byte(r.Uint32())
	}
	text := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog; ", 9000))
	inputs := map[string][]byte{
		"field": field(200, 300, 3), "noise": noise, "zeros": make([]byte, 500<<10), "text": text,
		"mixed": append(append(bytes.Clone(noise[:70<<10]), text[:200<<10]...), field(50, 60, 4)...),
		"small": field(3, 5, 1), "byte": {7},
	}
	for _, lvl := range []zstd.EncoderLevel{zstd.SpeedFastest, zstd.SpeedDefault, zstd.SpeedBetterCompression, zstd.SpeedBestCompression} {
		for _, single := range []bool{false, true} {
			enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(lvl), zstd.WithSingleSegment(single), zstd.WithEncoderCRC(!single))
			if err != nil {
				t.Fatal(err)
			}
			for name, in := range inputs {
				src := enc.EncodeAll(in, nil)
				frames, err := zstdFrames(src)
				if err != nil {
					t.Errorf("%s, level %v, single segment %v: %v", name, lvl, single, err)
					continue
				}
				if len(frames) != 1 || (frames[0].size >= 0 && frames[0].size != int64(len(in))) {
					t.Errorf("%s, level %v: frames %+v", name, lvl, frames)
				}
			}
		}
	}
}

func TestSnappyCheck(t *testing.T) {
	for _, in := range [][]byte{field(40, 50, 1), bytes.Repeat([]byte("abcd"), 5000), {1}, make([]byte, 70000)} {
		src := s2.EncodeSnappy(nil, in)
		if err := snappyCheck(src, int64(len(in))); err != nil {
			t.Errorf("%d bytes: valid stream rejected: %v", len(in), err)
		}
		if err := snappyCheck(src, int64(len(in))+1); err == nil {
			t.Errorf("%d bytes: wrong size accepted", len(in))
		}
		if err := snappyCheck(src[:len(src)-1], int64(len(in))); err == nil && len(src) > 2 {
			t.Errorf("%d bytes: truncated stream accepted", len(in))
		}
	}
}

// TestPrepareCatchesDamagedStreams counts, for the damage the GPU
// corruption test applies, how many damaged blosc zstd and snappy chunks
// the CPU checks stop before nvCOMP. Every snappy stream that passes must
// decode without error (the walk proves it in bounds); zstd streams that
// pass may still be damaged inside their entropy-coded data.
func TestPrepareCatchesDamagedStreams(t *testing.T) {
	good, _, names := genJobs(t, 60, 70)
	r := rand.New(rand.NewPCG(9, 9))
	counts := map[string][2]int{}
	for i, g := range good {
		for _, kind := range damageKinds {
			src := damage(kind, g.Codec, g.Src, r)
			if src == nil {
				continue
			}
			if !strings.HasPrefix(names[i], "blosc-zstd") && !strings.HasPrefix(names[i], "blosc-snappy") {
				continue
			}
			comp := strings.Split(names[i], "-")[1]
			key := comp + "/" + kind
			j := codec.Job{Codec: g.Codec, Src: src, Dst: make([]byte, len(g.Dst))}
			p := prepare(&j)
			c := counts[key]
			c[1]++
			if p.err != nil {
				if !errors.Is(p.err, codec.ErrCorrupt) && !errors.Is(p.err, codec.ErrUnsupported) {
					t.Errorf("%s/%s: %v", names[i], kind, p.err)
				}
				c[0]++
			} else if comp == "snappy" {
				for _, pc := range p.pieces {
					if pc.algo == algoSnappy {
						if _, err := s2.Decode(nil, pc.src); err != nil {
							t.Errorf("%s/%s: stream passed the walk but does not decode: %v", names[i], kind, err)
						}
					}
				}
			}
			counts[key] = c
		}
	}
	var keys []string
	for k, c := range counts {
		keys = append(keys, fmt.Sprintf("%s %d/%d", k, c[0], c[1]))
	}
	t.Logf("damaged chunks stopped on the CPU: %s", strings.Join(keys, ", "))
}

// The CPU checks run on every chunk before the GPU sees it; these
// benchmarks give their cost per core in decoded bytes per second, to set
// against the GPU path's throughput (gigabytes per second for the whole
// machine).
func benchPrepare(b *testing.B, c codec.Name, enc func([]byte) []byte) {
	data := field(era5Y, era5X, 3)
	j := codec.Job{Codec: c, Src: enc(data), Dst: make([]byte, len(data))}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		if p := prepare(&j); p.err != nil {
			b.Fatal(p.err)
		}
	}
}

func BenchmarkPrepareZstd(b *testing.B) {
	benchPrepare(b, codec.Zstd, func(d []byte) []byte { return compress(codec.Zstd, d) })
}

func BenchmarkPrepareBloscZstd(b *testing.B) {
	benchPrepare(b, codec.Blosc, func(d []byte) []byte { return bloscCompress(d, 4, 256<<10, codec.ByteShuffle, "zstd") })
}

func BenchmarkPrepareBloscSnappy(b *testing.B) {
	benchPrepare(b, codec.Blosc, func(d []byte) []byte { return bloscCompress(d, 4, 256<<10, codec.ByteShuffle, "snappy") })
}

func BenchmarkPrepareBloscLZ4(b *testing.B) {
	benchPrepare(b, codec.Blosc, func(d []byte) []byte { return bloscCompress(d, 4, 256<<10, codec.ByteShuffle, "lz4") })
}

// BenchmarkHostChecks measures what the host checks of the exact codecs
// cost against the CPU decoder on the same chunks, in bytes of compressed
// input per second on one core: "checks" is prepare (framing and the walk
// of every LZ4 block), "framing" the same without the walk (what the GPU
// path did before), "cpu" codec.Decode. The GPU path runs the checks on
// its copy workers while the device decodes earlier rounds.
func BenchmarkHostChecks(b *testing.B) {
	era5 := field(era5Y, era5X, 3)
	r := rand.New(rand.NewPCG(8, 8))
	alpha := make([]byte, len(era5))
	for i := range alpha {
		alpha[i] = "abcdefgh"[r.IntN(8)] // many short matches: the walk's worst case
	}
	loads := []struct {
		name string
		j    codec.Job
	}{
		{"lz4-era5", codec.Job{Codec: codec.LZ4, Src: compress(codec.LZ4, era5)}},
		{"lz4-shortmatches", codec.Job{Codec: codec.LZ4, Src: compress(codec.LZ4, alpha)}},
		{"blosc-lz4-shuffle-era5", codec.Job{Codec: codec.Blosc, Src: bloscCompress(era5, 4, 256<<10, codec.ByteShuffle, "lz4")}},
		{"blosc-lz4-bitshuffle-era5", codec.Job{Codec: codec.Blosc, Src: bloscCompress(era5, 4, 256<<10, codec.BitShuffle, "lz4")}},
	}
	for _, l := range loads {
		j := l.j
		j.Dst = make([]byte, len(era5))
		b.Run(l.name+"/checks", func(b *testing.B) {
			b.SetBytes(int64(len(j.Src)))
			b.ReportMetric(float64(len(j.Dst))/float64(len(j.Src)), "ratio")
			for range b.N {
				if p := prepare(&j); p.err != nil {
					b.Fatal(p.err)
				}
			}
		})
		b.Run(l.name+"/framing", func(b *testing.B) {
			b.SetBytes(int64(len(j.Src)))
			for range b.N {
				if p := frame(&j); p.err != nil {
					b.Fatal(p.err)
				}
			}
		})
		b.Run(l.name+"/cpu", func(b *testing.B) {
			b.SetBytes(int64(len(j.Src)))
			for range b.N {
				if err := codec.Decode(j.Codec, j.Dst, j.Src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A zstd block whose Huffman tree description does not read as a tree
// (damage in its weights: the H100 faulted in nvCOMP on one, a code of
// more than 11 bits) goes to the CPU, never to nvCOMP, and the CPU's
// verdict is the chunk's (it rejects nearly all of them; a few, without a
// checksum, it decodes to other bytes, as it would any chunk). Every bit
// of the first block's tree description flipped in turn, over frames of
// several contents; the intact frames pass.
func TestZstdBadTreesGoToCPU(t *testing.T) {
	text := []byte(strings.Repeat("Zarr chunks, decoded on the GPU: 0123456789 ~!@#$%^&*() ", 400))
	r := rand.New(rand.NewPCG(5, 6))
	for i := range text {
		if r.IntN(7) == 0 {
			text[i] = byte(r.IntN(256)) // more symbols than 4-bit weights hold
		}
	}
	var trees, flipped, cpuRejects int
	for _, in := range [][]byte{text, append(bytes.Clone(text[:9000]), field(40, 50, 2)...)} {
		for _, src := range [][]byte{compress(codec.Zstd, in), zstdNoCRC(in)} {
			if p := prepare(&codec.Job{Codec: codec.Zstd, Src: src, Dst: make([]byte, len(in))}); p.err != nil {
				t.Fatalf("an intact frame: %v", p.err)
			}
			at, n := firstTree(t, src)
			for i := at; i < at+n; i++ {
				for bit := range 8 {
					bad := bytes.Clone(src)
					bad[i] ^= 1 << bit
					flipped++
					j := codec.Job{Codec: codec.Zstd, Src: bad, Dst: make([]byte, len(in))}
					p := prepare(&j)
					if !errors.Is(p.err, errZstdTables) {
						continue
					}
					trees++
					if !errors.Is(p.err, codec.ErrUnsupported) {
						t.Fatalf("a bad tree: %v, want it sent to the CPU", p.err)
					}
					if err := codec.Decode(codec.Zstd, make([]byte, len(in)), bad); err != nil {
						cpuRejects++
					}
				}
			}
		}
	}
	if trees == 0 {
		t.Fatalf("none of %d flips made a tree the host cannot read: the test shows nothing", flipped)
	}
	t.Logf("%d of %d flips in tree descriptions made trees the host cannot read, sent to the CPU, which rejected %d", trees, flipped, cpuRejects)
}

// firstTree returns where the first block's FSE-coded Huffman tree
// description lies in a one-frame zstd stream.
func firstTree(t *testing.T, src []byte) (at, n int) {
	t.Helper()
	fhd := src[4]
	p := 5
	if fhd&0x20 == 0 {
		p++ // window descriptor
	}
	fcs := []int{0, 2, 4, 8}[fhd>>6]
	if fhd&0x20 != 0 && fcs == 0 {
		fcs = 1
	}
	p += fcs + []int{0, 1, 2, 4}[fhd&3] + 3 // dictionary ID, block header
	b0 := int(src[p])
	if b0&3 != 2 {
		t.Fatalf("the first block's literals are not Huffman-coded with a new tree (type %d)", b0&3)
	}
	hdr := 3 + max((b0>>2)&3-1, 0)
	if src[p+hdr] >= 128 {
		t.Fatal("the first block's tree has 4-bit weights, not FSE-coded ones")
	}
	return p + hdr, 1 + int(src[p+hdr])
}

// fseTableSize reads the sequences' tables of real frames (the frames
// above pass), and refuses an accuracy log past the code's bound, a
// description cut short, and symbols past the code's last.
func TestFSETableSize(t *testing.T) {
	// Symbol 0 at 31 (value 62), symbol 1 at "less than 1" (a 0 bit): 11
	// bits, and the start of the bitstream after them.
	two := []byte{0xe0, 0x03, 0x55, 0x80}
	if n, err := fseTableSize(two, 35, 9); err != nil || n != 2 {
		t.Fatalf("a table of two symbols: %d, %v", n, err)
	}
	// Accuracy log 5 (low nibble 0), then symbol 0's probability 32, the
	// whole table (value 63 in 6 bits): legal, but a table of one symbol
	// that the CPU's small-chunk decoder refuses goes to the CPU; as does
	// a description with fewer than 4 bytes from its start.
	whole := []byte{0xf0, 0x03, 0x55, 0x80}
	if _, err := fseTableSize(whole, 35, 9); err == nil {
		t.Fatal("a table of one symbol passed")
	}
	if _, err := fseTableSize(two[:3], 35, 9); err == nil {
		t.Fatal("a description with 3 bytes from its start passed")
	}
	if _, err := fseTableSize(two, 0, 9); err == nil {
		t.Fatal("a second symbol where the code has one passed")
	}
	if _, err := fseTableSize([]byte{0x05, 0, 0, 0}, 35, 9); err == nil || !strings.Contains(err.Error(), "accuracy log 10") {
		t.Fatalf("accuracy log 10 for literal lengths (at most 9): %v", err)
	}
	if _, err := fseTableSize(whole[:1], 35, 9); err == nil {
		t.Fatal("a description cut short passed")
	}
}
