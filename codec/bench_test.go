package codec

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// benchField is a 721x1440 float32 field (a quarter-degree global grid):
// smooth large-scale structure plus a little deterministic noise, so it
// compresses like real model output rather than like random bytes. The
// noise is splitmix64, so the same field is easy to rebuild elsewhere
// (numpy) to time other decoders on it.
func benchField() []byte {
	const ny, nx = 721, 1440
	out := make([]byte, 4*ny*nx)
	for y := 0; y < ny; y++ {
		lat := (float64(y)/(ny-1) - 0.5) * math.Pi
		for x := 0; x < nx; x++ {
			lon := float64(x) / nx * 2 * math.Pi
			i := uint64(y*nx + x)
			u := float64(splitmix64(i)>>11) / (1 << 53)
			v := 250 + 40*math.Cos(lat) + 8*math.Sin(3*lon)*math.Cos(2*lat) +
				3*math.Sin(7*lon+5*lat) + (u-0.5)*0.5
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(v)))
		}
	}
	return out
}

func splitmix64(i uint64) uint64 {
	z := i*0x9e3779b97f4a7c15 + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// bloscEncode writes a blosc frame the way c-blosc lays it out (test-only:
// the package decodes, it does not encode): per block shuffle, then typesize
// split streams when split is set and c-blosc's rule allows, each stream
// stored raw when it does not compress.
func bloscEncode(tb testing.TB, data []byte, typesize, comp int, shuf BloscShuffle, blocksize int, split bool) []byte {
	tb.Helper()
	nblocks := (len(data) + blocksize - 1) / blocksize
	flags := byte(comp << 5)
	switch shuf {
	case ByteShuffle:
		flags |= bloscShuffleFlag
	case BitShuffle:
		flags |= bloscBitFlag
	}
	if !split {
		flags |= bloscNoSplitFlag
	}
	out := make([]byte, 16+4*nblocks)
	out[0], out[1], out[2], out[3] = 2, 1, flags, byte(typesize)
	binary.LittleEndian.PutUint32(out[4:], uint32(len(data)))
	binary.LittleEndian.PutUint32(out[8:], uint32(blocksize))
	zenc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		tb.Fatal(err)
	}
	var lzc lz4.Compressor
	for i := 0; i < nblocks; i++ {
		off := i * blocksize
		n := min(blocksize, len(data)-off)
		blk := data[off : off+n]
		switch {
		case shuf == ByteShuffle && typesize > 1:
			blk = refShuffle(blk, typesize)
		case shuf == BitShuffle && n >= typesize:
			blk = refBitShuffle(blk, typesize)
		}
		binary.LittleEndian.PutUint32(out[16+4*i:], uint32(len(out)))
		ns := 1
		if split && n == blocksize && typesize <= 16 && n/typesize >= 128 {
			ns = typesize
		}
		ne := n / ns
		for j := 0; j < ns; j++ {
			part := blk[j*ne : (j+1)*ne]
			var c []byte
			switch comp {
			case bloscLZ4:
				c = make([]byte, lz4.CompressBlockBound(ne))
				k, err := lzc.CompressBlock(part, c)
				if err != nil {
					tb.Fatal(err)
				}
				c = c[:k]
			case bloscZstd:
				c = zenc.EncodeAll(part, nil)
			default:
				tb.Fatalf("no test encoder for blosc codec %d", comp)
			}
			if len(c) == 0 || len(c) >= ne {
				c = part
			}
			out = binary.LittleEndian.AppendUint32(out, uint32(len(c)))
			out = append(out, c...)
		}
	}
	binary.LittleEndian.PutUint32(out[12:], uint32(len(out)))
	return out
}

func gzipEncode(tb testing.TB, data []byte) []byte {
	var b bytes.Buffer
	w, err := gzip.NewWriterLevel(&b, 6)
	if err != nil {
		tb.Fatal(err)
	}
	w.Write(data)
	w.Close()
	return b.Bytes()
}

func zstdEncode(tb testing.TB, data []byte, checksum bool) []byte {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderCRC(checksum))
	if err != nil {
		tb.Fatal(err)
	}
	return enc.EncodeAll(data, nil)
}

type benchCase struct {
	name  string
	codec Name
	src   []byte
}

// benchCases compresses the field as numcodecs would with its defaults:
// Zstd(level=3) (checksum on, as zarr v3 writes it), Blosc clevel 5 — lz4 with
// 512 KiB blocks split in typesize streams, zstd with 256 KiB unsplit blocks,
// as c-blosc sizes them for float32 — and GZip.
func benchCases(tb testing.TB, field []byte) []benchCase {
	return []benchCase{
		{"zstd3", Zstd, zstdEncode(tb, field, true)},
		{"blosc-lz4-shuffle", Blosc, bloscEncode(tb, field, 4, bloscLZ4, ByteShuffle, 512<<10, true)},
		{"blosc-zstd-shuffle", Blosc, bloscEncode(tb, field, 4, bloscZstd, ByteShuffle, 256<<10, false)},
		{"blosc-lz4-bitshuffle", Blosc, bloscEncode(tb, field, 4, bloscLZ4, BitShuffle, 512<<10, true)},
		{"gzip6", Gzip, gzipEncode(tb, field)},
	}
}

