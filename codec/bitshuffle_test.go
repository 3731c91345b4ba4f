package codec

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// bitUnshuffleRef is the straightforward bit unshuffle, one 8x8 bit matrix
// (eight elements of one byte plane) at a time, gathered and scattered byte
// by byte. The fast path must match it byte for byte.
func bitUnshuffleRef(dst, src []byte, typesize int) {
	n := len(src) / typesize
	if n%8 != 0 {
		copy(dst, src)
		return
	}
	rows := n / 8
	for j := 0; j < typesize; j++ {
		plane := src[8*j*rows : 8*(j+1)*rows]
		for g := 0; g < rows; g++ {
			x := uint64(plane[g]) | uint64(plane[rows+g])<<8 |
				uint64(plane[2*rows+g])<<16 | uint64(plane[3*rows+g])<<24 |
				uint64(plane[4*rows+g])<<32 | uint64(plane[5*rows+g])<<40 |
				uint64(plane[6*rows+g])<<48 | uint64(plane[7*rows+g])<<56
			x = transpose8x8(x)
			o := dst[8*g*typesize+j:]
			for m := 0; m < 8; m++ {
				o[m*typesize] = byte(x >> (8 * m))
			}
		}
	}
	rest := n * typesize
	copy(dst[rest:], src[rest:])
}

// withBitLevels runs f once per bit unshuffle kernel this CPU has (the
// portable code first), with bitLevel lowered to it.
func withBitLevels(t *testing.T, f func(t *testing.T)) {
	best := bitLevel
	t.Cleanup(func() { bitLevel = best })
	for lvl := 0; lvl <= best; lvl++ {
		bitLevel = lvl
		t.Run(bitKernels[lvl].name, f)
	}
	bitLevel = best
}

// checkBitUnshuffle compares BitUnshuffle with the reference on src, and
// checks that nothing is written past dst.
func checkBitUnshuffle(t *testing.T, src []byte, ts int) {
	t.Helper()
	want := make([]byte, len(src))
	bitUnshuffleRef(want, src, ts)
	buf := bytes.Repeat([]byte{0xa5}, len(src)+64)
	got := buf[:len(src)]
	if err := BitUnshuffle(got, src, ts); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("typesize %d, %d bytes: differs from reference at %d", ts, len(src), firstDiff(got, want))
	}
	for i, c := range buf[len(src):] {
		if c != 0xa5 {
			t.Fatalf("typesize %d, %d bytes: wrote past dst at +%d", ts, len(src), i)
		}
	}
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestBitUnshuffleDiff checks every kernel against the reference for every
// typesize 1..16 (and a few blosc never uses) on element counts that are and
// are not multiples of 8, with trailing bytes, small and large enough to take
// several scratch slices and every kernel's tail.
func TestBitUnshuffleDiff(t *testing.T) {
	withBitLevels(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		counts := []int{0, 1, 7, 8, 16, 120, 128, 136, 248, 256, 264, 504, 512, 1000, 2048 + 8, 8192 + 40, 3 * 8192, 40000 + 8}
		types := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 255, 2049, 5000}
		for _, ts := range types {
			for _, n := range counts {
				if ts*n > 1<<20 {
					continue
				}
				for _, extra := range []int{0, 1, ts - 1} {
					if extra >= ts && extra > 0 {
						continue
					}
					checkBitUnshuffle(t, randBytes(r, ts*n+extra), ts)
				}
			}
		}
	})
}

// TestBitUnshuffleRoundTrip undoes the bit-by-bit shuffle of random data.
func TestBitUnshuffleRoundTrip(t *testing.T) {
	withBitLevels(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, ts := range []int{1, 2, 4, 8, 12} {
			for _, n := range []int{8, 264, 4096, 20000} {
				src := randBytes(r, ts*n+ts/2)
				got := make([]byte, len(src))
				if err := BitUnshuffle(got, refBitShuffle(src, ts), ts); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, src) {
					t.Fatalf("typesize %d n %d: differs at %d", ts, n, firstDiff(got, src))
				}
			}
		}
	})
}

// untransRef is bitUntrans one 8x8 bit matrix at a time.
func untransRef(src []byte, stride, groups int) []byte {
	out := make([]byte, 8*groups)
	for g := range groups {
		var x uint64
		for k := range 8 {
			x |= uint64(src[k*stride+g]) << (8 * k)
		}
		x = transpose8x8(x)
		for m := range 8 {
			out[8*g+m] = byte(x >> (8 * m))
		}
	}
	return out
}

