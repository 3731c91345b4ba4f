// Package damage applies the damage that chunks come to on disk and in
// transit to good chunks: the host-check differential tests of package gpu
// (no GPU), its damaged-chunk test on a GPU, and the device path's damage
// suite (integration/gpu/damage, which damages a store's chunk files for
// integration/gpu/deliver_check.py) draw from the same kinds. Kinds that
// need a frame's structure (blocks, streams, header fields) read it from
// the good chunk; each kind returns nil where it does not apply.
package damage

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
)

// Kinds names every kind, in the order the tests report them.
var Kinds = []string{
	"flip-header",  // one bit of the LZ4 size header or the blosc header (16 bytes and block table)
	"flip-body",    // one bit anywhere after the header
	"flips",        // a bit in every 200 bytes or so, at random
	"trunc-block",  // cut at a block or stream boundary (blosc) or a sequence's start (LZ4)
	"trunc-inside", // cut inside a stream
	"trunc-tail",   // the last 1 to 8 bytes gone
	"swap-blocks",  // two entries of the blosc block table swapped, or two spans of an LZ4 block
	"size-nbytes",  // the decoded size (LZ4 header, blosc nbytes) off by a little
	"size-fields",  // blosc blocksize, cbytes or a stream's size prefix off by a little
	"zeros",        // zeroed from a third on
	"garbage",      // the last three quarters random
	"extend",       // bytes appended
}

// Apply returns kind applied to the good chunk src of codec c, drawing
// from r, or nil when the kind does not apply. src is not modified.
func Apply(kind string, c codec.Name, src []byte, r *rand.Rand) []byte {
	hdr := headerLen(c, src)
	out := bytes.Clone(src)
	flip := func(lo, hi int) []byte {
		if hi <= lo {
			return nil
		}
		i := lo + r.IntN(hi-lo)
		out[i] ^= 1 << r.IntN(8)
		return out
	}
	switch kind {
	case "flip-header":
		return flip(0, min(hdr, len(out)))
	case "flip-body":
		return flip(hdr, len(out))
	case "flips":
		for range 1 + len(out)/200 {
			out[r.IntN(len(out))] ^= 1 << r.IntN(8)
		}
		return out
	case "trunc-block":
		var cuts []int
		for _, at := range boundaries(c, src) {
			if at < len(src) {
				cuts = append(cuts, at)
			}
		}
		if len(cuts) == 0 {
			return nil
		}
		return out[:cuts[r.IntN(len(cuts))]]
	case "trunc-inside":
		lo, hi := streamSpan(c, src, r)
		if hi-lo < 2 {
			return nil
		}
		return out[:lo+1+r.IntN(hi-lo-1)]
	case "trunc-tail":
		return out[:max(0, len(out)-1-r.IntN(8))]
	case "swap-blocks":
		if c == codec.Blosc {
			nb := bloscBlocks(src)
			if nb < 2 {
				return nil
			}
			a, b := r.IntN(nb), r.IntN(nb-1)
			if b >= a {
				b++
			}
			ta, tb := out[16+4*a:16+4*a+4], out[16+4*b:16+4*b+4]
			var t [4]byte
			copy(t[:], ta)
			copy(ta, tb)
			copy(tb, t[:])
			return out
		}
		// Two spans of the same length, swapped.
		body := out[hdr:]
		if len(body) < 8 {
			return nil
		}
		n := 1 + r.IntN(len(body)/4)
		a, b := r.IntN(len(body)/2-n+1), len(body)/2+r.IntN(len(body)-len(body)/2-n+1)
		t := bytes.Clone(body[a : a+n])
		copy(body[a:a+n], body[b:b+n])
		copy(body[b:b+n], t)
		return out
	case "size-nbytes":
		at := map[codec.Name]int{codec.LZ4: 0, codec.Blosc: 4}
		o, ok := at[c]
		if !ok || len(out) < o+4 {
			return nil
		}
		nudge(out[o:], r)
		return out
	case "size-fields":
		if c != codec.Blosc || len(out) < 16 {
			return nil
		}
		switch r.IntN(3) {
		case 0: // blocksize
			nudge(out[8:], r)
		case 1: // cbytes
			nudge(out[12:], r)
		default: // one stream's size prefix
			f, err := codec.ParseBlosc(src)
			if err != nil || len(f.Streams) == 0 || f.Memcpyed {
				nudge(out[12:], r)
				break
			}
			s := f.Streams[r.IntN(len(f.Streams))]
			nudge(out[offsetIn(src, s.Src)-4:], r)
		}
		return out
	case "zeros":
		clear(out[len(out)/3:])
		return out
	case "garbage":
		for i := len(out) / 4; i < len(out); i++ {
			out[i] = byte(r.Uint32())
		}
		return out
	case "extend":
		for range 1 + r.IntN(16) {
			out = append(out, byte(r.Uint32()))
		}
		return out
	}
	panic("unknown damage kind " + kind)
}

