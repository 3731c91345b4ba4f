package fill

// Fakes and fixtures of the fill tests: readers that make every value
// from its array and index, and the hierarchies and views they read.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

// indexReader fills every element with its linear index in the whole array
// (as the array's integer or float type), and records the requests.
type indexReader struct {
	mu   sync.Mutex
	reqs []zarr.Request
	err  error
}

func (r *indexReader) Read(ctx context.Context, _ *zarr.Pin, reqs []zarr.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	for _, q := range reqs {
		r.reqs = append(r.reqs, zarr.Request{Array: q.Array, Start: append([]int64(nil), q.Start...), Count: append([]int64(nil), q.Count...)})
		fillIndex(q)
	}
	return nil
}

func fillIndex(q zarr.Request) {
	a := q.Array
	n := prod(q.Count)
	if int64(len(q.Dst)) != n*int64(a.DType.Size) {
		panic(fmt.Sprintf("dst %d bytes for count %v", len(q.Dst), q.Count))
	}
	idx := make([]int64, len(q.Count))
	for e := int64(0); e < n; e++ {
		// Global linear index of element e of the region.
		rem, lin := e, int64(0)
		for d := len(q.Count) - 1; d >= 0; d-- {
			idx[d] = rem % q.Count[d]
			rem /= q.Count[d]
		}
		for d := range q.Count {
			lin = lin*a.Shape[d] + q.Start[d] + idx[d]
		}
		putValue(q.Dst[e*int64(a.DType.Size):], a.DType, lin)
	}
}

func putValue(b []byte, d zarr.DType, v int64) {
	switch {
	case d.Kind == 'f' && d.Size == 4:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case d.Kind == 'f' && d.Size == 8:
		binary.LittleEndian.PutUint64(b, math.Float64bits(float64(v)))
	case d.Size == 1:
		b[0] = byte(v)
	case d.Size == 2:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case d.Size == 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	case d.Size == 8:
		binary.LittleEndian.PutUint64(b, uint64(v))
	}
}

var (
	f32 = zarr.DType{Kind: 'f', Size: 4}
	f64 = zarr.DType{Kind: 'f', Size: 8, BigEndian: true}
	i64 = zarr.DType{Kind: 'i', Size: 8}
	u8  = zarr.DType{Kind: 'u', Size: 1}
	i16 = zarr.DType{Kind: 'i', Size: 2}
)

type fakeStore struct{ id string }

func (s fakeStore) Get(context.Context, string) ([]byte, error) { return nil, errors.New("no") }

func (s fakeStore) GetRange(context.Context, string, int64, int64) ([]byte, error) {
	return nil, errors.New("no")
}

func (s fakeStore) List(context.Context, string) ([]string, error) { return nil, nil }

func (s fakeStore) ID() string { return s.id }
func (fakeStore) Close() error { return nil }

func testHierarchy() *zarr.Hierarchy {
	return &zarr.Hierarchy{
		Store:  fakeStore{"file:///data/era5.zarr"},
		Groups: map[string]map[string]any{"": {}, "sub": {}, "empty": {}},
		Arrays: []*zarr.Array{
			{Path: "bad", Shape: []int64{4}, Chunks: []int64{4}, DType: f32, Dims: []string{"x"}, MetaHash: "b", Unsupported: "codec 'bitround' is not supported"},
			{Path: "lsm", Shape: []int64{16, 24}, Chunks: []int64{16, 24}, DType: u8, Dims: []string{"latitude", "longitude"}, MetaHash: "l", FillValue: int64(0)},
			{Path: "scalar", Shape: []int64{}, Chunks: []int64{}, DType: f64, MetaHash: "s", FillValue: "NaN"},
			{Path: "sub/sp", Shape: []int64{30, 16, 24}, Chunks: []int64{10, 16, 24}, DType: i16, Dims: []string{"time", "latitude", "longitude"}, MetaHash: "sp", FillValue: int64(-32768)},
			{Path: "t", Shape: []int64{12, 3, 16, 24}, Chunks: []int64{5, 3, 8, 8}, DType: f32, Dims: []string{"time", "level", "latitude", "longitude"}, MetaHash: "t", FillValue: "NaN",
				Attributes: map[string]any{"units": "K"}, Codecs: []string{"bytes", "zstd"}, ZarrFormat: 3},
			{Path: "time", Shape: []int64{12}, Chunks: []int64{12}, DType: i64, Dims: []string{"time"}, MetaHash: "ti"},
			{Path: "one", Shape: []int64{5, 1}, Chunks: []int64{5, 1}, DType: f32, Dims: []string{"", "time"}, MetaHash: "o"},
		},
	}
}

