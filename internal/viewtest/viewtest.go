// Package viewtest holds the fixtures the tests of layout and fill share:
// the hierarchies their layouts and views are built from, the value every
// element of them holds, a Zarr v3 store written from such values, and a
// rewrite of a chunk file.
package viewtest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// The element types of the test hierarchies.
var (
	F32 = zarr.DType{Kind: 'f', Size: 4}
	F64 = zarr.DType{Kind: 'f', Size: 8, BigEndian: true}
	I64 = zarr.DType{Kind: 'i', Size: 8}
	U8  = zarr.DType{Kind: 'u', Size: 1}
	I16 = zarr.DType{Kind: 'i', Size: 2}
)

// FakeStore is a store that has nothing, known by its ID.
type FakeStore struct{ Name string }

func (s FakeStore) Get(context.Context, string) ([]byte, error) { return nil, errors.New("no") }

func (s FakeStore) GetRange(context.Context, string, int64, int64) ([]byte, error) {
	return nil, errors.New("no")
}

func (s FakeStore) List(context.Context, string) ([]string, error) { return nil, nil }

func (s FakeStore) ID() string { return s.Name }
func (FakeStore) Close() error { return nil }

// Hierarchy is a store of ERA5-like arrays of every shape a layout meets.
func Hierarchy() *zarr.Hierarchy {
	return &zarr.Hierarchy{
		Store:  FakeStore{"file:///data/era5.zarr"},
		Groups: map[string]map[string]any{"": {}, "sub": {}, "empty": {}},
		Arrays: []*zarr.Array{
			{Path: "bad", Shape: []int64{4}, Chunks: []int64{4}, DType: F32, Dims: []string{"x"}, MetaHash: "b", Unsupported: "codec 'bitround' is not supported"},
			{Path: "lsm", Shape: []int64{16, 24}, Chunks: []int64{16, 24}, DType: U8, Dims: []string{"latitude", "longitude"}, MetaHash: "l", FillValue: int64(0)},
			{Path: "scalar", Shape: []int64{}, Chunks: []int64{}, DType: F64, MetaHash: "s", FillValue: "NaN"},
			{Path: "sub/sp", Shape: []int64{30, 16, 24}, Chunks: []int64{10, 16, 24}, DType: I16, Dims: []string{"time", "latitude", "longitude"}, MetaHash: "sp", FillValue: int64(-32768)},
			{Path: "t", Shape: []int64{12, 3, 16, 24}, Chunks: []int64{5, 3, 8, 8}, DType: F32, Dims: []string{"time", "level", "latitude", "longitude"}, MetaHash: "t", FillValue: "NaN",
				Attributes: map[string]any{"units": "K"}, Codecs: []string{"bytes", "zstd"}, ZarrFormat: 3},
			{Path: "time", Shape: []int64{12}, Chunks: []int64{12}, DType: I64, Dims: []string{"time"}, MetaHash: "ti"},
			{Path: "one", Shape: []int64{5, 1}, Chunks: []int64{5, 1}, DType: F32, Dims: []string{"", "time"}, MetaHash: "o"},
		},
	}
}

// ViewHierarchy is a store of the arrays the tests' views select from.
func ViewHierarchy() *zarr.Hierarchy {
	f16 := zarr.DType{Kind: 'f', Size: 2}
	f64 := zarr.DType{Kind: 'f', Size: 8}
	arr := func(p string, dt zarr.DType, dims []string, shape ...int64) *zarr.Array {
		return &zarr.Array{Path: p, Shape: shape, Chunks: shape, DType: dt, Dims: dims, MetaHash: "m-" + p, Attributes: map[string]any{}}
	}
	spatial := []string{"latitude", "longitude"}
	h := &zarr.Hierarchy{
		Store:  FakeStore{"file:///data/era5.zarr"},
		Groups: map[string]map[string]any{"": {}, "sub": {}},
		Arrays: []*zarr.Array{
			{Path: "bad", Shape: []int64{12, 4, 5}, Chunks: []int64{1, 4, 5}, DType: F32, Dims: []string{"time", "latitude", "longitude"}, Unsupported: "codec 'bitround' is not supported"},
			arr("ens", F32, []string{"time", "member", "level", "latitude", "longitude"}, 12, 2, 3, 4, 5),
			arr("half", f16, append([]string{"time"}, spatial...), 12, 4, 5),
			arr("latitude", F32, []string{"latitude"}, 4),
			arr("level", F32, []string{"level"}, 3),
			arr("lsm", U8, spatial, 4, 5),
			arr("q", F32, append([]string{"time"}, spatial...), 10, 4, 5),
			arr("renamed", F32, []string{"time", "y", "x"}, 12, 4, 5),
			arr("sub/sp", F32, append([]string{"time"}, spatial...), 12, 4, 5),
			arr("t", F32, []string{"time", "level", "latitude", "longitude"}, 12, 3, 4, 5),
			arr("time", I64, []string{"time"}, 12),
			arr("u10", I16, append([]string{"time"}, spatial...), 12, 4, 5),
			arr("w", F32, []string{"time", "level", "latitude", "longitude"}, 12, 2, 4, 5),
			arr("wide", F32, append([]string{"time"}, spatial...), 12, 5, 4),
			arr("z", f64, []string{"time", "level", "latitude", "longitude"}, 12, 3, 4, 5),
		},
	}
	h.Arrays[len(h.Arrays)-1].DType.BigEndian = true // Read converts; the view must not care
	return h
}

