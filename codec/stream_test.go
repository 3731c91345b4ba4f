package codec

import (
	"bytes"
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// streamData is compressible like a quantised field: runs and repeats.
func streamData(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/97) ^ byte(r.IntN(4))
	}
	return b
}

// apart keeps the ranges of randomSegments that do not overlap, as a
// stream's partial job wants.
func apart(rs [][2]int) [][2]int {
	slices.SortFunc(rs, func(a, b [2]int) int { return cmp.Compare(a[0], b[0]) })
	var out [][2]int
	end := 0
	for _, r := range rs {
		if r[0] >= end {
			out = append(out, r)
			end = r[1]
		}
	}
	return out
}

// streamEncodings are the ways a zstd chunk is written: in one frame
// without a checksum (as zarr-python and tensorstore write it) and with
// one, in a streamed frame whose window is smaller than the chunk, in
// several frames, and in a frame whose window is larger than the chunk.
// checked says the stream carries a checksum, so it is decoded whole.
func streamEncodings(t *testing.T, data []byte) []struct {
	name    string
	src     []byte
	checked bool
} {
	t.Helper()
	zs := func(opts ...zstd.EOption) []byte {
		var b bytes.Buffer
		w, err := zstd.NewWriter(&b, append(opts, zstd.WithEncoderCRC(false))...)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
		w.Close()
		return b.Bytes()
	}
	half := len(data) / 2
	return []struct {
		name    string
		src     []byte
		checked bool
	}{
		{"zstd", zstdEncode(t, data, false), false},
		{"zstd-checksum", zstdEncode(t, data, true), true},
		{"zstd-streamed", zs(zstd.WithWindowSize(1 << 16)), false},
		{"zstd-frames", append(zstdEncode(t, data[:half], false), zstdEncode(t, data[half:], false)...), false},
		{"zstd-frames-one-checked", append(zstdEncode(t, data[:half], false), zstdEncode(t, data[half:], true)...), true},
		{"zstd-wide-window", zs(zstd.WithWindowSize(8 << 20)), false},
	}
}

// A stream decoded up to its selection gives the selection's bytes of the
// whole decode, for selections at the front, the back and in between.
func TestStreamPart(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1 << 10, 3<<20 + 17} {
		data := streamData(r, n)
		for _, e := range streamEncodings(t, data) {
			if got := ZstdChecksummed(e.src); got != e.checked {
				t.Fatalf("%s: ZstdChecksummed %v, want %v", e.name, got, e.checked)
			}
			for k := range 12 {
				var segs []Segment
				for _, s := range apart(randomSegments(r, n)) {
					segs = append(segs, Segment{Off: int64(s[0]), Dst: make([]byte, s[1]-s[0])})
				}
				j := Job{Codec: ZstdPart, Src: e.src, Segments: segs, Size: int64(n)}
				if err := DecodeJob(&j); err != nil {
					t.Fatalf("%s, %d bytes, selection %d: %v", e.name, n, k, err)
				}
				for _, s := range segs {
					if !bytes.Equal(s.Dst, data[s.Off:s.Off+int64(len(s.Dst))]) {
						t.Fatalf("%s, %d bytes: segment %d+%d differs from the whole decode", e.name, n, s.Off, len(s.Dst))
					}
				}
			}
		}
	}
}

