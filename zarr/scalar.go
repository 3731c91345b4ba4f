package zarr

import (
	"encoding/binary"
	"math"
	"math/bits"
)

func putUint(b []byte, dt DType, u uint64) {
	switch dt.Size {
	case 1:
		b[0] = byte(u)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(u))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(u))
	case 8:
		binary.LittleEndian.PutUint64(b, u)
	}
}

func putInt(b []byte, dt DType, i int64) { putUint(b, dt, uint64(i)) }

// putFloat stores f; a NaN is stored as the canonical quiet NaN numpy uses
// (Go's math.NaN has a different payload).
func putFloat(b []byte, dt DType, f float64) {
	if math.IsNaN(f) {
		switch dt.Size {
		case 2:
			binary.LittleEndian.PutUint16(b, 0x7e00)
		case 4:
			binary.LittleEndian.PutUint32(b, 0x7fc00000)
		case 8:
			binary.LittleEndian.PutUint64(b, 0x7ff8000000000000)
		}
		return
	}
	switch dt.Size {
	case 2:
		binary.LittleEndian.PutUint16(b, Float16Bits(f))
	case 4:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(f)))
	case 8:
		binary.LittleEndian.PutUint64(b, math.Float64bits(f))
	}
}

func getFloat(b []byte, dt DType) float64 {
	switch dt.Size {
	case 2:
		return Float16Value(binary.LittleEndian.Uint16(b))
	case 4:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b))
}

// Float16Bits converts f to IEEE 754 half precision, rounding the float64
// directly to nearest even as numpy does (no detour through float32, which
// would round twice). NaN payloads keep their top bits.
func Float16Bits(f float64) uint16 {
	d := math.Float64bits(f)
	sign := uint16(d>>48) & 0x8000
	exp := int(d>>52) & 0x7ff
	mant := d & (1<<52 - 1)
	switch {
	case exp == 0x7ff:
		if mant != 0 {
			r := 0x7c00 + uint16(mant>>42)
			if r == 0x7c00 {
				r++ // keep it a NaN
			}
			return sign | r
		}
		return sign | 0x7c00
	case exp >= 1023+16:
		return sign | 0x7c00
	case exp >= 1023-14:
		// A carry out of the mantissa correctly bumps the exponent.
		return sign + uint16(uint64(exp-1023+15)<<10+roundShift(mant, 42))
	case exp >= 1023-25:
		return sign + uint16(roundShift(mant|1<<52, uint(1051-exp)))
	}
	return sign
}

// roundShift returns m >> s rounded to nearest, ties to even.
func roundShift(m uint64, s uint) uint64 {
	q := m >> s
	rem := m & (1<<s - 1)
	half := uint64(1) << (s - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return q
}

// Float16Value converts IEEE 754 half precision bits to a float64, exactly
// (NaN payloads included).
func Float16Value(h uint16) float64 {
	sign := uint64(h&0x8000) << 48
	exp := uint64(h>>10) & 0x1f
	mant := uint64(h & 0x3ff)
	var b uint64
	switch exp {
	case 0:
		if mant == 0 {
			b = sign
			break
		}
		shift := uint64(bits.LeadingZeros64(mant)) - 53
		mant = (mant << shift) & 0x3ff
		b = sign | (1009-shift)<<52 | mant<<42
	case 0x1f:
		b = sign | 0x7ff0000000000000 | mant<<42
	default:
		b = sign | (exp+1008)<<52 | mant<<42
	}
	return math.Float64frombits(b)
}
