package zarr

import (
	"encoding/binary"
	"math"
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

func getUint(b []byte, dt DType) uint64 {
	switch dt.Size {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

func getInt(b []byte, dt DType) int64 {
	switch dt.Size {
	case 1:
		return int64(int8(b[0]))
	case 2:
		return int64(int16(binary.LittleEndian.Uint16(b)))
	case 4:
		return int64(int32(binary.LittleEndian.Uint32(b)))
	}
	return int64(binary.LittleEndian.Uint64(b))
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

// Float16Bits converts f to IEEE 754 half precision, rounding to nearest even
// as numpy does.
func Float16Bits(f float64) uint16 {
	b := math.Float32bits(float32(f))
	sign := uint16(b>>16) & 0x8000
	exp := int((b >> 23) & 0xff)
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	case exp-127 > 15:
		return sign | 0x7c00
	case exp-127 >= -14: // normal
		e := uint32(exp-127+15) << 10
		m := mant >> 13
		rest := mant & 0x1fff
		v := e | m
		if rest > 0x1000 || (rest == 0x1000 && m&1 == 1) {
			v++ // may carry into the exponent, which is correct
		}
		return sign | uint16(v)
	case exp-127 >= -25: // subnormal
		mant |= 0x800000
		shift := uint32(-14-(exp-127)) + 13
		m := mant >> shift
		rest := mant & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || (rest == half && m&1 == 1) {
			m++
		}
		return sign | uint16(m)
	}
	return sign
}

// Float16Value converts IEEE 754 half precision bits to a float64.
func Float16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * mant * math.Pow(2, -24)
	case 0x1f:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * (1 + mant/1024) * math.Pow(2, float64(exp-15))
}
