package zarr

import (
	"fmt"
	"math"
	"math/bits"
	"unsafe"
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

// CanCast reports whether values of type from can be cast to type to
// (Cast): nil, or why not.
func CanCast(from, to DType) error {
	if from.Kind == 'f' && (to.Kind == 'i' || to.Kind == 'u') {
		return fmt.Errorf("casting %s to %s is not supported: float-to-integer results are undefined for NaN and out-of-range values", from.Name(), to.Name())
	}
	return nil
}

// SameValues reports whether values of type from need no conversion to be
// values of type to (byte order is always little-endian after Read).
func SameValues(from, to DType) bool { return from.Kind == to.Kind && from.Size == to.Size }

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

// Cast converts the little-endian values of type from in src into
// little-endian values of type to in dst. len(dst)/to.Size must equal
// len(src)/from.Size. src may be modified (on big-endian hosts).
func Cast(dst []byte, to DType, src []byte, from DType) {
	if SameValues(from, to) {
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
		panic(fmt.Sprintf("zarr: cast to %s", to.Name()))
	}
}

// castTo dispatches on the source type. toBool makes the result value != 0.
func castTo[D number](dst []D, src []byte, from DType, toBool bool) {
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
				d[i] = Float16Value(h)
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
		panic(fmt.Sprintf("zarr: cast from %s", from.Name()))
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
func castToHalf(dst []uint16, src []byte, from DType) {
	switch {
	case from.Kind == 'f' && from.Size == 2:
		copy(dst, as[uint16](src))
	case from.Kind == 'f' && from.Size == 4:
		for i, v := range as[uint32](src) {
			dst[i] = float32BitsToHalf(v)
		}
	case from.Kind == 'f' && from.Size == 8:
		for i, v := range as[uint64](src) {
			dst[i] = Float16Bits(math.Float64frombits(v))
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
