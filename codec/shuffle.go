package codec

import (
	"encoding/binary"
	"unsafe"
)

// Unshuffle undoes blosc's byte shuffle of one block: src holds byte 0 of
// every element, then byte 1 of every element, and so on; dst receives the
// elements. Blosc shuffles each block on its own, so callers pass one block
// (BloscFrame.Block), not a whole frame. Trailing bytes that do not make a
// whole element are copied unchanged, as blosc leaves them. dst and src must
// have the same length and must not overlap; Unshuffle panics otherwise, like
// copy would on a programming error.
func Unshuffle(dst, src []byte, typesize int) { unshuffleTo(dst, src, typesize, false) }

// unshuffleTo is Unshuffle; with stream set, the SIMD loops store past the
// cache (non-temporal stores) where dst is 16-byte aligned, for a
// destination that will not be read again before it leaves the cache.
func unshuffleTo(dst, src []byte, typesize int, stream bool) {
	if len(dst) != len(src) {
		panic("codec: Unshuffle: dst and src lengths differ")
	}
	if typesize <= 1 || len(src) < typesize {
		copy(dst, src)
		return
	}
	n := len(src) / typesize // whole elements
	switch typesize {
	case 2:
		unshuffle2(dst, src, n, stream)
	case 4:
		unshuffle4(dst, src, n, stream)
	case 8:
		unshuffle8(dst, src, n, stream)
	default:
		for j := 0; j < typesize; j++ {
			row := src[j*n : j*n+n]
			for i, b := range row {
				dst[i*typesize+j] = b
			}
		}
	}
	rest := n * typesize
	copy(dst[rest:], src[rest:])
}

func unshuffle2(dst, src []byte, n int, stream bool) {
	s0, s1 := src[:n], src[n:2*n]
	d := dst[:2*n]
	i := 0
	if haveUnshuffleAsm && n >= 16 {
		if stream && alignedSIMD(d) {
			unshuffle2NT(&d[0], &src[0], n, n/16)
		} else {
			unshuffle2SSE2(&d[0], &src[0], n, n/16)
		}
		i = n / 16 * 16
	}
	for ; i+8 <= n; i += 8 {
		a := binary.LittleEndian.Uint64(s0[i:])
		b := binary.LittleEndian.Uint64(s1[i:])
		// Interleave the bytes of a (low) and b (high) into 16-bit lanes.
		binary.LittleEndian.PutUint64(d[2*i:], spread8(uint32(a))|spread8(uint32(b))<<8)
		binary.LittleEndian.PutUint64(d[2*i+8:], spread8(uint32(a>>32))|spread8(uint32(b>>32))<<8)
	}
	for ; i < n; i++ {
		d[2*i] = s0[i]
		d[2*i+1] = s1[i]
	}
}

// unshuffle4 is the hot path (float32 and int32 arrays): it gathers eight
// elements at a time from the four byte planes with 64-bit loads and
// interleaves them in registers, so each output word is written once.
func unshuffle4(dst, src []byte, n int, stream bool) {
	s0, s1, s2, s3 := src[:n], src[n:2*n], src[2*n:3*n], src[3*n:4*n]
	d := dst[:4*n]
	i := 0
	if haveUnshuffleAsm && n >= 16 {
		if stream && alignedSIMD(d) {
			unshuffle4NT(&d[0], &src[0], n, n/16)
		} else {
			unshuffle4SSE2(&d[0], &src[0], n, n/16)
		}
		i = n / 16 * 16
	}
	for ; i+8 <= n; i += 8 {
		a := binary.LittleEndian.Uint64(s0[i:])
		b := binary.LittleEndian.Uint64(s1[i:])
		c := binary.LittleEndian.Uint64(s2[i:])
		e := binary.LittleEndian.Uint64(s3[i:])
		// 16-bit lanes: (byte0, byte1) and (byte2, byte3) of elements 0-3 and 4-7.
		ab0 := spread8(uint32(a)) | spread8(uint32(b))<<8
		ab1 := spread8(uint32(a>>32)) | spread8(uint32(b>>32))<<8
		ce0 := spread8(uint32(c)) | spread8(uint32(e))<<8
		ce1 := spread8(uint32(c>>32)) | spread8(uint32(e>>32))<<8
		o := d[4*i : 4*i+32]
		binary.LittleEndian.PutUint64(o[0:], spread16(uint32(ab0))|spread16(uint32(ce0))<<16)
		binary.LittleEndian.PutUint64(o[8:], spread16(uint32(ab0>>32))|spread16(uint32(ce0>>32))<<16)
		binary.LittleEndian.PutUint64(o[16:], spread16(uint32(ab1))|spread16(uint32(ce1))<<16)
		binary.LittleEndian.PutUint64(o[24:], spread16(uint32(ab1>>32))|spread16(uint32(ce1>>32))<<16)
	}
	for ; i < n; i++ {
		o := d[4*i : 4*i+4]
		o[0], o[1], o[2], o[3] = s0[i], s1[i], s2[i], s3[i]
	}
}

func unshuffle8(dst, src []byte, n int, stream bool) {
	d := dst[:8*n]
	var s [8][]byte
	for j := range s {
		s[j] = src[j*n : j*n+n]
	}
	i := 0
	if haveUnshuffleAsm && n >= 8 {
		if stream && alignedSIMD(d) {
			unshuffle8NT(&d[0], &src[0], n, n/8)
		} else {
			unshuffle8SSE2(&d[0], &src[0], n, n/8)
		}
		i = n / 8 * 8
	}
	for ; i+4 <= n; i += 4 {
		var w [8]uint32
		for j := range w {
			w[j] = binary.LittleEndian.Uint32(s[j][i:])
		}
		// Lanes of two bytes, then of four, then whole elements.
		b01 := spread8(w[0]) | spread8(w[1])<<8
		b23 := spread8(w[2]) | spread8(w[3])<<8
		b45 := spread8(w[4]) | spread8(w[5])<<8
		b67 := spread8(w[6]) | spread8(w[7])<<8
		q0 := spread16(uint32(b01)) | spread16(uint32(b23))<<16 // bytes 0-3 of elements 0,1
		q1 := spread16(uint32(b01>>32)) | spread16(uint32(b23>>32))<<16
		r0 := spread16(uint32(b45)) | spread16(uint32(b67))<<16 // bytes 4-7 of elements 0,1
		r1 := spread16(uint32(b45>>32)) | spread16(uint32(b67>>32))<<16
		o := d[8*i : 8*i+32]
		binary.LittleEndian.PutUint64(o[0:], q0&0xffffffff|r0<<32)
		binary.LittleEndian.PutUint64(o[8:], q0>>32|r0&^0xffffffff)
		binary.LittleEndian.PutUint64(o[16:], q1&0xffffffff|r1<<32)
		binary.LittleEndian.PutUint64(o[24:], q1>>32|r1&^0xffffffff)
	}
	for ; i < n; i++ {
		for j := 0; j < 8; j++ {
			d[8*i+j] = s[j][i]
		}
	}
}

// spread8 moves byte k of v to byte 2k of the result.
func spread8(v uint32) uint64 {
	x := uint64(v)
	x = (x | x<<16) & 0x0000ffff0000ffff
	x = (x | x<<8) & 0x00ff00ff00ff00ff
	return x
}

// spread16 moves 16-bit lane k of v to lane 2k of the result.
func spread16(v uint32) uint64 {
	x := uint64(v)
	return (x | x<<16) & 0x0000ffff0000ffff
}

// alignedSIMD reports whether b starts on a 16-byte boundary, as the
// non-temporal stores need.
func alignedSIMD(b []byte) bool { return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%16 == 0 }
