package codec

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

// partialOf builds the partial job that reads segs of a stored blosc frame
// the way a reader does: the index from a prefix, then the ranges it names.
func partialOf(t *testing.T, src []byte, nbytes int, segs []Segment, gap int64) (Job, int64) {
	t.Helper()
	prefix := src[:min(len(src), 64)]
	x, need, err := ParseBloscIndex(prefix, nbytes)
	if err != nil {
		t.Fatalf("ParseBloscIndex: %v", err)
	}
	if x == nil {
		prefix = src[:need]
		if x, _, err = ParseBloscIndex(prefix, nbytes); err != nil || x == nil {
			t.Fatalf("ParseBloscIndex of %d bytes: %v", need, err)
		}
	}
	if x.CBytes() != int64(len(src)) {
		t.Fatalf("CBytes %d, frame has %d", x.CBytes(), len(src))
	}
	parts := []Part{{0, prefix}}
	fetched := int64(len(prefix))
	for _, r := range x.Ranges(segs, gap) {
		if r.Off < 0 || r.Off+r.N > int64(len(src)) {
			t.Fatalf("range %d+%d outside a %d-byte frame", r.Off, r.N, len(src))
		}
		parts = append(parts, Part{r.Off, src[r.Off : r.Off+r.N]})
		fetched += r.N
	}
	return Job{Codec: BloscPart, Parts: parts, Segments: segs, Size: int64(nbytes)}, fetched
}

// randomSegments picks up to four decoded ranges of a chunk of n bytes:
// the first byte, the last, a run across a block boundary, and random ones.
func randomSegments(r *rand.Rand, n int) [][2]int {
	var out [][2]int
	switch r.IntN(4) {
	case 0:
		out = append(out, [2]int{0, 1 + r.IntN(n)})
	case 1:
		l := 1 + r.IntN(n)
		out = append(out, [2]int{n - l, n})
	}
	for k := r.IntN(4); k >= 0; k-- {
		lo := r.IntN(n)
		hi := lo + 1 + r.IntN(n-lo)
		out = append(out, [2]int{lo, hi})
	}
	return out
}

func TestBloscPartialVectors(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 0
	for _, v := range loadVectors(t) {
		if v.Codec != Blosc || len(v.raw) == 0 {
			continue
		}
		n++
		t.Run(v.Name, func(t *testing.T) {
			for trial := range 8 {
				var segs []Segment
				var bufs [][]byte
				for _, s := range randomSegments(r, len(v.raw)) {
					buf := bytes.Repeat([]byte{0xa5}, s[1]-s[0]+16)
					bufs = append(bufs, buf)
					segs = append(segs, Segment{int64(s[0]), buf[:s[1]-s[0]]})
				}
				j, _ := partialOf(t, v.src, len(v.raw), segs, int64(trial%3)*64)
				if err := DecodeJob(&j); err != nil {
					t.Fatalf("trial %d: %v", trial, err)
				}
				for i, s := range segs {
					if want := v.raw[s.Off : s.Off+int64(len(s.Dst))]; !bytes.Equal(s.Dst, want) {
						t.Fatalf("trial %d segment %d+%d: first difference at %d", trial, s.Off, len(s.Dst), firstDiff(s.Dst, want))
					}
					for k, c := range bufs[i][len(s.Dst):] {
						if c != 0xa5 {
							t.Fatalf("trial %d: wrote past segment %d at +%d", trial, i, k)
						}
					}
				}
			}
		})
	}
	if n < 100 {
		t.Fatalf("only %d blosc vectors", n)
	}
}

// A selection of one block fetches that block alone (plus the index), and
// the CPU decoder's batches take partial jobs.
func TestBloscPartialFetchesOnlyItsBlocks(t *testing.T) {
	lit := func(s string) []byte { return append([]byte{byte(len(s) - 1)}, s...) }
	src := bloscFrame(0x10, 1, 12, 4, [][][]byte{{lit("abcd")}, {lit("efgh")}, {[]byte("ijkl")}})
	dst := make([]byte, 2)
	j, fetched := partialOf(t, src, 12, []Segment{{5, dst}}, 0)
	if len(j.Parts) != 2 || len(j.Parts[1].B) != 4+5 {
		t.Fatalf("parts %v: want the index and block 1 alone", j.Parts)
	}
	if fetched != 64 && fetched != int64(len(src)) {
		t.Logf("fetched %d of %d", fetched, len(src))
	}
	cpu := must(NewCPU(Options{Workers: 2}))
	defer cpu.Close()
	jobs := []Job{j}
	if err := cpu.DecodeBatch(context.Background(), jobs); err != nil || jobs[0].Err != nil {
		t.Fatalf("DecodeBatch: %v %v", err, jobs[0].Err)
	}
	if string(dst) != "fg" {
		t.Fatalf("decoded %q, want \"fg\"", dst)
	}
}

