package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// Fuzz targets, seeded from the numcodecs vectors. Crashers found are kept
// under testdata/fuzz/<Target>/ in go's corpus format (readable text).

var fuzzCodecs = []Name{Zstd, Gzip, Zlib, LZ4, Blosc}

func codecIndex(n Name) uint8 {
	for i, c := range fuzzCodecs {
		if c == n {
			return uint8(i)
		}
	}
	return 0
}

// checkDecode decodes src into a dst of n bytes followed by guard bytes and
// fails the test if Decode wrote past dst or returned an error that is
// neither ErrCorrupt nor ErrUnsupported.
func checkDecode(t *testing.T, name Name, src []byte, n int) {
	buf := make([]byte, n+16)
	for i := range buf {
		buf[i] = 0x5a
	}
	err := Decode(name, buf[:n], src)
	if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupported) {
		t.Fatalf("%s: error wraps neither ErrCorrupt nor ErrUnsupported: %v", name, err)
	}
	for i, c := range buf[n:] {
		if c != 0x5a {
			t.Fatalf("%s: wrote past dst at +%d", name, i)
		}
	}
}

// FuzzDecode decodes arbitrary input with every codec into a dst of a
// fuzzed size (bounded: the size is the decoder's to check, not the fuzzer's
// to allocate).
func FuzzDecode(f *testing.F) {
	for _, v := range loadVectors(f) {
		if len(v.raw) <= 1<<16 {
			f.Add(codecIndex(v.Codec), uint32(len(v.raw)), v.src)
		}
	}
	f.Fuzz(func(t *testing.T, codec uint8, size uint32, src []byte) {
		name := fuzzCodecs[int(codec)%len(fuzzCodecs)]
		checkDecode(t, name, src, int(size%(1<<20)))
	})
}

// FuzzBloscParse checks that ParseBlosc never panics, that what it calls
// corrupt Decode rejects too (the GPU path relies on it), and that what it
// accepts is self-consistent: streams inside the frame, covering the
// decoded buffer exactly once, in order.
func FuzzBloscParse(f *testing.F) {
	for _, v := range loadVectors(f) {
		if v.Codec == Blosc {
			f.Add(v.src)
		}
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		fr, err := ParseBlosc(src)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error wraps neither sentinel: %v", err)
			}
			if n := int(int32(binary.LittleEndian.Uint32(src[4:]))); errors.Is(err, ErrCorrupt) && len(src) >= 16 && n >= 0 && n <= 1<<20 {
				if derr := Decode(Blosc, make([]byte, n), src); derr == nil {
					t.Fatalf("ParseBlosc: %v; Decode accepts the frame", err)
				}
			}
			return
		}
		off := 0
		for i, s := range fr.Streams {
			if s.DstOff != off || s.DstLen <= 0 {
				t.Fatalf("stream %d at %d+%d, want offset %d", i, s.DstOff, s.DstLen, off)
			}
			if s.Raw && len(s.Src) != s.DstLen {
				t.Fatalf("raw stream %d: %d bytes for %d", i, len(s.Src), s.DstLen)
			}
			if len(s.Src) > 0 && !inside(src, s.Src) {
				t.Fatalf("stream %d is not a slice of the frame", i)
			}
			off += s.DstLen
		}
		if off != fr.NBytes {
			t.Fatalf("streams cover %d bytes of %d", off, fr.NBytes)
		}
		if fr.NBytes <= 1<<20 {
			checkDecode(t, Blosc, src, fr.NBytes)
		}
	})
}

// FuzzDecodeBlosc mutates a blosc frame's body but keeps its header
// plausible, which reaches the inner codecs and the unshuffles far more often
// than random headers do, and checks Decode against the ParseBlosc route.
func FuzzDecodeBlosc(f *testing.F) {
	for _, v := range loadVectors(f) {
		if v.Codec == Blosc {
			f.Add(v.src)
		}
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) >= 16 {
			// Keep cbytes consistent with the input so the body is used.
			binary.LittleEndian.PutUint32(src[12:], uint32(len(src)))
		}
		fr, perr := ParseBlosc(src)
		if perr != nil || fr.NBytes > 1<<20 {
			return
		}
		dst := make([]byte, fr.NBytes)
		err := Decode(Blosc, dst, src)
		// The GPU route: every stream on its own, then unshuffle.
		d := newDecoder()
		shuffled := make([]byte, fr.NBytes)
		var err2 error
		for _, s := range fr.Streams {
			out := shuffled[s.DstOff : s.DstOff+s.DstLen]
			if s.Raw {
				copy(out, s.Src)
				continue
			}
			comp := map[string]int{"blosclz": bloscBlosclz, "lz4": bloscLZ4, "zlib": bloscZlib, "zstd": bloscZstd, "snappy": bloscSnappy}[fr.Compressor]
			if err2 = d.decodeBloscStream(comp, out, s.Src); err2 != nil {
				break
			}
		}
		if (err == nil) != (err2 == nil) {
			t.Fatalf("Decode: %v; stream by stream: %v", err, err2)
		}
		if err != nil {
			return
		}
		got := make([]byte, fr.NBytes)
		if err := fr.Unshuffle(got, shuffled); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, dst) {
			t.Fatalf("Decode and ParseBlosc route differ at %d", firstDiff(got, dst))
		}
	})
}

func inside(outer, inner []byte) bool {
	if len(outer) == 0 || len(inner) == 0 {
		return false
	}
	for i := range outer {
		if &outer[i] == &inner[0] {
			return i+len(inner) <= len(outer)
		}
	}
	return false
}

// FuzzBloscPartial holds partial decoding to whole decoding: whatever a
// frame holds, a selection decoded from its index and the ranges that
// index names is either refused or equal to the same bytes of Decode's
// output; never different bytes.
func FuzzBloscPartial(f *testing.F) {
	for _, v := range loadVectors(f) {
		if v.Codec == Blosc {
			f.Add(v.src, uint16(3), uint16(700))
		}
	}
	f.Fuzz(func(t *testing.T, src []byte, lo, n uint16) {
		if len(src) < 16 {
			return
		}
		binary.LittleEndian.PutUint32(src[12:], uint32(len(src)))
		nbytes := int(int32(binary.LittleEndian.Uint32(src[4:])))
		if nbytes <= 0 || nbytes > 1<<20 {
			return
		}
		whole := make([]byte, nbytes)
		werr := Decode(Blosc, whole, src)
		off := int(lo) % nbytes
		seg := Segment{int64(off), make([]byte, min(int(n)+1, nbytes-off))}
		x, need, err := ParseBloscIndex(src[:min(len(src), 16)], nbytes)
		if err == nil && x == nil && need <= len(src) {
			x, _, err = ParseBloscIndex(src[:need], nbytes)
		}
		if err != nil || x == nil {
			return
		}
		parts := []Part{{0, src[:max(need, 16)]}}
		for _, r := range x.Ranges([]Segment{seg}, 0) {
			if r.Off+r.N > int64(len(src)) {
				t.Fatalf("range %d+%d past a %d-byte frame", r.Off, r.N, len(src))
			}
			parts = append(parts, Part{r.Off, src[r.Off : r.Off+r.N]})
		}
		j := Job{Codec: BloscPart, Parts: parts, Segments: []Segment{seg}, Size: int64(nbytes)}
		if err := DecodeJob(&j); err != nil || werr != nil {
			return
		}
		if want := whole[off : off+len(seg.Dst)]; !bytes.Equal(seg.Dst, want) {
			t.Fatalf("partial and whole decoding differ at %d", off+firstDiff(seg.Dst, want))
		}
	})
}