// Value is the value of an element: distinct per array and index,
// exact in float32 for the small test arrays.
func Value(a *zarr.Array, idx []int64) float64 {
	switch a.Path {
	case "level":
		return []float64{1000, 850, 500}[idx[0]]
	case "time":
		return float64(6 * idx[0])
	case "lsm":
		return float64((idx[0] + idx[1]) % 2)
	}
	lin := int64(0)
	for d := range idx {
		lin = lin*a.Shape[d] + idx[d]
	}
	base := map[string]float64{"z": 10000, "u10": -200, "ens": 30000}[a.Path]
	return base + float64(lin)
}

// Encode writes v into b in type d, little-endian.
func Encode(b []byte, d zarr.DType, v float64) {
	switch {
	case d.Kind == 'f' && d.Size == 2:
		binary.LittleEndian.PutUint16(b, zarr.Float16Bits(v))
	case d.Kind == 'f' && d.Size == 4:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case d.Kind == 'f':
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
	default:
		u := uint64(int64(v))
		for k := range d.Size {
			b[k] = byte(u >> (8 * k))
		}
	}
}

// ForEachIndex visits every index of the region in C order.
func ForEachIndex(start, count []int64, f func([]int64)) {
	for _, c := range count {
		if c == 0 {
			return
		}
	}
	idx := append([]int64(nil), start...)
	for {
		f(idx)
		d := len(idx) - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < start[d]+count[d] {
				break
			}
			idx[d] = start[d]
		}
		if d < 0 {
			return
		}
	}
}

// RewriteChunk gives the chunk file at rel (below dir) the bytes of the
// one at from: a new file, dated an hour ahead, so a new version.
func RewriteChunk(t testing.TB, dir, rel, from string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, from))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, rel)
	os.Remove(p)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(p, later, later)
}

// StoreArray is one array of a store written by WriteStore: its path,
// Zarr v3 data type, shape, chunk shape, dimension names and the value of
// each element.
type StoreArray struct {
	Path   string
	DType  string
	Shape  []int64
	Chunks []int64
	Dims   []string
	Value  func(idx []int64) float64
}

// WriteStore writes a Zarr v3 group with zstd-compressed chunks.
func WriteStore(t testing.TB, dir string, arrays []StoreArray) {
	t.Helper()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	writeJSON := func(p string, v any) {
		b, _ := json.Marshal(v)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeJSON(filepath.Join(dir, "zarr.json"), map[string]any{"zarr_format": 3, "node_type": "group", "attributes": map[string]any{}})
	for _, a := range arrays {
		dt, err := zarr.ParseV3DType(a.DType)
		if err != nil {
			t.Fatal(err)
		}
		writeJSON(filepath.Join(dir, a.Path, "zarr.json"), map[string]any{
			"zarr_format": 3, "node_type": "array", "shape": a.Shape, "data_type": a.DType,
			"chunk_grid":         map[string]any{"name": "regular", "configuration": map[string]any{"chunk_shape": a.Chunks}},
			"chunk_key_encoding": map[string]any{"name": "default", "configuration": map[string]any{"separator": "/"}},
			"codecs": []any{map[string]any{"name": "bytes", "configuration": map[string]any{"endian": "little"}},
				map[string]any{"name": "zstd", "configuration": map[string]any{"level": 1, "checksum": false}}},
			"fill_value": 0, "dimension_names": a.Dims, "attributes": map[string]any{},
		})
		grid := make([]int64, len(a.Shape))
		for d := range grid {
			grid[d] = (a.Shape[d] + a.Chunks[d] - 1) / a.Chunks[d]
		}
		ForEachIndex(make([]int64, len(grid)), grid, func(c []int64) {
			buf := make([]byte, prod(a.Chunks)*int64(dt.Size))
			start := make([]int64, len(c))
			for d := range c {
				start[d] = c[d] * a.Chunks[d]
			}
			i := int64(0)
			ForEachIndex(start, a.Chunks, func(idx []int64) {
				inside := true
				for d := range idx {
					inside = inside && idx[d] < a.Shape[d]
				}
				if inside {
					Encode(buf[i*int64(dt.Size):], dt, a.Value(idx))
				}
				i++
			})
			key := filepath.Join(dir, a.Path, "c")
			for _, x := range c {
				key = filepath.Join(key, fmt.Sprint(x))
			}
			writeJSON(key, nil) // makes the directories
			if err := os.WriteFile(key, enc.EncodeAll(buf, nil), 0o644); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// OpenStore opens the store at dir.
func OpenStore(t testing.TB, dir string, o zarr.Options) *zarr.Hierarchy {
	t.Helper()
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	h, err := zarr.Open(context.Background(), st, o)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func prod(s []int64) int64 {
	n := int64(1)
	for _, x := range s {
		n *= x
	}
	return n
}
