package codec

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// TestUnshuffleStream checks the non-temporal unshuffle against the
// textbook shuffle at every alignment of dst: aligned ones take the
// streaming loops, the rest the ordinary ones, and the elements past the
// SIMD groups the Go loop, each of which must give the same bytes.
func TestUnshuffleStream(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, ts := range []int{2, 4, 8} {
		for _, size := range []int{0, 15, 16 * ts, 16*ts + 3, 1021, 4096, 65536 + 12, 1 << 20} {
			src := make([]byte, size)
			for i := range src {
				src[i] = byte(r.Uint32())
			}
			sh := refShuffle(src, ts)
			for off := range 17 {
				buf := make([]byte, size+off+32)
				for i := range buf {
					buf[i] = 0xa5
				}
				dst := buf[off : off+size]
				unshuffleTo(dst, sh, ts, true)
				if !bytes.Equal(dst, src) {
					t.Fatalf("ts %d size %d dst offset %d (aligned %v): differs at %d", ts, size, off, alignedSIMD(dst), firstDiff(dst, src))
				}
				for i, b := range buf[off+size:] {
					if b != 0xa5 {
						t.Fatalf("ts %d size %d dst offset %d: wrote %d bytes past dst", ts, size, off, i+1)
					}
				}
				for i, b := range buf[:off] {
					if b != 0xa5 {
						t.Fatalf("ts %d size %d dst offset %d: wrote before dst at %d", ts, size, off, i)
					}
				}
			}
		}
	}
}

// TestDecodeBloscStreamed decodes blosc frames large enough for the
// streaming unshuffle (streamStoreMin) into aligned and unaligned
// destinations, whole and through the block ranges a split decode uses.
func TestDecodeBloscStreamed(t *testing.T) {
	raw := era5Chunk()[:3<<20]
	for _, ts := range []int{2, 4, 8} {
		src := bloscEncode(t, raw, ts, bloscLZ4, ByteShuffle, 256<<10, true)
		for _, off := range []int{0, 4, 8} {
			buf := make([]byte, len(raw)+off)
			dst := buf[off:]
			if err := Decode(Blosc, dst, src); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, raw) {
				t.Fatalf("ts %d offset %d: differs at %d", ts, off, firstDiff(dst, raw))
			}
		}
	}
}

// BenchmarkUnshuffleStream unshuffles 512 KiB blocks (blosc's usual block,
// decoded into a scratch the core's cache holds) into a 256 MiB area
// taken in turn, as a fill writes a sample's chunks: ordinary stores
// against non-temporal ones, on one goroutine and on GOMAXPROCS of them
// (the "parallel" cases, each goroutine taking the next block of the area;
// -cpu sets how many).
func BenchmarkUnshuffleStream(b *testing.B) {
	const bs = 512 << 10
	block := refShuffle(benchField()[:bs], 4)
	area := make([]byte, 256<<20+16)
	for !alignedSIMD(area) {
		area = area[1:]
	}
	area = area[:256<<20]
	clear(area)
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			b.SetBytes(bs)
			o := 0
			for b.Loop() {
				unshuffleTo(area[o:o+bs], block, 4, stream)
				o = (o + bs) % len(area)
			}
		})
	}
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("parallel/stream=%v", stream), func(b *testing.B) {
			b.SetBytes(bs)
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					o := int(next.Add(1)-1) % (len(area) / bs) * bs
					unshuffleTo(area[o:o+bs], block, 4, stream)
				}
			})
		})
	}
}
