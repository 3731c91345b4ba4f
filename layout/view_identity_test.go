package layout

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/zarr"
)

// buildViews is the layout of h with the views of the YAML text, bound
// with BindOptions{}, Views set in o.
func buildViews(t *testing.T, h *zarr.Hierarchy, text string, o Options) (*Layout, []*View) {
	t.Helper()
	specs, err := ParseViews("views.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	views, err := BindViews(context.Background(), h, specs, BindOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.Views = views
	l, err := Build(h, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, views
}

// A view sample of a strided view (samples.step 2) is identified by the
// chunks it reads, those of its own time step: a rewrite of one chunk
// changes the identity of the one sample that reads it, and of no other,
// so that the rewrite is never served stale.
func TestStridedViewIdentityNamesItsChunks(t *testing.T) {
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, []storeArray{{Path: "t", DType: "float32", Shape: []int64{8, 2, 3}, Chunks: []int64{1, 2, 3},
		Dims: []string{"time", "latitude", "longitude"}, Value: func(idx []int64) float64 { return float64(idx[0]) }}})
	const view = "views:\n  - name: v\n    samples: {start: 1, stop: 8, step: 2}\n    channels:\n      - var: t\n"
	idents := func() []string {
		t.Helper()
		h := viewtest.OpenStore(t, dir, zarr.Options{})
		defer h.Close()
		l, views := buildViews(t, h, view, Options{})
		var out []string
		for k := int64(0); k < views[0].N; k++ {
			e, ok := l.Lookup("v/" + sampleFileName(k, sampleWidth(views[0].N)))
			if !ok {
				t.Fatalf("no sample %d", k)
			}
			id, err := l.Identity(context.Background(), e.Blob)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, id)
		}
		return out
	}
	before := idents()
	if len(before) != 4 {
		t.Fatalf("%d samples, want 4 (time steps 1, 3, 5, 7)", len(before))
	}
	// Time step 3, which sample 1 reads: a new version of its chunk.
	chunk := filepath.Join(dir, "t", "c", "3", "0", "0")
	b, err := os.ReadFile(chunk)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(chunk)
	if err := os.WriteFile(chunk, b, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(chunk, later, later)
	after := idents()
	for k := range before {
		if changed := before[k] != after[k]; changed != (k == 1) {
			t.Errorf("sample %d: identity changed %v after a rewrite of time step 3's chunk, want %v", k, changed, k == 1)
		}
	}
}
