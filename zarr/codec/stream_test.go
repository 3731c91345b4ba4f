package codec

import (
	"bytes"
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/klauspost/compress/zlib"
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

// streamEncodings are the ways a stream codec's chunk is written: zstd in
// one frame with and without a checksum, in a streamed frame whose window
// is smaller than the chunk, in several frames, and in a frame whose
// window is larger than the chunk; gzip in one member and in two; zlib.
func streamEncodings(t *testing.T, data []byte) []struct {
	name  string
	codec Name
	src   []byte
} {
	t.Helper()
	zs := func(opts ...zstd.EOption) []byte {
		var b bytes.Buffer
		w, err := zstd.NewWriter(&b, opts...)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
		w.Close()
		return b.Bytes()
	}
	half := len(data) / 2
	var zl bytes.Buffer
	w := zlib.NewWriter(&zl)
	w.Write(data)
	w.Close()
	return []struct {
		name  string
		codec Name
		src   []byte
	}{
		{"zstd", ZstdPart, zstdEncode(t, data, true)},
		{"zstd-nocrc", ZstdPart, zstdEncode(t, data, false)},
		{"zstd-streamed", ZstdPart, zs(zstd.WithWindowSize(1 << 16))},
		{"zstd-frames", ZstdPart, append(zstdEncode(t, data[:half], true), zstdEncode(t, data[half:], false)...)},
		{"zstd-wide-window", ZstdPart, zs(zstd.WithWindowSize(8 << 20))},
		{"gzip", GzipPart, gzipEncode(t, data)},
		{"gzip-members", GzipPart, append(gzipEncode(t, data[:half]), gzipEncode(t, data[half:])...)},
		{"zlib", ZlibPart, zl.Bytes()},
	}
}

// A stream decoded up to its selection gives the selection's bytes of the
// whole decode, for selections at the front, the back and in between.
func TestStreamPart(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1 << 10, 3<<20 + 17} {
		data := streamData(r, n)
		for _, e := range streamEncodings(t, data) {
			for k := range 12 {
				var segs []Segment
				for _, s := range apart(randomSegments(r, n)) {
					segs = append(segs, Segment{Off: int64(s[0]), Dst: make([]byte, s[1]-s[0])})
				}
				j := Job{Codec: e.codec, Src: e.src, Segments: segs, Size: int64(n)}
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
// mistake; damage past the selection is not reached.
func TestStreamPartDamage(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	n := 2 << 20
	data := streamData(r, n)
	for _, e := range streamEncodings(t, data) {
		seg := func(off, l int) []Segment { return []Segment{{Off: int64(off), Dst: make([]byte, l)}} }
		short := Job{Codec: e.codec, Src: e.src[:len(e.src)/3], Segments: seg(n-100, 100), Size: int64(n)}
		if err := DecodeJob(&short); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s cut to a third, selection at the end: %v, want ErrCorrupt", e.name, err)
		}
		bad := bytes.Clone(e.src)
		for i := 16; i < len(bad)/4; i += 7 {
			bad[i] ^= 0x5a
		}
		within := Job{Codec: e.codec, Src: bad, Segments: seg(n-100, 100), Size: int64(n)}
		if err := DecodeJob(&within); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s damaged before the selection's end: %v, want ErrCorrupt", e.name, err)
		}
		over := Job{Codec: e.codec, Src: e.src, Segments: append(seg(0, 100), seg(50, 100)...), Size: int64(n)}
		if err := DecodeJob(&over); err == nil || errors.Is(err, ErrCorrupt) {
			t.Errorf("%s with overlapping segments: %v, want a caller's error", e.name, err)
		}
	}
	// Damage in the last quarter of one zstd frame, a selection in the
	// first: decoded, and right.
	src := zstdEncode(t, data, true)
	bad := bytes.Clone(src)
	for i := len(bad) * 7 / 8; i < len(bad)-8; i += 5 {
		bad[i] ^= 0x5a
	}
	j := Job{Codec: ZstdPart, Src: bad, Segments: []Segment{{Off: 10, Dst: make([]byte, 1000)}}, Size: int64(n)}
	if err := DecodeJob(&j); err != nil || !bytes.Equal(j.Segments[0].Dst, data[10:1010]) {
		t.Errorf("zstd damaged past the selection: %v", err)
	}
	if err := Decode(Zstd, make([]byte, n), bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("the same chunk decoded whole: %v, want ErrCorrupt", err)
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