// TestBitUntrans drives the row kernels directly with strides wider than
// the groups taken, as a slice of a larger block has: through bitUntrans
// (kernel, then portable tail) and, for the vector kernels, the kernel alone
// on whole steps, which bitUntrans only hands it past minGroups.
func TestBitUntrans(t *testing.T) {
	withBitLevels(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		k := bitKernels[bitLevel]
		for _, groups := range []int{1, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 1024, 2048 + 40} {
			for _, pad := range []int{0, 1, 13, 4096} {
				stride := groups + pad
				src := randBytes(r, 8*stride)
				want := untransRef(src, stride, groups)
				got := make([]byte, 8*groups+64)
				bitUntrans(got[:8*groups], src, stride, groups)
				if !bytes.Equal(got[:8*groups], want) {
					t.Fatalf("groups %d stride %d: differs at %d", groups, stride, firstDiff(got, want))
				}
				if k.step == 0 || groups < k.step {
					continue
				}
				whole := groups - groups%k.step
				clear(got)
				bitUntransVec(bitLevel, &got[0], &src[0], stride, whole)
				if !bytes.Equal(got[:8*whole], want[:8*whole]) {
					t.Fatalf("%s kernel, groups %d stride %d: differs at %d", k.name, whole, stride, firstDiff(got, want))
				}
				for i, c := range got[8*whole:] {
					if c != 0 {
						t.Fatalf("%s kernel, groups %d: wrote past its groups at +%d", k.name, whole, i)
					}
				}
			}
		}
	})
}

// TestBitUnshuffleVectors decodes every numcodecs bitshuffle vector with
// each kernel.
func TestBitUnshuffleVectors(t *testing.T) {
	vs := loadVectors(t)
	withBitLevels(t, func(t *testing.T) {
		seen := 0
		for _, v := range vs {
			if v.Codec != Blosc || v.Params["shuffle"] != "bitshuffle" {
				continue
			}
			seen++
			dst := make([]byte, len(v.raw))
			if err := Decode(v.Codec, dst, v.src); err != nil {
				t.Fatalf("%s: %v", v.Name, err)
			}
			if !bytes.Equal(dst, v.raw) {
				t.Fatalf("%s: differs at %d", v.Name, firstDiff(dst, v.raw))
			}
		}
		if seen == 0 {
			t.Fatal("no bitshuffle vectors")
		}
	})
}

func TestBitUnshuffleAllocs(t *testing.T) {
	src := randBytes(rand.New(rand.NewPCG(9, 9)), 4*8192*3)
	dst := make([]byte, len(src))
	if n := testing.AllocsPerRun(10, func() { _ = BitUnshuffle(dst, src, 4) }); n != 0 {
		t.Errorf("BitUnshuffle allocates %v times per call", n)
	}
}

// FuzzBitUnshuffle compares every kernel with the reference on arbitrary
// blocks, seeded from the numcodecs vectors' data.
func FuzzBitUnshuffle(f *testing.F) {
	for _, v := range loadVectors(f) {
		ts, _ := v.Params["typesize"].(float64)
		if v.Codec != Blosc || ts <= 0 {
			continue
		}
		// Small seeds keep executions and minimization fast; the vectors'
		// first 4 KiB still cover the kernels and their tails.
		raw := v.raw[:min(len(v.raw), 4096)]
		f.Add(uint8(ts), raw)
		f.Add(uint8(ts), refBitShuffle(raw, int(ts)))
	}
	f.Fuzz(func(t *testing.T, ts uint8, src []byte) {
		typesize := max(int(ts), 1)
		want := make([]byte, len(src))
		bitUnshuffleRef(want, src, typesize)
		best := bitLevel
		defer func() { bitLevel = best }()
		for lvl := 0; lvl <= best; lvl++ {
			// The kernel alone, on the whole steps that fit src as rows.
			if k := bitKernels[lvl]; k.step > 0 && len(src)/8 >= k.step {
				stride := len(src) / 8
				whole := stride - stride%k.step
				got := make([]byte, 8*whole)
				bitUntransVec(lvl, &got[0], &src[0], stride, whole)
				if want := untransRef(src, stride, whole); !bytes.Equal(got, want) {
					t.Fatalf("%s kernel, %d groups: differs at %d", k.name, whole, firstDiff(got, want))
				}
			}
			bitLevel = lvl
			got := make([]byte, len(src))
			if err := BitUnshuffle(got, src, typesize); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s kernel, typesize %d, %d bytes: differs at %d",
					bitKernels[lvl].name, typesize, len(src), firstDiff(got, want))
			}
		}
	})
}

// BenchmarkBitUnshuffle undoes the bit shuffle of one 512 KiB block (the
// blocks c-blosc writes for float32 at clevel 5) with each kernel, and with
// the reference for comparison.
func BenchmarkBitUnshuffle(b *testing.B) {
	src := benchField()[:512<<10]
	dst := make([]byte, len(src))
	best := bitLevel
	defer func() { bitLevel = best }()
	for _, ts := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("t%d/ref", ts), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			b.ReportAllocs()
			for b.Loop() {
				bitUnshuffleRef(dst, src, ts)
			}
		})
		for lvl := 0; lvl <= best; lvl++ {
			b.Run(fmt.Sprintf("t%d/%s", ts, bitKernels[lvl].name), func(b *testing.B) {
				bitLevel = lvl
				defer func() { bitLevel = best }()
				b.SetBytes(int64(len(src)))
				b.ReportAllocs()
				for b.Loop() {
					_ = BitUnshuffle(dst, src, ts)
				}
			})
		}
	}
}
