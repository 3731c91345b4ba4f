package zarr

import (
	"math"
	"math/bits"
)

// IEEE 754 half precision, converted to and from the wider floats the way
// numpy does (npy_floatbits_to_halfbits, npy_doublebits_to_halfbits and
// their inverses): one correct rounding to nearest even straight from the
// wider bits, never through an intermediate type, and NaN payloads keep
// their top bits (a signalling NaN stays one). One pair of routines serves
// float32 and float64, given the wider format's mantissa width and bias.

// Float16Bits converts f to half precision bits, rounding to nearest even.
func Float16Bits(f float64) uint16 {
	d := math.Float64bits(f)
	return toHalf(uint16(d>>48)&0x8000, int(d>>52)&0x7ff, d&(1<<52-1), 52, 1023, 0x7ff)
}

// float32BitsToHalf converts float32 bits to half precision bits, rounding
// to nearest even.
func float32BitsToHalf(f uint32) uint16 {
	return toHalf(uint16(f>>16)&0x8000, int(f>>23)&0xff, uint64(f&0x7fffff), 23, 127, 0xff)
}

// Float16Value converts half precision bits to a float64, exactly (NaN
// payloads included).
func Float16Value(h uint16) float64 {
	exp, mant := fromHalf(h, 52, 1023, 0x7ff)
	return math.Float64frombits(uint64(h&0x8000)<<48 | exp<<52 | mant)
}

// halfToFloat32Bits converts half precision bits to float32 bits, exactly.
func halfToFloat32Bits(h uint16) uint32 {
	exp, mant := fromHalf(h, 23, 127, 0xff)
	return uint32(h&0x8000)<<16 | uint32(exp)<<23 | uint32(mant)
}

func halfToFloat32(h uint16) float32 { return math.Float32frombits(halfToFloat32Bits(h)) }

// toHalf rounds a wider float, given as its sign (already in the half's
// position), biased exponent and mantissa of mbits bits, to half bits.
// maxExp is the wider format's all-ones exponent (infinities and NaN).
func toHalf(sign uint16, exp int, mant uint64, mbits uint, bias, maxExp int) uint16 {
	switch {
	case exp == maxExp:
		if mant != 0 {
			r := 0x7c00 + uint16(mant>>(mbits-10))
			if r == 0x7c00 {
				r++ // keep it a NaN
			}
			return sign | r
		}
		return sign | 0x7c00
	case exp >= bias+16: // too large: infinity
		return sign | 0x7c00
	case exp >= bias-14:
		// A normal half. A carry out of the mantissa correctly bumps the
		// exponent, up to infinity.
		return sign + uint16(uint64(exp-bias+15)<<10+roundShift(mant, mbits-10))
	case exp >= bias-25: // a subnormal half
		return sign + uint16(roundShift(mant|1<<mbits, uint(bias+int(mbits)-24-exp)))
	}
	return sign // below half the smallest subnormal: zero
}

// fromHalf widens half bits h to the biased exponent and mbits-bit
// mantissa of a wider float with the given bias and all-ones exponent.
func fromHalf(h uint16, mbits uint, bias, maxExp uint64) (exp, mant uint64) {
	exp = uint64(h>>10) & 0x1f
	mant = uint64(h & 0x3ff)
	switch exp {
	case 0:
		if mant == 0 {
			return 0, 0
		}
		// A subnormal half is a normal wider float: bring its top bit to
		// the implicit position.
		shift := uint64(11 - bits.Len64(mant))
		return bias - 14 - shift, (mant << shift & 0x3ff) << (mbits - 10)
	case 0x1f:
		return maxExp, mant << (mbits - 10)
	}
	return exp + bias - 15, mant << (mbits - 10)
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
