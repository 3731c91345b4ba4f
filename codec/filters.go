package codec

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// The filters of HDF5 files read through virtual references (kerchunk,
// VirtualiZarr, Icechunk): numcodecs' shuffle and fletcher32, as HDF5's
// H5Z_FILTER_SHUFFLE and H5Z_FILTER_FLETCHER32 write them. A filter that
// takes a parameter, or that wraps another codec, is named by a Name that
// carries it, so that a Job stays one codec name, one source and one
// destination of the exact decoded size:
//
//   - ShuffleOf(4) names the byte shuffle of 4-byte elements; it keeps the
//     size, so it is a stage of its own.
//   - Fletcher32Of(Zlib) names a zlib stream followed by the 4-byte
//     fletcher32 checksum of the stream: the checksum is HDF5's last
//     filter, and the size of the stream it covers is not known from the
//     metadata, so it is undone together with the codec inside it.
//     Fletcher32Of("") names raw bytes followed by their checksum.
//
// A GPU decoder does not know these names and refuses them
// (ErrUnsupported), so they are decoded on the CPU.

const (
	shufflePrefix    = "shuffle:"
	fletcher32Prefix = "fletcher32"
)

// ShuffleOf names the numcodecs/HDF5 byte shuffle of elements of
// elementsize bytes (1 or more).
func ShuffleOf(elementsize int) Name {
	return Name(shufflePrefix + strconv.Itoa(elementsize))
}

// Fletcher32Of names inner's encoded bytes followed by their HDF5
// fletcher32 checksum; inner "" means the bytes are the decoded ones.
func Fletcher32Of(inner Name) Name {
	if inner == "" {
		return fletcher32Prefix
	}
	return Name(fletcher32Prefix + "+" + string(inner))
}

// IsFilter reports whether name keeps the size of the data (a shuffle),
// so that it may follow a compression codec in one chain.
func IsFilter(name Name) bool { return strings.HasPrefix(string(name), shufflePrefix) }

// MaxShuffleElement bounds a shuffle's element size from metadata.
const MaxShuffleElement = 1 << 16

// decodeFiltered decodes the filter names of this file, or refuses name.
func (d *decoder) decodeFiltered(name Name, dst, src []byte) error {
	s := string(name)
	switch {
	case strings.HasPrefix(s, shufflePrefix):
		n, err := strconv.Atoi(s[len(shufflePrefix):])
		if err != nil || n < 1 || n > MaxShuffleElement {
			return fmt.Errorf("codec %q: bad element size: %w", name, ErrUnsupported)
		}
		if len(src) != len(dst) {
			return fmt.Errorf("shuffle: %d bytes, want %d: %w", len(src), len(dst), ErrCorrupt)
		}
		Unshuffle(dst, src, n)
		return nil
	case s == fletcher32Prefix || strings.HasPrefix(s, fletcher32Prefix+"+"):
		body, err := checkFletcher32(src)
		if err != nil {
			return err
		}
		inner := Name(strings.TrimPrefix(strings.TrimPrefix(s, fletcher32Prefix), "+"))
		if inner == "" {
			if len(body) != len(dst) {
				return fmt.Errorf("fletcher32: %d bytes before the checksum, want %d: %w", len(body), len(dst), ErrCorrupt)
			}
			copy(dst, body)
			return nil
		}
		if strings.HasPrefix(string(inner), fletcher32Prefix) {
			return fmt.Errorf("codec %q: %w", name, ErrUnsupported)
		}
		return d.decode(inner, dst, body)
	}
	return fmt.Errorf("codec %q: %w", name, ErrUnsupported)
}

// checkFletcher32 verifies the checksum HDF5's fletcher32 filter appends
// (little-endian) and returns the bytes it covers. HDF5 before 1.6.3 wrote
// the checksum byte-swapped on little-endian machines, and HDF5 itself
// still accepts that form; so does this.
func checkFletcher32(src []byte) ([]byte, error) {
	if len(src) < 4 {
		return nil, fmt.Errorf("fletcher32: %d bytes cannot hold a checksum: %w", len(src), ErrCorrupt)
	}
	body := src[:len(src)-4]
	stored := binary.LittleEndian.Uint32(src[len(src)-4:])
	sum := Fletcher32(body)
	if stored != sum && stored != reversedFletcher32(sum) {
		return nil, fmt.Errorf("fletcher32: checksum %08x, stored %08x: %w", sum, stored, ErrCorrupt)
	}
	return body, nil
}

// Fletcher32 is HDF5's fletcher32 checksum (H5_checksum_fletcher32): sums
// of big-endian 16-bit words, an odd last byte as the high byte of one.
func Fletcher32(b []byte) uint32 {
	var sum1, sum2 uint32
	words := len(b) / 2
	for words > 0 {
		// 360 words keep the sums below 2^32 before folding.
		n := min(words, 360)
		words -= n
		for i := 0; i < n; i++ {
			sum1 += uint32(b[0])<<8 | uint32(b[1])
			sum2 += sum1
			b = b[2:]
		}
		sum1 = sum1&0xffff + sum1>>16
		sum2 = sum2&0xffff + sum2>>16
	}
	if len(b) == 1 {
		sum1 += uint32(b[0]) << 8
		sum2 += sum1
		sum1 = sum1&0xffff + sum1>>16
		sum2 = sum2&0xffff + sum2>>16
	}
	sum1 = sum1&0xffff + sum1>>16
	sum2 = sum2&0xffff + sum2>>16
	return sum2<<16 | sum1
}

// reversedFletcher32 is the checksum as HDF5 before 1.6.3 stored it.
func reversedFletcher32(s uint32) uint32 {
	return (s&0xff)<<8 | (s&0xff00)>>8 | (s&0xff0000)<<8 | (s&0xff000000)>>8
}
