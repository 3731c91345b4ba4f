package gpu

import (
	"errors"
	"hash/adler32"
	"math/rand/v2"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
)

// TestCheckSumSwapped: a checksum over part of a byte-swapped chunk is
// that of the bytes before the swap, whatever the part's alignment to the
// elements, and a wrong one is reported in the class of its format.
func TestCheckSumSwapped(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	b := make([]byte, 200_003) // a partial last element, as for elemSize 2..8 it is not swapped
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	for _, e := range []int{2, 4, 8} {
		sw := make([]byte, len(b))
		copy(sw, b)
		swapInPlace(sw, e)
		for _, span := range [][2]int64{{0, int64(len(b))}, {3, 70000}, {65536, 65537}, {1, 1}, {199_000, 1003}} {
			off, n := span[0], span[1]
			want := adler32.Checksum(b[off : off+n])
			if err := checkSum(checkAdler32, want, sw, off, n, e, ""); err != nil {
				t.Errorf("elem %d, [%d,+%d): %v", e, off, n, err)
			}
			if err := checkSum(checkAdler32, want+1, sw, off, n, e, ""); !errors.Is(err, codec.ErrUnsupported) {
				t.Errorf("elem %d: a wrong Adler-32: %v, want it sent to the CPU", e, err)
			}
		}
	}
	if err := checkSum(checkCRC32, 1, b, 0, 10, 0, ""); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("a wrong gzip CRC-32: %v, want corrupt", err)
	}
}

// TestEmulatedSwapBloscZlib: byte swapping on the device and the host's
// Adler-32 check of blosc zlib streams, shuffled (checked before
// unshuffling) and not (checked over the swapped output).
func TestEmulatedSwapBloscZlib(t *testing.T) {
	d := field(40, 50, 5)
	for _, sh := range []codec.BloscShuffle{codec.NoShuffle, codec.ByteShuffle, codec.BitShuffle} {
		jobs := []codec.Job{{Codec: codec.Blosc, Src: bloscCompress(d, 4, 2048, sh, "zlib"), Dst: make([]byte, len(d))}}
		outs, errs := emulate(jobs, alignCases[0].aligns, 4, false)
		if errs[0] != nil {
			t.Fatalf("%v: %v", sh, errs[0])
		}
		if want := swapped(d, 4); string(outs[0]) != string(want) {
			t.Fatalf("%v: wrong bytes", sh)
		}
		p := prepare(&jobs[0])
		if len(p.sums) == 0 {
			t.Fatalf("%v: no stream checksums", sh)
		}
		bad := append([]byte(nil), jobs[0].Src...)
		s := p.sums[len(p.sums)-1]
		// The last stream's trailer: the last four bytes of the frame.
		bad[len(bad)-1] ^= 1
		jobs[0].Src = bad
		if _, errs := emulate(jobs, alignCases[0].aligns, 4, false); !errors.Is(errs[0], codec.ErrUnsupported) {
			t.Errorf("%v: stream at %d with a wrong Adler-32: %v, want it sent to the CPU", sh, s.off, errs[0])
		}
	}
}
