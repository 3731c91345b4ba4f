package layout

import (
	"fmt"
	"strings"

	"github.com/zarrfs/zarrfs/zarr"
)

// A view's output data type: any fixed-size numeric type, little-endian,
// that every channel's type casts to (zarr.CanCast).

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