// nudge adds a small signed amount to the little-endian uint32 at b.
func nudge(b []byte, r *rand.Rand) {
	d := []int32{-1, 1, -4, 4, 16, -256, 1 << 20}[r.IntN(7)]
	binary.LittleEndian.PutUint32(b, uint32(int32(binary.LittleEndian.Uint32(b))+d))
}

// headerLen is the length of a chunk's framing before its compressed data.
func headerLen(c codec.Name, src []byte) int {
	switch c {
	case codec.LZ4:
		return 4
	case codec.Blosc:
		if len(src) < 16 {
			return len(src)
		}
		if src[2]&0x02 != 0 { // memcpyed: no block table
			return 16
		}
		return min(len(src), 16+4*bloscBlocks(src))
	}
	return min(len(src), 16)
}

// bloscBlocks is the number of blocks a blosc frame's header gives.
func bloscBlocks(src []byte) int {
	if len(src) < 16 {
		return 0
	}
	nbytes := int(int32(binary.LittleEndian.Uint32(src[4:])))
	bs := int(int32(binary.LittleEndian.Uint32(src[8:])))
	if nbytes <= 0 || bs <= 0 {
		return 0
	}
	return min((nbytes+bs-1)/bs, (len(src)-16)/4)
}

// offsetIn is the offset of sub, a slice of src, in src.
func offsetIn(src, sub []byte) int {
	return int(uintptr(unsafe.Pointer(unsafe.SliceData(sub))) - uintptr(unsafe.Pointer(unsafe.SliceData(src))))
}

// boundaries lists where a chunk's structure allows a clean cut: the
// start of every blosc block and stream (and of every stream's data), or
// the start of every sequence of an LZ4 block.
func boundaries(c codec.Name, src []byte) []int {
	var cuts []int
	switch c {
	case codec.Blosc:
		f, err := codec.ParseBlosc(src)
		if err != nil {
			return nil
		}
		for _, s := range f.Streams {
			if len(s.Src) > 0 {
				o := offsetIn(src, s.Src)
				cuts = append(cuts, o-4, o, o+len(s.Src))
			}
		}
		cuts = append(cuts, headerLen(c, src))
	case codec.LZ4:
		cuts = lz4Sequences(src[4:], 4)
	}
	return cuts
}

// lz4Sequences returns the offsets (plus base) where the sequences of a
// valid LZ4 block start.
func lz4Sequences(b []byte, base int) []int {
	var at []int
	for si := 0; si < len(b); {
		at = append(at, base+si)
		tok := b[si]
		si++
		lit := int(tok >> 4)
		if lit == 15 {
			for si < len(b) {
				x := b[si]
				si++
				lit += int(x)
				if x != 255 {
					break
				}
			}
		}
		si += lit
		if si >= len(b) {
			break
		}
		si += 2
		if tok&15 == 15 {
			for si < len(b) && b[si] == 255 {
				si++
			}
			si++
		}
	}
	return at
}

// streamSpan picks one compressed stream of a chunk: [lo, hi) in src.
func streamSpan(c codec.Name, src []byte, r *rand.Rand) (lo, hi int) {
	if c == codec.Blosc {
		f, err := codec.ParseBlosc(src)
		if err == nil && len(f.Streams) > 0 {
			s := f.Streams[r.IntN(len(f.Streams))]
			o := offsetIn(src, s.Src)
			return o, o + len(s.Src)
		}
	}
	return headerLen(c, src), len(src)
}
