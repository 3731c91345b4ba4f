package layout

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unsafe"

	"github.com/zarrfs/zarrfs/zarr"
)

// Casting follows numpy's astype with the default unsafe casting rule, so a
// view's bytes equal numpy's np.stack(...).astype(dtype):
//   - integer and float conversions are C conversions (round to nearest even
//     for floats, two's-complement wrap for narrowing integers);
//   - float16 is produced by correctly rounded conversion from float32 or
//     float64 bits (numpy's npy_floatbits_to_halfbits and
//     npy_doublebits_to_halfbits), and integers go to float16 through
//     float32 as numpy does; NaN payloads keep their top bits;
//   - bool results are "value != 0", bool inputs read as 0 or 1.
// Float-to-integer casts are refused: numpy leaves NaN and out-of-range
// results undefined, so no bytes could be promised.

// outputDTypes lists the names accepted for a view's dtype, for messages.
const outputDTypes = "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, float64"

// ParseOutputDType parses a view's dtype: a Zarr/numpy name ("float32") or a
// little-endian numpy type string ("<f4", "f4").
func ParseOutputDType(s string) (zarr.DType, error) {
	if d, err := zarr.ParseV3DType(s); err == nil {
		return d, nil
	}
	t := s
	if len(t) == 2 {
		t = "<" + t
	}
	if len(t) == 3 && t[0] != '>' {
		if d, err := zarr.ParseNumpyDType(t); err == nil {
			return d, nil
		}
	}
	if strings.HasPrefix(s, ">") {
		return zarr.DType{}, fmt.Errorf("data type %q is big-endian; blobs are little-endian, use %q", s, "<"+s[1:])
	}
	return zarr.DType{}, fmt.Errorf("data type %q is not supported (use one of %s)", s, outputDTypes)
}

// canCast reports whether values of type from can be cast to type to.
func canCast(from, to zarr.DType) error {
	if from.Kind == 'f' && (to.Kind == 'i' || to.Kind == 'u') {
		return fmt.Errorf("casting %s to %s is not supported: float-to-integer results are undefined for NaN and out-of-range values", from.Name(), to.Name())
	}
	return nil
}

// sameType reports whether a value needs no conversion between from and to
// (byte order is always little-endian after zarr.Read).
func sameType(from, to zarr.DType) bool { return from.Kind == to.Kind && from.Size == to.Size }

type number interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~float32 | ~float64
}

