package layout

// Coordinate lookup for views: the 1-D coordinate arrays that select by
// value and the sidecar's coordinate values.

import (
	"encoding/json"
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"

	"github.com/zarrfs/zarrfs/zarr"
)

// coordArray finds the 1-D coordinate array for dimension dim of a: an array
// named dim in a's group, else in the groups above it, whose length matches.
func (b *binder) coordArray(a *zarr.Array, ax int, dim string) (*zarr.Array, *zarr.Array) {
	var wrongLen *zarr.Array
	dir := path.Dir(a.Path)
	for {
		p := dim
		if dir != "." && dir != "/" && dir != "" {
			p = dir + "/" + dim
		}
		if c := b.h.Array(p); c != nil && c.Unsupported == "" && len(c.Shape) == 1 && c != a {
			if c.Shape[0] == a.Shape[ax] {
				return c, nil
			}
			if wrongLen == nil {
				wrongLen = c
			}
		}
		if dir == "." || dir == "/" || dir == "" {
			return nil, wrongLen
		}
		dir = path.Dir(dir)
	}
}

// coordBytes reads (once per binder) the whole of a coordinate array.
func (b *binder) coordBytes(c *zarr.Array) ([]byte, error) {
	if v, ok := b.coords[c.Path]; ok {
		return v, nil
	}
	size := int64(c.DType.Size)
	if c.Shape[0] > maxCoordBytes/size {
		return nil, fmt.Errorf("coordinate array %q: %d values of %d bytes, more than the %d bytes a view reads", c.Path, c.Shape[0], size, int64(maxCoordBytes))
	}
	buf := make([]byte, c.Shape[0]*size)
	err := b.reader().Read(b.ctx, nil, []zarr.Request{{Array: c, Start: []int64{0}, Count: []int64{c.Shape[0]}, Dst: buf}})
	if err != nil {
		return nil, fmt.Errorf("coordinate array %q: %w", c.Path, err)
	}
	b.coords[c.Path] = buf
	return buf, nil
}

// coordValuesAt returns the coordinate values at indices (nil entries when
// there is no coordinate array).
func (b *binder) coordValuesAt(a *zarr.Array, ax int, dim string, indices []int64) ([]any, error) {
	out := make([]any, len(indices))
	c, _ := b.coordArray(a, ax, dim)
	if c == nil {
		return out, nil
	}
	vals, err := b.coordBytes(c)
	if err != nil {
		return nil, err
	}
	sz := int64(c.DType.Size)
	for i, x := range indices {
		out[i] = jsonValue(vals[x*sz:(x+1)*sz], c.DType)
	}
	return out, nil
}

// lookupValues finds the index of each wanted coordinate value.
func (b *binder) lookupValues(s *ViewSpec, a *zarr.Array, ax int, d DimValues, field string) ([]int64, []any, error) {
	c, wrong := b.coordArray(a, ax, d.Dim)
	if c == nil {
		if wrong != nil {
			return nil, nil, s.errorf(field, "coordinate array %q has %d values but dimension %s of %s has %d", wrong.Path, wrong.Shape[0], d.Dim, a.Path, a.Shape[ax])
		}
		return nil, nil, s.errorf(field, "no 1-D coordinate array %q for dimension %s of %s: use select by index", d.Dim, d.Dim, a.Path)
	}
	vals, err := b.coordBytes(c)
	if err != nil {
		return nil, nil, err
	}
	sz := int64(c.DType.Size)
	n := c.Shape[0]
	var idx []int64
	var out []any
	for j, want := range d.Values {
		found := int64(-1)
		for i := int64(0); i < n; i++ {
			if coordEqual(vals[i*sz:(i+1)*sz], c.DType, want) {
				found = i
				break
			}
		}
		if found < 0 {
			var have []string
			for i := int64(0); i < n && i < 12; i++ {
				have = append(have, fmt.Sprint(jsonValue(vals[i*sz:(i+1)*sz], c.DType)))
			}
			if n > 12 {
				have = append(have, "...")
			}
			return nil, nil, s.errorf(fmt.Sprintf("%s[%d]", field, j), "value %s not found in coordinate array %q (%s)", want.Text, c.Path, strings.Join(have, ", "))
		}
		idx = append(idx, found)
		out = append(out, jsonValue(vals[found*sz:(found+1)*sz], c.DType))
	}
	return idx, out, nil
}

// coordEqual compares a stored coordinate with a value from the file after
// casting the value to the coordinate's type, so 0.1 finds float32(0.1).
func coordEqual(b []byte, dt zarr.DType, v CoordValue) bool {
	switch dt.Kind {
	case 'f':
		x := zarr.ReadFloat(b, dt)
		switch dt.Size {
		case 2:
			return zarr.Float16Value(zarr.Float16Bits(v.Float)) == x
		case 4:
			if v.IsInt {
				return float64(float32(v.Int)) == x
			}
			return float64(float32(v.Float)) == x
		}
		if v.IsInt {
			return float64(v.Int) == x
		}
		return v.Float == x
	case 'b':
		return (v.Float == 1 && b[0] != 0) || (v.Float == 0 && b[0] == 0)
	case 'u':
		x := zarr.ReadUint(b, dt.Size)
		if v.IsInt {
			return v.Int >= 0 && uint64(v.Int) == x
		}
		return v.Float == math.Trunc(v.Float) && v.Float == float64(x)
	}
	x := zarr.ReadInt(b, dt.Size)
	if v.IsInt {
		return v.Int == x
	}
	return v.Float == math.Trunc(v.Float) && v.Float == float64(x)
}

// jsonValue renders one little-endian value for a sidecar: integers exactly,
// floats in their shortest form for their precision, NaN and infinities as
// the strings Zarr uses for them.
func jsonValue(b []byte, dt zarr.DType) any {
	switch dt.Kind {
	case 'b':
		return b[0] != 0
	case 'u':
		return zarr.ReadUint(b, dt.Size)
	case 'i':
		return zarr.ReadInt(b, dt.Size)
	}
	f := zarr.ReadFloat(b, dt)
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	bitSize := 64
	if dt.Size < 8 {
		bitSize = 32
	}
	return json.Number(strconv.FormatFloat(f, 'g', -1, bitSize))
}
