package fill

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// TestViewsAgainstZarrPython writes stores with zarr-python (several
// chunkings, a missing chunk, sharding, blosc, v2 big-endian F-order,
// float32/float64/int16/bool inputs), lets numpy compute every view sample
// from zarr-python's own reads, and compares every view file zarrfs fills:
// header, data bytes and sidecar.
func TestViewsAgainstZarrPython(t *testing.T) {
	testenv.Python(t, "numpy", "zarr")
	dir := t.TempDir()
	out, err := exec.Command("python3", "testdata/make_view_stores.py", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("make_view_stores.py: %v\n%s", err, out)
	}
	var manifest map[string]map[string]struct {
		Files        int64            `json:"files"`
		SampleShape  []int64          `json:"sample_shape"`
		Descr        string           `json:"descr"`
		Channels     []map[string]any `json:"channels"`
		SampleCoords []any            `json:"sample_coords"`
	}
	mb, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(mb, &manifest); err != nil {
		t.Fatal(err)
	}
	stores := make([]string, 0, len(manifest))
	for s := range manifest {
		stores = append(stores, s)
	}
	sort.Strings(stores)
	compared := 0
	for _, store := range stores {
		t.Run(store, func(t *testing.T) {
			h := viewtest.OpenStore(t, filepath.Join(dir, store+".zarr"), zarr.Options{})
			specs, err := layout.LoadViews(filepath.Join(dir, store+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			views, err := layout.BindViews(context.Background(), h, specs, layout.BindOptions{})
			if err != nil {
				t.Fatal(err)
			}
			l, err := layout.Build(h, layout.Options{Views: views})
			f := newFiller(t, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range views {
				want := manifest[store][v.Name]
				e, ok := l.Lookup(v.Name + ".json")
				if !ok {
					t.Fatalf("%s.json missing", v.Name)
				}
				var side layout.ViewSidecar
				if err := json.Unmarshal(e.Data, &side); err != nil {
					t.Fatal(err)
				}
				if side.Kind != "view" || side.Files != want.Files || side.DType != want.Descr ||
					!reflect.DeepEqual(side.SampleShape, want.SampleShape) || !reflect.DeepEqual(side.Shape, append([]int64{want.Files}, want.SampleShape...)) ||
					side.DataOffset != 4096 || side.Attributes == nil || len(side.Dims) != len(want.SampleShape)+1 || *side.Dims[0] != side.SampleDim || *side.Dims[1] != "channel" {
					t.Errorf("%s: sidecar %s", v.Name, e.Data)
				}
				// Channels and coordinates as zarr-python sees them.
				var raw map[string]any
				json.Unmarshal(e.Data, &raw)
				gotCh, _ := json.Marshal(stripDTypes(raw["channels"]))
				wantCh, _ := json.Marshal(want.Channels)
				if !jsonEqual(gotCh, wantCh) {
					t.Errorf("%s: channels\n%s\nwant\n%s", v.Name, gotCh, wantCh)
				}
				gotSC, _ := json.Marshal(raw["sample_coords"])
				wantSC, _ := json.Marshal(want.SampleCoords)
				if !jsonEqual(gotSC, wantSC) {
					t.Errorf("%s: sample_coords %s, want %s", v.Name, gotSC, wantSC)
				}
				d := mustDir(t, l, v.Name)
				if int64(d.Len()) != want.Files {
					t.Fatalf("%s: %d files, want %d", v.Name, d.Len(), want.Files)
				}
				for k := 0; k < d.Len(); k++ {
					b := d.Entry(k).Blob
					data, _ := os.ReadFile(fillFile(t, f, l, b))
					ph, err := layout.ParseNPYHeader(data)
					if err != nil || ph.Descr != want.Descr || !reflect.DeepEqual(ph.Shape, want.SampleShape) || ph.DataOffset != 4096 || ph.FortranOrder {
						t.Errorf("%s: header %+v %v", b.Path(), ph, err)
					}
					exp, err := os.ReadFile(filepath.Join(dir, "expect", store, v.Name, fmt.Sprintf("%d.bin", k)))
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(data[4096:], exp) {
						t.Errorf("%s differs from numpy's sample (%d bytes, first difference at byte %d)", b.Path(), len(exp), firstDiff(data[4096:], exp))
					}
					compared++
				}
			}
			// numpy itself loads a view file.
			p := fillFile(t, f, l, mustDir(t, l, views[0].Name).Entry(0).Blob)
			out, err := exec.Command("python3", "-c", "import sys, numpy as np; a = np.load(sys.argv[1]); print(a.dtype.str, list(a.shape))", p).CombinedOutput()
			if err != nil || !strings.Contains(string(out), manifest[store][views[0].Name].Descr) {
				t.Errorf("numpy.load: %v %s", err, out)
			}
		})
	}
	if compared < 30 {
		t.Errorf("only %d files compared", compared)
	}
}

// stripDTypes drops the source_dtype field the manifest does not carry.
func stripDTypes(v any) any {
	list, _ := v.([]any)
	for _, c := range list {
		delete(c.(map[string]any), "source_dtype")
	}
	return list
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
