package fill

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// arrayCounter counts the requests of each array.
type arrayCounter struct {
	inner zarr.Reader
	mu    sync.Mutex
	n     map[string]int
}

func (c *arrayCounter) Read(ctx context.Context, pin *zarr.Pin, reqs []zarr.Request) error {
	c.mu.Lock()
	for _, q := range reqs {
		c.n[q.Array.Path]++
	}
	c.mu.Unlock()
	return c.inner.Read(ctx, pin, reqs)
}

// FillInto writes a view's samples as Fill does and reads nothing back
// from its buffers: a static channel is read for every sample, not copied
// from the first, and no memo is made from them; one a Fill made is used.
func TestFillIntoReadsNothingBack(t *testing.T) {
	dir := t.TempDir()
	writeStore(t, dir, []storeArray{
		{path: "t", dtype: "float32", shape: []int64{4, 2, 3}, chunks: []int64{1, 2, 3}, dims: []string{"time", "latitude", "longitude"},
			value: func(idx []int64) float64 { return float64(idx[0]*10 + idx[1]) }},
		{path: "lsm", dtype: "float32", shape: []int64{2, 3}, chunks: []int64{2, 3}, dims: []string{"latitude", "longitude"},
			value: func(idx []int64) float64 { return float64(idx[1]) + 0.5 }},
	})
	h := openStore(t, dir, zarr.Options{})
	defer h.Close()
	cr := &arrayCounter{inner: h, n: map[string]int{}}
	l, views := buildViews(t, h, "views:\n  - name: v\n    channels:\n      - var: t\n      - var: lsm\n", layout.Options{})
	f := newFiller(t, Options{Reader: cr})
	var blobs []layout.Blob
	for k := range 2 {
		blobs = append(blobs, mustDir(t, l, "v").SampleEntry(int64(k)).Blob)
	}
	size := blobs[0].Size() - int64(len(blobs[0].Header()))
	want := func(b layout.Blob) []byte {
		var w bufAt
		if err := f.Fill(context.Background(), l, b, nil, &w); err != nil {
			t.Fatal(err)
		}
		return w.b[len(b.Header()):]
	}
	into := func() [][]byte {
		outs := [][]byte{make([]byte, size), make([]byte, size)}
		if err := f.FillInto(context.Background(), l, blobs, outs, 0, nil); err != nil {
			t.Fatal(err)
		}
		return outs
	}
	outs := into()
	if cr.n["lsm"] != 2 {
		t.Fatalf("the static channel was read %d times for 2 samples, want once each", cr.n["lsm"])
	}
	if memo, _ := views[0].Static(nil); memo != nil {
		t.Fatal("FillInto made a memo of the static channel from its buffers")
	}
	for i, b := range blobs {
		if !bytes.Equal(outs[i], want(b)) {
			t.Fatalf("sample %d differs from its Fill", i)
		}
	}
	cr.n = map[string]int{}
	outs = into() // the Fills above made the memo
	if cr.n["lsm"] != 0 || !bytes.Equal(outs[1], want(blobs[1])) {
		t.Fatalf("with a memo: static channel read %d times, bytes equal %v", cr.n["lsm"], bytes.Equal(outs[1], want(blobs[1])))
	}
}

type bufAt struct{ b []byte }

func (w *bufAt) WriteAt(p []byte, off int64) (int, error) {
	if n := int(off) + len(p); n > len(w.b) {
		w.b = append(w.b, make([]byte, n-len(w.b))...)
	}
	copy(w.b[off:], p)
	return len(p), nil
}