// build is the layout of h, and an indexReader for a Filler to read it
// with.
func build(t *testing.T, h *zarr.Hierarchy, o layout.Options) (*layout.Layout, *indexReader) {
	t.Helper()
	l, err := layout.Build(h, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, &indexReader{}
}

// newFiller is New(o), failing the test on error.
func newFiller(t testing.TB, o Options) *Filler {
	t.Helper()
	f, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func names(d *layout.Dir) []string {
	var s []string
	for i := 0; i < d.Len(); i++ {
		s = append(s, d.Entry(i).Name)
	}
	return s
}

func mustLookup(t *testing.T, l *layout.Layout, p string) layout.Blob {
	t.Helper()
	e, ok := l.Lookup(p)
	if !ok || e.Kind != layout.KindBlob {
		t.Fatalf("%s: not a blob", p)
	}
	return e.Blob
}

// valueReader fills every element with value(path, index), encoded in the
// array's type, and counts calls.
type valueReader struct {
	mu    sync.Mutex
	calls int
	reqs  []zarr.Request
}

// testValue is the value of an element: distinct per array and index,
// exact in float32 for the small test arrays.
func testValue(a *zarr.Array, idx []int64) float64 {
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

func encodeValue(b []byte, d zarr.DType, v float64) {
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

func (r *valueReader) Read(ctx context.Context, _ *zarr.Pin, reqs []zarr.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	for _, q := range reqs {
		r.reqs = append(r.reqs, zarr.Request{Array: q.Array, Start: append([]int64(nil), q.Start...), Count: append([]int64(nil), q.Count...)})
		size := int64(q.Array.DType.Size)
		i := int64(0)
		forEachIndex(q.Start, q.Count, func(idx []int64) {
			encodeValue(q.Dst[i*size:], q.Array.DType, testValue(q.Array, idx))
			i++
		})
	}
	return nil
}

// forEachIndex visits every index of the region in C order.
func forEachIndex(start, count []int64, f func([]int64)) {
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

func viewHierarchy() *zarr.Hierarchy {
	f16 := zarr.DType{Kind: 'f', Size: 2}
	f64 := zarr.DType{Kind: 'f', Size: 8}
	arr := func(p string, dt zarr.DType, dims []string, shape ...int64) *zarr.Array {
		return &zarr.Array{Path: p, Shape: shape, Chunks: shape, DType: dt, Dims: dims, MetaHash: "m-" + p, Attributes: map[string]any{}}
	}
	spatial := []string{"latitude", "longitude"}
	h := &zarr.Hierarchy{
		Store:  fakeStore{"file:///data/era5.zarr"},
		Groups: map[string]map[string]any{"": {}, "sub": {}},
		Arrays: []*zarr.Array{
			{Path: "bad", Shape: []int64{12, 4, 5}, Chunks: []int64{1, 4, 5}, DType: f32, Dims: []string{"time", "latitude", "longitude"}, Unsupported: "codec 'bitround' is not supported"},
			arr("ens", f32, []string{"time", "member", "level", "latitude", "longitude"}, 12, 2, 3, 4, 5),
			arr("half", f16, append([]string{"time"}, spatial...), 12, 4, 5),
			arr("latitude", f32, []string{"latitude"}, 4),
			arr("level", f32, []string{"level"}, 3),
			arr("lsm", u8, spatial, 4, 5),
			arr("q", f32, append([]string{"time"}, spatial...), 10, 4, 5),
			arr("renamed", f32, []string{"time", "y", "x"}, 12, 4, 5),
			arr("sub/sp", f32, append([]string{"time"}, spatial...), 12, 4, 5),
			arr("t", f32, []string{"time", "level", "latitude", "longitude"}, 12, 3, 4, 5),
			arr("time", i64, []string{"time"}, 12),
			arr("u10", i16, append([]string{"time"}, spatial...), 12, 4, 5),
			arr("w", f32, []string{"time", "level", "latitude", "longitude"}, 12, 2, 4, 5),
			arr("wide", f32, append([]string{"time"}, spatial...), 12, 5, 4),
			arr("z", f64, []string{"time", "level", "latitude", "longitude"}, 12, 3, 4, 5),
		},
	}
	h.Arrays[len(h.Arrays)-1].DType.BigEndian = true // Read converts; the view must not care
	return h
}

func bindYAML(t *testing.T, h *zarr.Hierarchy, text string) ([]*layout.View, error) {
	t.Helper()
	specs, err := layout.ParseViews("views.yaml", []byte(text))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return layout.BindViews(context.Background(), h, specs, layout.BindOptions{Reader: &valueReader{}})
}

type failReader struct{}

const trainYAML = `views:
  - name: train
    samples: {start: 1, stop: 12, step: 2}
    dtype: float64
    channels:
      - var: t
        select: {level: [2, 0]}
      - var: z
        select_values: {level: [850]}
      - var: u10
      - var: lsm
      - var: ens
        select: {level: [1, 2], member: [1, 0]}
`

// expectSample computes the channels of a view sample straight from
// testValue, as float64.
func expectSample(v *layout.View, k int64) []float64 {
	t := v.Start + k*v.Step
	var out []float64
	for _, ch := range v.Channels {
		start, count := ch.Region(t)
		forEachIndex(start, count, func(idx []int64) { out = append(out, testValue(ch.Array, idx)) })
	}
	return out
}

func mustDir(t *testing.T, l *layout.Layout, p string) *layout.Dir {
	t.Helper()
	e, ok := l.Lookup(p)
	if !ok || e.Kind != layout.KindDir {
		t.Fatalf("%s: not a directory", p)
	}
	return e.Dir
}

// storeArray is one array of a store written by writeStore.
type storeArray struct {
	path   string
	dtype  string
	shape  []int64
	chunks []int64
	dims   []string
	value  func(idx []int64) float64
}

// writeStore writes a Zarr v3 group with zstd-compressed chunks.
func writeStore(t *testing.T, dir string, arrays []storeArray) {
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
		dt, err := zarr.ParseV3DType(a.dtype)
		if err != nil {
			t.Fatal(err)
		}
		writeJSON(filepath.Join(dir, a.path, "zarr.json"), map[string]any{
			"zarr_format": 3, "node_type": "array", "shape": a.shape, "data_type": a.dtype,
			"chunk_grid":         map[string]any{"name": "regular", "configuration": map[string]any{"chunk_shape": a.chunks}},
			"chunk_key_encoding": map[string]any{"name": "default", "configuration": map[string]any{"separator": "/"}},
			"codecs": []any{map[string]any{"name": "bytes", "configuration": map[string]any{"endian": "little"}},
				map[string]any{"name": "zstd", "configuration": map[string]any{"level": 1, "checksum": false}}},
			"fill_value": 0, "dimension_names": a.dims, "attributes": map[string]any{},
		})
		grid := make([]int64, len(a.shape))
		for d := range grid {
			grid[d] = (a.shape[d] + a.chunks[d] - 1) / a.chunks[d]
		}
		forEachIndex(make([]int64, len(grid)), grid, func(c []int64) {
			buf := make([]byte, prod(a.chunks)*int64(dt.Size))
			start := make([]int64, len(c))
			for d := range c {
				start[d] = c[d] * a.chunks[d]
			}
			i := int64(0)
			forEachIndex(start, a.chunks, func(idx []int64) {
				inside := true
				for d := range idx {
					inside = inside && idx[d] < a.shape[d]
				}
				if inside {
					encodeValue(buf[i*int64(dt.Size):], dt, a.value(idx))
				}
				i++
			})
			key := filepath.Join(dir, a.path, "c")
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

func openStore(t *testing.T, dir string, o zarr.Options) *zarr.Hierarchy {
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

func (failReader) Read(context.Context, *zarr.Pin, []zarr.Request) error {
	return fmt.Errorf("level/c/0: %w", codec.ErrCorrupt)
}

// rewriteChunk gives the chunk file at rel (below dir) the bytes of the
// one at from: a new file, dated an hour ahead, so a new version.
func rewriteChunk(t *testing.T, dir, rel, from string) {
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

// buildViews is the layout of h with the views of the YAML text, bound
// with BindOptions{}, Views set in o.
func buildViews(t *testing.T, h *zarr.Hierarchy, text string, o layout.Options) (*layout.Layout, []*layout.View) {
	t.Helper()
	specs, err := layout.ParseViews("views.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	views, err := layout.BindViews(context.Background(), h, specs, layout.BindOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.Views = views
	l, err := layout.Build(h, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, views
}

// requirePython skips (or fails under CI) when python3 or a module is missing.
func requirePython(t testing.TB, modules ...string) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3 not found")
	}
	for _, m := range modules {
		if err := exec.Command("python3", "-c", "import "+m).Run(); err != nil {
			testenv.Missing(t, "python module %s not installed (make pydeps)", m)
		}
	}
}

// readerFunc is a zarr.Reader made of a function.
type readerFunc func(ctx context.Context, pin *zarr.Pin, reqs []zarr.Request) error

func (f readerFunc) Read(ctx context.Context, pin *zarr.Pin, reqs []zarr.Request) error {
	return f(ctx, pin, reqs)
}

// must is v, for options a test knows to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
