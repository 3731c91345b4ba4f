package zarr

import (
	"fmt"
	"strings"

	"github.com/zarrfs/zarrfs/codec"
)

// DType is a fixed-size numeric data type.
type DType struct {
	// Kind is 'b' (bool), 'i' (signed), 'u' (unsigned) or 'f' (float).
	Kind byte
	// Size in bytes: 1, 2, 4 or 8.
	Size int
	// BigEndian is the source's byte order (meaningless for Size 1): a v2
	// dtype's, a v3 bytes codec's (set by the array's metadata).
	BigEndian bool
}

// NumpyLE returns the numpy type string of the little-endian form Read
// produces: "<f4", "|u1", "|b1".
func (d DType) NumpyLE() string {
	if d.Size == 1 {
		return fmt.Sprintf("|%c1", d.Kind)
	}
	return fmt.Sprintf("<%c%d", d.Kind, d.Size)
}

// NumpySource returns the numpy type string of the source's type, byte
// order included: ">f8".
func (d DType) NumpySource() string {
	if d.Size == 1 {
		return d.NumpyLE()
	}
	if d.BigEndian {
		return fmt.Sprintf(">%c%d", d.Kind, d.Size)
	}
	return d.NumpyLE()
}

// Name returns the Zarr v3 / numpy name: "float32", "uint8", "bool".
func (d DType) Name() string {
	switch d.Kind {
	case 'b':
		return "bool"
	case 'i':
		return fmt.Sprintf("int%d", d.Size*8)
	case 'u':
		return fmt.Sprintf("uint%d", d.Size*8)
	case 'f':
		return fmt.Sprintf("float%d", d.Size*8)
	}
	return "unknown"
}

// ParseNumpyDType parses a v2 dtype string such as "<f4", ">i8", "|b1", "|u1".
func ParseNumpyDType(s string) (DType, error) {
	if len(s) < 3 {
		return DType{}, fmt.Errorf("%w: data type %q", codec.ErrUnsupported, s)
	}
	order, kind, size := s[0], s[1], s[2:]
	var d DType
	switch kind {
	case 'b', 'i', 'u', 'f':
		d.Kind = kind
	default:
		return DType{}, fmt.Errorf("%w: data type %q", codec.ErrUnsupported, s)
	}
	switch size {
	case "1":
		d.Size = 1
	case "2":
		d.Size = 2
	case "4":
		d.Size = 4
	case "8":
		d.Size = 8
	default:
		return DType{}, fmt.Errorf("%w: data type %q", codec.ErrUnsupported, s)
	}
	if (kind == 'b' && d.Size != 1) || (kind == 'f' && d.Size == 1) {
		return DType{}, fmt.Errorf("%w: data type %q", codec.ErrUnsupported, s)
	}
	switch order {
	case '<', '|', '=':
	case '>':
		d.BigEndian = d.Size > 1
	default:
		return DType{}, fmt.Errorf("%w: data type %q", codec.ErrUnsupported, s)
	}
	return d, nil
}

// ParseV3DType parses a v3 data_type name such as "float32" or "bool".
// Byte order comes from the bytes codec, not from here.
func ParseV3DType(s string) (DType, error) {
	switch s {
	case "bool":
		return DType{Kind: 'b', Size: 1}, nil
	case "int8", "int16", "int32", "int64":
		return DType{Kind: 'i', Size: bitWidth(s[3:]) / 8}, nil
	case "uint8", "uint16", "uint32", "uint64":
		return DType{Kind: 'u', Size: bitWidth(s[4:]) / 8}, nil
	case "float16", "float32", "float64":
		return DType{Kind: 'f', Size: bitWidth(s[5:]) / 8}, nil
	}
	return DType{}, fmt.Errorf("%w: data type %q", codec.ErrUnsupported, strings.TrimSpace(s))
}

func bitWidth(s string) int {
	switch s {
	case "8":
		return 8
	case "16":
		return 16
	case "32":
		return 32
	}
	return 64
}
