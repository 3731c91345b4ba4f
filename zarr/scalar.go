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

// ReadFloat reads one little-endian float element of dt's size (2, 4 or
// 8 bytes, as Read produces it) from b.
func ReadFloat(b []byte, dt DType) float64 {
	switch dt.Size {
	case 2:
		return Float16Value(binary.LittleEndian.Uint16(b))
	case 4:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b))
}

// ReadUint reads one little-endian unsigned element of size bytes from b.
func ReadUint(b []byte, size int) uint64 {
	var u uint64
	for i := size - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	return u
}

// ReadInt reads one little-endian signed element of size bytes from b.
func ReadInt(b []byte, size int) int64 {
	shift := uint(64 - 8*size)
	return int64(ReadUint(b, size)<<shift) >> shift
}