// hostLE is true on little-endian machines, where slices of little-endian
// bytes can be used as typed slices directly.
var hostLE = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// as views b as a []T. Elements may be unaligned; the platforms Go supports
// for this program (amd64, arm64) load those fine.
func as[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// castInto converts the little-endian values of type from in src into
// little-endian values of type to in dst. len(dst)/to.Size must equal
// len(src)/from.Size. src may be modified (on big-endian hosts).
func castInto(dst []byte, to zarr.DType, src []byte, from zarr.DType) {
	if sameType(from, to) {
		copy(dst, src)
		return
	}
	if !hostLE {
		swapInPlace(src, from.Size)
		defer swapInPlace(dst, to.Size)
	}
	switch {
	case to.Kind == 'b':
		castTo(as[uint8](dst), src, from, true)
	case to.Kind == 'f' && to.Size == 2:
		castToHalf(as[uint16](dst), src, from)
	case to.Kind == 'f' && to.Size == 4:
		castTo(as[float32](dst), src, from, false)
	case to.Kind == 'f' && to.Size == 8:
		castTo(as[float64](dst), src, from, false)
	case to.Kind == 'i' && to.Size == 1:
		castTo(as[int8](dst), src, from, false)
	case to.Kind == 'i' && to.Size == 2:
		castTo(as[int16](dst), src, from, false)
	case to.Kind == 'i' && to.Size == 4:
		castTo(as[int32](dst), src, from, false)
	case to.Kind == 'i' && to.Size == 8:
		castTo(as[int64](dst), src, from, false)
	case to.Kind == 'u' && to.Size == 1:
		castTo(as[uint8](dst), src, from, false)
	case to.Kind == 'u' && to.Size == 2:
		castTo(as[uint16](dst), src, from, false)
	case to.Kind == 'u' && to.Size == 4:
		castTo(as[uint32](dst), src, from, false)
	case to.Kind == 'u' && to.Size == 8:
		castTo(as[uint64](dst), src, from, false)
	default:
		panic(fmt.Sprintf("layout: cast to %s", to.Name()))
	}
}

// castTo dispatches on the source type. toBool makes the result value != 0.
func castTo[D number](dst []D, src []byte, from zarr.DType, toBool bool) {
	switch {
	case from.Kind == 'b':
		for i, v := range as[uint8](src) {
			dst[i] = boolOf[D](v != 0)
		}
	case from.Kind == 'f' && from.Size == 2:
		halves := as[uint16](src)
		if isFloat64[D]() {
			// Straight from half bits, so NaN payloads survive as numpy
			// keeps them.
			d := any(dst).([]float64)
			for i, h := range halves {
				d[i] = halfToFloat64(h)
			}
			return
		}
		for i, h := range halves {
			f := halfToFloat32(h)
			if toBool {
				dst[i] = boolOf[D](f != 0)
			} else {
				dst[i] = D(f)
			}
		}
	case from.Kind == 'f' && from.Size == 4:
		conv(dst, as[float32](src), toBool)
	case from.Kind == 'f' && from.Size == 8:
		conv(dst, as[float64](src), toBool)
	case from.Kind == 'i' && from.Size == 1:
		conv(dst, as[int8](src), toBool)
	case from.Kind == 'i' && from.Size == 2:
		conv(dst, as[int16](src), toBool)
	case from.Kind == 'i' && from.Size == 4:
		conv(dst, as[int32](src), toBool)
	case from.Kind == 'i' && from.Size == 8:
		conv(dst, as[int64](src), toBool)
	case from.Kind == 'u' && from.Size == 1:
		conv(dst, as[uint8](src), toBool)
	case from.Kind == 'u' && from.Size == 2:
		conv(dst, as[uint16](src), toBool)
	case from.Kind == 'u' && from.Size == 4:
		conv(dst, as[uint32](src), toBool)
	case from.Kind == 'u' && from.Size == 8:
		conv(dst, as[uint64](src), toBool)
	default:
		panic(fmt.Sprintf("layout: cast from %s", from.Name()))
	}
}

func isFloat64[D number]() bool {
	var z D
	_, ok := any(z).(float64)
	return ok
}

func conv[D, S number](dst []D, src []S, toBool bool) {
	dst = dst[:len(src)]
	if toBool {
		for i, v := range src {
			dst[i] = boolOf[D](v != 0)
		}
		return
	}
	for i, v := range src {
		dst[i] = D(v)
	}
}

func boolOf[D number](b bool) D {
	if b {
		return 1
	}
	return 0
}

// castToHalf converts to float16 bits.
func castToHalf(dst []uint16, src []byte, from zarr.DType) {
	switch {
	case from.Kind == 'f' && from.Size == 2:
		copy(dst, as[uint16](src))
	case from.Kind == 'f' && from.Size == 4:
		for i, v := range as[uint32](src) {
			dst[i] = float32BitsToHalf(v)
		}
	case from.Kind == 'f' && from.Size == 8:
		for i, v := range as[uint64](src) {
			dst[i] = float64BitsToHalf(v)
		}
	default:
		// numpy converts other types to float32 first, then to half.
		tmp := make([]float32, min(len(dst), 1<<14))
		for off := 0; off < len(dst); off += len(tmp) {
			n := min(len(tmp), len(dst)-off)
			part := src[off*from.Size : (off+n)*from.Size]
			castTo(tmp[:n], part, from, false)
			for i, f := range tmp[:n] {
				dst[off+i] = float32BitsToHalf(math.Float32bits(f))
			}
		}
	}
}

// roundShift shifts m right by s bits, rounding to nearest, ties to even.
func roundShift(m uint64, s uint) uint64 {
	q := m >> s
	rem := m & (1<<s - 1)
	half := uint64(1) << (s - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return q
}

// float32BitsToHalf converts float32 bits to float16 bits, correctly rounded.
func float32BitsToHalf(f uint32) uint16 {
	sign := uint16(f>>16) & 0x8000
	exp := int(f>>23) & 0xff
	mant := uint64(f & 0x7fffff)
	switch {
	case exp == 0xff:
		if mant != 0 {
			r := 0x7c00 + uint16(mant>>13)
			if r == 0x7c00 {
				r++
			}
			return sign | r
		}
		return sign | 0x7c00
	case exp >= 127+16: // too large: infinity
		return sign | 0x7c00
	case exp >= 127-14: // normal half; rounding may carry into the exponent, even up to infinity
		return sign + uint16(uint64(exp-127+15)<<10+roundShift(mant, 13))
	case exp >= 127-25: // subnormal half
		m := mant | 1<<23
		return sign + uint16(roundShift(m, uint(126-exp)))
	}
	return sign // below half the smallest subnormal: zero
}

// float64BitsToHalf converts float64 bits to float16 bits, correctly
// rounded (zarr.Float16Bits).
func float64BitsToHalf(d uint64) uint16 { return zarr.Float16Bits(math.Float64frombits(d)) }

// halfToFloat32 converts float16 bits exactly.
func halfToFloat32(h uint16) float32 {
	b := halfToFloat32Bits(h)
	return math.Float32frombits(b)
}

func halfToFloat32Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		if mant == 0 {
			return sign
		}
		// Subnormal: normalise.
		shift := uint32(bits.LeadingZeros32(mant)) - 21 // bring the top bit to position 10
		mant = (mant << shift) & 0x3ff
		return sign | (113-shift)<<23 | mant<<13
	case 0x1f:
		return sign | 0x7f800000 | mant<<13
	}
	return sign | (exp+112)<<23 | mant<<13
}

func halfToFloat64(h uint16) float64 { return zarr.Float16Value(h) }

func swapInPlace(b []byte, size int) {
	switch size {
	case 2:
		s := as[uint16](b)
		for i, v := range s {
			s[i] = bits.ReverseBytes16(v)
		}
	case 4:
		s := as[uint32](b)
		for i, v := range s {
			s[i] = bits.ReverseBytes32(v)
		}
	case 8:
		s := as[uint64](b)
		for i, v := range s {
			s[i] = bits.ReverseBytes64(v)
		}
	}
}
