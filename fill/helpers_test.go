package fill

// Fakes and fixtures of the fill tests: readers that make every value
// from its array and index, and the hierarchies and views they read.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/viewtest"
	"github.com/zarrfs/zarrfs/layout"
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
	f32 = viewtest.F32
	f64 = viewtest.F64
	i64 = viewtest.I64
	u8  = viewtest.U8
	i16 = viewtest.I16
)

type fakeStore = viewtest.FakeStore

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

func (r *valueReader) Read(ctx context.Context, _ *zarr.Pin, reqs []zarr.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	for _, q := range reqs {
		r.reqs = append(r.reqs, zarr.Request{Array: q.Array, Start: append([]int64(nil), q.Start...), Count: append([]int64(nil), q.Count...)})
		size := int64(q.Array.DType.Size)
		i := int64(0)
		viewtest.ForEachIndex(q.Start, q.Count, func(idx []int64) {
			viewtest.Encode(q.Dst[i*size:], q.Array.DType, viewtest.Value(q.Array, idx))
			i++
		})
	}
	return nil
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
		viewtest.ForEachIndex(start, count, func(idx []int64) { out = append(out, viewtest.Value(ch.Array, idx)) })
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

type storeArray = viewtest.StoreArray

func (failReader) Read(context.Context, *zarr.Pin, []zarr.Request) error {
	return fmt.Errorf("level/c/0: %w", codec.ErrCorrupt)
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