// c-blosc compressing with threads may store blocks out of order: a
// block's stored bytes end where the next one in frame order starts.
func TestBloscPartialBlocksOutOfOrder(t *testing.T) {
	lit := func(s string) []byte { return append([]byte{byte(len(s) - 1)}, s...) }
	src := bloscFrame(0x10, 1, 12, 4, [][][]byte{{lit("ijkl")}, {lit("efgh")}, {lit("abcd")}})
	// Relabel: block 0 is the frame's last, block 2 its first.
	b0 := binary.LittleEndian.Uint32(src[16:])
	b2 := binary.LittleEndian.Uint32(src[24:])
	binary.LittleEndian.PutUint32(src[16:], b2)
	binary.LittleEndian.PutUint32(src[24:], b0)
	whole := make([]byte, 12)
	if err := Decode(Blosc, whole, src); err != nil || string(whole) != "abcdefghijkl" {
		t.Fatalf("whole: %v %q", err, whole)
	}
	for lo := 0; lo < 12; lo++ {
		for hi := lo + 1; hi <= 12; hi++ {
			dst := make([]byte, hi-lo)
			j, _ := partialOf(t, src, 12, []Segment{{int64(lo), dst}}, 0)
			// Only the ranges: the prefix must not serve block bytes here.
			j.Parts[0].B = j.Parts[0].B[:16+12]
			if err := DecodeJob(&j); err != nil || string(dst) != "abcdefghijkl"[lo:hi] {
				t.Fatalf("[%d,%d): %v %q", lo, hi, err, dst)
			}
		}
	}
}

func TestBloscPartialHostile(t *testing.T) {
	lit := func(s string) []byte { return append([]byte{byte(len(s) - 1)}, s...) }
	good := bloscFrame(0x10, 1, 12, 4, [][][]byte{{lit("abcd")}, {lit("efgh")}, {[]byte("ijkl")}})
	put := func(off int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	for _, tc := range []struct {
		name   string
		prefix []byte
		nbytes int
	}{
		{"block past the frame", put(20, uint32(len(good))), 12},
		{"block in the table", put(20, 20), 12},
		{"frame larger than its data allows", put(12, 1<<30), 12},
		{"other decoded size", good, 13},
		{"nblocks past the frame", put(8, 1), 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := ParseBloscIndex(tc.prefix[:28], tc.nbytes); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("ParseBloscIndex: %v, want ErrCorrupt", err)
			}
			j := Job{Codec: BloscPart, Parts: []Part{{0, tc.prefix}}, Segments: []Segment{{0, make([]byte, 4)}}, Size: int64(tc.nbytes)}
			if err := DecodeJob(&j); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeJob: %v, want ErrCorrupt", err)
			}
		})
	}
	// Bytes a block needs that were not fetched, or fetched short.
	dst := make([]byte, 4)
	j, _ := partialOf(t, good, 12, []Segment{{4, dst}}, 0)
	j.Parts[0].B = j.Parts[0].B[:28]
	short := j
	short.Parts = []Part{j.Parts[0], {j.Parts[1].Off, j.Parts[1].B[:len(j.Parts[1].B)-1]}}
	missing := j
	missing.Parts = j.Parts[:1]
	outside := j
	outside.Segments = []Segment{{10, make([]byte, 4)}}
	noHeader := j
	noHeader.Parts = j.Parts[1:]
	for name, j := range map[string]Job{"short": short, "missing": missing, "outside": outside, "no header": noHeader} {
		if err := DecodeJob(&j); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	raw := Job{Codec: RawPart, Parts: []Part{{8, []byte("abcd")}}, Segments: []Segment{{9, make([]byte, 4)}}}
	if err := DecodeJob(&raw); !errors.Is(err, ErrCorrupt) {
		t.Errorf("raw past its part: %v, want ErrCorrupt", err)
	}
}

func TestMergeRanges(t *testing.T) {
	got := MergeRanges([]Range{{100, 10}, {0, 10}, {10, 5}, {40, 10}, {52, 1}, {105, 2}}, 2)
	want := []Range{{0, 15}, {40, 13}, {100, 10}}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%v, want %v", got, want)
		}
	}
}