// TestRoundTripLarge decodes the benchmark frames (large, multi-block,
// written by independent encoders) and compares with the field.
func TestRoundTripLarge(t *testing.T) {
	field := benchField()
	cases := benchCases(t, field)
	cases = append(cases,
		benchCase{"blosc-zstd-bitshuffle-split-odd", Blosc, bloscEncode(t, field[:len(field)-3], 8, bloscZstd, BitShuffle, 100000, true)},
		benchCase{"blosc-lz4-noshuffle", Blosc, bloscEncode(t, field, 4, bloscLZ4, NoShuffle, 1<<20, true)},
		benchCase{"blosc-lz4-shuffle-t2", Blosc, bloscEncode(t, field[:len(field)-1], 2, bloscLZ4, ByteShuffle, 65536, true)},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := field
			if f, err := ParseBlosc(c.src); err == nil {
				want = field[:f.NBytes]
			}
			dst := make([]byte, len(want))
			if err := Decode(c.codec, dst, c.src); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, want) {
				t.Fatalf("differs at %d", firstDiff(dst, want))
			}
			t.Logf("%s: %d -> %d bytes (ratio %.2f)", c.name, len(want), len(c.src), float64(len(want))/float64(len(c.src)))
		})
	}
}

// BenchmarkDecode decodes one 721x1440 float32 chunk per op, one goroutine.
func BenchmarkDecode(b *testing.B) {
	field := benchField()
	for _, c := range benchCases(b, field) {
		b.Run(c.name, func(b *testing.B) {
			dst := make([]byte, len(field))
			if err := Decode(c.codec, dst, c.src); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(field)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := Decode(c.codec, dst, c.src); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(field))/float64(len(c.src)), "ratio")
		})
	}
}

// BenchmarkCPUBatch decodes batches of 8 chunks on a CPU decoder with
// GOMAXPROCS workers: the throughput a blob fill sees.
func BenchmarkCPUBatch(b *testing.B) {
	field := benchField()
	c := must(NewCPU(Options{}))
	defer c.Close()
	for _, bc := range benchCases(b, field) {
		b.Run(fmt.Sprintf("%s-w%d", bc.name, c.Workers()), func(b *testing.B) {
			jobs := make([]Job, 8)
			for i := range jobs {
				jobs[i] = Job{Codec: bc.codec, Src: bc.src, Dst: make([]byte, len(field))}
			}
			b.SetBytes(int64(len(jobs) * len(field)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := c.DecodeBatch(context.Background(), jobs); err != nil {
					b.Fatal(err)
				}
				for i := range jobs {
					if jobs[i].Err != nil {
						b.Fatal(jobs[i].Err)
					}
				}
			}
		})
	}
}

func BenchmarkUnshuffle(b *testing.B) {
	for _, ts := range []int{2, 4, 8} {
		src := benchField()[:512<<10]
		dst := make([]byte, len(src))
		b.Run(fmt.Sprintf("byte-t%d", ts), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				Unshuffle(dst, src, ts)
			}
		})
		b.Run(fmt.Sprintf("bit-t%d", ts), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				_ = BitUnshuffle(dst, src, ts)
			}
		})
	}
}

// BenchmarkDecodeNumcodecs decodes the chunks testdata/bench_numcodecs.py
// wrote with numcodecs into $ZARRFS_CODEC_BENCH_DIR, so MB/s compare with
// that script's numcodecs timings on identical bytes.
func BenchmarkDecodeNumcodecs(b *testing.B) {
	dir := os.Getenv("ZARRFS_CODEC_BENCH_DIR")
	if dir == "" {
		b.Skip("set ZARRFS_CODEC_BENCH_DIR to a folder written by testdata/bench_numcodecs.py DIR")
	}
	field, err := os.ReadFile(filepath.Join(dir, "field.raw"))
	if err != nil {
		b.Fatal(err)
	}
	codecs := map[string]Name{"zstd3": Zstd, "blosc-lz4-shuffle": Blosc, "blosc-zstd-shuffle": Blosc,
		"blosc-lz4-bitshuffle": Blosc, "gzip6": Gzip}
	for _, name := range []string{"zstd3", "blosc-lz4-shuffle", "blosc-zstd-shuffle", "blosc-lz4-bitshuffle", "gzip6"} {
		src, err := os.ReadFile(filepath.Join(dir, name+".bin"))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			dst := make([]byte, len(field))
			if err := Decode(codecs[name], dst, src); err != nil || !bytes.Equal(dst, field) {
				b.Fatalf("decode: %v (equal %v)", err, bytes.Equal(dst, field))
			}
			b.SetBytes(int64(len(field)))
			b.ReportAllocs()
			for b.Loop() {
				if err := Decode(codecs[name], dst, src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
