package codec

// blosclz is blosc's own LZ77 codec (FastLZ-derived). A stream is a sequence
// of tokens; the first is always a literal run. A control byte below 32 is a
// literal run of ctrl+1 bytes that follow it. Otherwise its top three bits
// give a match length (7 means: add following bytes while they are 255) and
// its low five bits the high byte of a distance whose low byte follows; the
// distance 31<<8+255 escapes to a 16-bit distance in the next two bytes (big
// endian) plus blosclzMaxDistance. Match lengths carry a +3 bias, distances
// a +1 bias.
//
// Decoding follows c-blosc's blosclz_decompress exactly, including its
// quirks, so that a stream decodes here if and only if it decodes there: a
// match that is the last token of the stream is checked but not copied, and
// every bound is checked before anything is written.

const blosclzMaxDistance = 8191

// blosclzDecode decodes src into dst and returns the number of bytes
// written, or -1 when the stream is malformed or does not fit in dst.
func blosclzDecode(dst, src []byte) int {
	if len(src) == 0 {
		return 0
	}
	ip, op := 0, 0
	ctrl := int(src[ip]) & 31
	ip++
	for {
		if ctrl >= 32 {
			length := ctrl>>5 - 1
			ofs := (ctrl & 31) << 8
			if length == 7-1 {
				for {
					if ip+1 >= len(src) {
						return -1
					}
					code := int(src[ip])
					ip++
					length += code
					if code != 255 {
						break
					}
				}
			} else if ip+1 >= len(src) {
				return -1
			}
			code := int(src[ip])
			ip++
			length += 3
			ref := op - ofs - code
			if code == 255 && ofs == 31<<8 {
				if ip+1 >= len(src) {
					return -1
				}
				ofs = int(src[ip])<<8 | int(src[ip+1])
				ip += 2
				ref = op - ofs - blosclzMaxDistance
			}
			if op+length > len(dst) || ref-1 < 0 {
				return -1
			}
			if ip >= len(src) {
				break // c-blosc drops a trailing match
			}
			ctrl = int(src[ip])
			ip++
			ref--
			lzCopy(dst, op, ref, length)
			op += length
		} else {
			ctrl++
			if op+ctrl > len(dst) || ip+ctrl > len(src) {
				return -1
			}
			copy(dst[op:op+ctrl], src[ip:ip+ctrl])
			op += ctrl
			ip += ctrl
			if ip >= len(src) {
				break
			}
			ctrl = int(src[ip])
			ip++
		}
	}
	return op
}

// lzCopy copies length bytes from dst[ref:] to dst[op:] front to back, so an
// overlapping source repeats its pattern, as LZ77 matches require. The caller
// has checked ref < op and op+length <= len(dst).
func lzCopy(dst []byte, op, ref, length int) {
	dist := op - ref
	if dist >= length {
		copy(dst[op:op+length], dst[ref:ref+length])
		return
	}
	if dist == 1 {
		b := dst[ref]
		s := dst[op : op+length]
		for i := range s {
			s[i] = b
		}
		return
	}
	// Copy the pattern, doubling the copied span each time: every copy's
	// source lies wholly before its destination.
	end := op + length
	for op < end {
		n := copy(dst[op:end], dst[ref:op])
		op += n
	}
}
