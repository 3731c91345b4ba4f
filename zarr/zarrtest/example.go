// Package zarrtest writes small Zarr v3 stores for demos, tests and
// benchmarks: an ERA5-like group of a few variables, written with zarrfs's
// own encoder (bytes + zstd), independent of any Python tooling.
package zarrtest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Example sizes the ERA5-like example store.
type Example struct {
	Times, Levels, Lat, Lon int
	// TimeChunk is the number of time steps per chunk of the 4-D and 3-D
	// variables (1 = one chunk per sample).
	TimeChunk int
}

// DefaultExample is small enough to write in a blink and large enough to
// look like a weather field.
var DefaultExample = Example{Times: 8, Levels: 3, Lat: 73, Lon: 144, TimeChunk: 2}

type array struct {
	name  string
	dtype string
	shape []int
	chunk []int
	dims  []string
	attrs map[string]any
	fill  any
	at    func(idx []int) float64
}

// Write creates the store at dir (which must not exist).
func (e Example) Write(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, "zarr.json"), map[string]any{
		"zarr_format": 3, "node_type": "group",
		"attributes": map[string]any{"title": "zarrfs example: ERA5-like reanalysis", "source": "zarrfs zarrtest"},
	}); err != nil {
		return err
	}
	lat := func(i int) float64 { return 90 - 180*float64(i)/float64(e.Lat-1) }
	lon := func(j int) float64 { return 360 * float64(j) / float64(e.Lon) }
	levels := []float64{500, 850, 1000, 250, 100, 50}
	field := func(t, l, i, j int, base, amp float64) float64 {
		phi, lam := lat(i)*math.Pi/180, lon(j)*math.Pi/180
		return base + amp*math.Cos(phi)*math.Sin(lam+0.3*float64(t)) + 0.1*amp*math.Sin(3*phi+float64(l))
	}
	tc := max(1, e.TimeChunk)
	arrays := []array{
		{name: "time", dtype: "int64", shape: []int{e.Times}, chunk: []int{e.Times}, dims: []string{"time"}, fill: 0,
			attrs: map[string]any{"units": "hours since 2020-01-01"}, at: func(x []int) float64 { return float64(6 * x[0]) }},
		{name: "level", dtype: "int32", shape: []int{e.Levels}, chunk: []int{e.Levels}, dims: []string{"level"}, fill: 0,
			attrs: map[string]any{"units": "hPa"}, at: func(x []int) float64 { return levels[x[0]%len(levels)] }},
		{name: "latitude", dtype: "float32", shape: []int{e.Lat}, chunk: []int{e.Lat}, dims: []string{"latitude"}, fill: 0.0,
			at: func(x []int) float64 { return lat(x[0]) }},
		{name: "longitude", dtype: "float32", shape: []int{e.Lon}, chunk: []int{e.Lon}, dims: []string{"longitude"}, fill: 0.0,
			at: func(x []int) float64 { return lon(x[0]) }},
		{name: "t", dtype: "float32", shape: []int{e.Times, e.Levels, e.Lat, e.Lon}, chunk: []int{tc, 1, e.Lat, e.Lon},
			dims: []string{"time", "level", "latitude", "longitude"}, fill: "NaN", attrs: map[string]any{"units": "K", "long_name": "temperature"},
			at: func(x []int) float64 { return field(x[0], x[1], x[2], x[3], 250, 30) }},
		{name: "z", dtype: "float32", shape: []int{e.Times, e.Levels, e.Lat, e.Lon}, chunk: []int{tc, 1, e.Lat, e.Lon},
			dims: []string{"time", "level", "latitude", "longitude"}, fill: "NaN", attrs: map[string]any{"units": "m**2 s**-2", "long_name": "geopotential"},
			at: func(x []int) float64 { return field(x[0], x[1], x[2], x[3], 50000, 2000) }},
		{name: "u10", dtype: "float32", shape: []int{e.Times, e.Lat, e.Lon}, chunk: []int{tc, e.Lat, e.Lon},
			dims: []string{"time", "latitude", "longitude"}, fill: "NaN", attrs: map[string]any{"units": "m s**-1", "long_name": "10 metre U wind component"},
			at: func(x []int) float64 { return field(x[0], 0, x[1], x[2], 0, 8) }},
		{name: "lsm", dtype: "uint8", shape: []int{e.Lat, e.Lon}, chunk: []int{e.Lat, e.Lon},
			dims: []string{"latitude", "longitude"}, fill: 0, attrs: map[string]any{"long_name": "land-sea mask"},
			at: func(x []int) float64 {
				if math.Sin(lat(x[0])/20)*math.Cos(lon(x[1])/30) > 0.2 {
					return 1
				}
				return 0
			}},
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return err
	}
	defer enc.Close()
	for _, a := range arrays {
		if err := writeArray(dir, a, enc); err != nil {
			return fmt.Errorf("%s: %w", a.name, err)
		}
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func itemsize(dtype string) int {
	switch dtype {
	case "uint8":
		return 1
	case "int32", "float32":
		return 4
	}
	return 8
}

func put(b []byte, dtype string, v float64) {
	switch dtype {
	case "uint8":
		b[0] = byte(v)
	case "int32":
		binary.LittleEndian.PutUint32(b, uint32(int32(v)))
	case "int64":
		binary.LittleEndian.PutUint64(b, uint64(int64(v)))
	case "float32":
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case "float64":
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
	}
}

func writeArray(dir string, a array, enc *zstd.Encoder) error {
	adir := filepath.Join(dir, a.name)
	if err := os.MkdirAll(adir, 0o755); err != nil {
		return err
	}
	md := map[string]any{
		"zarr_format": 3, "node_type": "array", "shape": a.shape, "data_type": a.dtype,
		"chunk_grid":         map[string]any{"name": "regular", "configuration": map[string]any{"chunk_shape": a.chunk}},
		"chunk_key_encoding": map[string]any{"name": "default", "configuration": map[string]any{"separator": "/"}},
		"codecs": []any{
			map[string]any{"name": "bytes", "configuration": map[string]any{"endian": "little"}},
			map[string]any{"name": "zstd", "configuration": map[string]any{"level": 3, "checksum": false}},
		},
		"fill_value": a.fill, "dimension_names": a.dims, "attributes": a.attrs,
	}
	if a.attrs == nil {
		md["attributes"] = map[string]any{}
	}
	if err := writeJSON(filepath.Join(adir, "zarr.json"), md); err != nil {
		return err
	}
	rank := len(a.shape)
	grid := make([]int, rank)
	for d := range rank {
		grid[d] = (a.shape[d] + a.chunk[d] - 1) / a.chunk[d]
	}
	size := itemsize(a.dtype)
	n := 1
	for _, c := range a.chunk {
		n *= c
	}
	buf := make([]byte, n*size)
	return eachIndex(grid, func(c []int) error {
		clear(buf)
		idx := make([]int, rank)
		err := eachIndex(a.chunk, func(off []int) error {
			lin := 0
			for d := range rank {
				idx[d] = c[d]*a.chunk[d] + off[d]
				if idx[d] >= a.shape[d] {
					return nil // edge chunk padding stays zero
				}
				lin = lin*a.chunk[d] + off[d]
			}
			put(buf[lin*size:], a.dtype, a.at(idx))
			return nil
		})
		if err != nil {
			return err
		}
		parts := []string{adir, "c"}
		for _, x := range c {
			parts = append(parts, fmt.Sprint(x))
		}
		p := filepath.Join(parts...)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, enc.EncodeAll(buf, nil), 0o644)
	})
}

func eachIndex(shape []int, f func([]int) error) error {
	idx := make([]int, len(shape))
	for _, s := range shape {
		if s == 0 {
			return nil
		}
	}
	for {
		if err := f(idx); err != nil {
			return err
		}
		d := len(idx) - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < shape[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return nil
		}
	}
}

// Name returns a short description for messages.
func (e Example) String() string {
	return strings.Join([]string{fmt.Sprintf("%d times", e.Times), fmt.Sprintf("%d levels", e.Levels), fmt.Sprintf("%dx%d grid", e.Lat, e.Lon)}, ", ")
}