// A stream that ends before the selection does, or is damaged within it,
// fails with ErrCorrupt; segments that overlap are refused as the caller's
// mistake; damage past the selection of a stream without a checksum is
// not reached.
func TestStreamPartDamage(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	n := 2 << 20
	data := streamData(r, n)
	seg := func(off, l int) []Segment { return []Segment{{Off: int64(off), Dst: make([]byte, l)}} }
	for _, e := range streamEncodings(t, data) {
		short := Job{Codec: ZstdPart, Src: e.src[:len(e.src)/3], Segments: seg(n-100, 100), Size: int64(n)}
		if err := DecodeJob(&short); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s cut to a third, selection at the end: %v, want ErrCorrupt", e.name, err)
		}
		bad := bytes.Clone(e.src)
		for i := 16; i < len(bad)/4; i += 7 {
			bad[i] ^= 0x5a
		}
		within := Job{Codec: ZstdPart, Src: bad, Segments: seg(n-100, 100), Size: int64(n)}
		if err := DecodeJob(&within); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s damaged before the selection's end: %v, want ErrCorrupt", e.name, err)
		}
		over := Job{Codec: ZstdPart, Src: e.src, Segments: append(seg(0, 100), seg(50, 100)...), Size: int64(n)}
		if err := DecodeJob(&over); err == nil || errors.Is(err, ErrCorrupt) {
			t.Errorf("%s with overlapping segments: %v, want a caller's error", e.name, err)
		}
	}
	// Damage in the last frame (one block: only its body is changed, its
	// headers walk as before) of a stream without a checksum, a selection
	// in the first: decoded, and right.
	tail := 100 << 10 // one block
	head := zstdEncode(t, data[:n-tail], false)
	src := append(head, zstdEncode(t, data[n-tail:], false)...)
	bad := bytes.Clone(src)
	for i := len(head) + (len(src)-len(head))/2; i < len(bad); i += 5 {
		bad[i] ^= 0x5a
	}
	j := Job{Codec: ZstdPart, Src: bad, Segments: seg(10, 1000), Size: int64(n)}
	if err := DecodeJob(&j); err != nil || !bytes.Equal(j.Segments[0].Dst, data[10:1010]) {
		t.Errorf("zstd damaged past the selection: %v", err)
	}
	if err := Decode(Zstd, make([]byte, n), bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("the same chunk decoded whole: %v, want ErrCorrupt", err)
	}
}

// Damage that decodes without error (a byte of a raw block changed) is
// caught by the frame's checksum alone: a checksummed stream read in part
// refuses it as its whole read does, never giving the changed byte.
func TestStreamPartChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(r.Uint32()) // incompressible: stored in raw blocks
	}
	for _, checked := range []bool{false, true} {
		bad := zstdEncode(t, data, checked)
		i := bytes.Index(bad, data[5000:5064])
		if i < 0 {
			t.Fatal("the data is not stored raw")
		}
		bad[i] ^= 0xff
		j := Job{Codec: ZstdPart, Src: bad, Segments: []Segment{{Off: 4000, Dst: make([]byte, 2000)}}, Size: int64(len(data))}
		err := DecodeJob(&j)
		switch {
		case checked && !errors.Is(err, ErrCorrupt):
			t.Errorf("a checksummed stream changed silently within the selection: %v, want ErrCorrupt", err)
		case !checked && (err != nil || j.Segments[0].Dst[1000] == data[5000]):
			// The case a checksum is for: without one, a whole read
			// gives the changed byte too.
			t.Errorf("a stream without a checksum changed silently: %v, changed byte served %v", err, j.Segments[0].Dst[1000] != data[5000])
		}
	}
}

// A zstd frame whose header declares a window far larger than the chunk
// is not given that memory: it is decoded whole into the chunk's size, and
// refused there if it does not fit.
func TestStreamPartHostileWindow(t *testing.T) {
	// A frame header (magic, descriptor with no single-segment flag and no
	// content size, window descriptor 2^41) and a raw last block of 8 bytes.
	frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xf8}
	frame = append(frame, 0x41, 0x00, 0x00) // raw block, last, 8 bytes
	frame = append(frame, []byte("abcdefgh")...)
	j := Job{Codec: ZstdPart, Src: frame, Segments: []Segment{{Off: 0, Dst: make([]byte, 4)}}, Size: 8}
	if err := DecodeJob(&j); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("hostile window: %v, want success or ErrCorrupt", err)
		}
	} else if string(j.Segments[0].Dst) != "abcd" {
		t.Fatalf("hostile window decoded %q", j.Segments[0].Dst)
	}
}
