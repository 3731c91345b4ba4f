package layout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/viewtest"
	"github.com/zarrfs/zarrfs/zarr"
)

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

func bindYAML(t *testing.T, h *zarr.Hierarchy, text string) ([]*View, error) {
	t.Helper()
	specs, err := ParseViews("views.yaml", []byte(text))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return BindViews(context.Background(), h, specs, BindOptions{Reader: &valueReader{}})
}

func TestBindErrors(t *testing.T) {
	view := func(body string) string {
		return "views:\n  - name: train\n    channels:\n" + body
	}
	for _, tt := range []struct {
		name, yaml, want string
	}{
		{"missing array", view("      - var: t\n      - var: tt\n"), `views.yaml:5: view "train": channels[1].var: array "tt" not found in the store`},
		{"unsupported array", view("      - var: bad\n"), `views.yaml:4: view "train": channels[0].var: array "bad" cannot be read: codec 'bitround' is not supported`},
		{"index out of range", view("      - var: t\n        select:\n          level: [0, 3]\n"), `views.yaml:6: view "train": channels[0].select.level[1]: index 3 out of range: dimension level of t has 3 entries (0..2)`},
		{"unknown dimension", view("      - var: t\n        select: {levl: [0]}\n"), `views.yaml:5: view "train": channels[0].select.levl: array t has no dimension "levl" (dimensions: time, level, latitude, longitude)`},
		{"select sample dim", view("      - var: t\n        select: {time: [0]}\n"), `views.yaml:5: view "train": channels[0].select.time: cannot select along the sample dimension time; use samples`},
		{"value not found", view("      - var: t\n        select_values:\n          level: [850, 925]\n"), `views.yaml:6: view "train": channels[0].select_values.level[1]: value 925 not found in coordinate array "level" (1000, 850, 500)`},
		{"value not found float", view("      - var: t\n        select_values: {level: [850.5]}\n"), `views.yaml:5: view "train": channels[0].select_values.level[0]: value 850.5 not found in coordinate array "level" (1000, 850, 500)`},
		{"no coordinate array", view("      - var: ens\n        select_values: {member: [1]}\n"), `views.yaml:5: view "train": channels[0].select_values.member: no 1-D coordinate array "member" for dimension member of ens: use select by index`},
		{"coordinate of other length", view("      - var: w\n        select_values: {level: [850]}\n"), `views.yaml:5: view "train": channels[0].select_values.level: coordinate array "level" has 3 values but dimension level of w has 2`},
		{"spatial shape", view("      - var: u10\n      - var: wide\n"), `views.yaml:5: view "train": channels[1]: channel wide has spatial shape (5, 4), but channels[0] (u10) has (4, 5): all channels must have the same spatial shape`},
		{"spatial shape unselected level", view("      - var: u10\n      - var: t\n"), `views.yaml:5: view "train": channels[1]: channel t has spatial shape (3, 4, 5), but channels[0] (u10) has (4, 5): all channels must have the same spatial shape; select along level of t, such as select: {level: all} for one channel per index`},
		{"dimension names", view("      - var: u10\n      - var: renamed\n"), `views.yaml:5: view "train": channels[1]: channel renamed has spatial dimensions (y, x), but channels[0] (u10) has (latitude, longitude): all channels must have the same dimension names`},
		{"mixed dtypes", view("      - var: t\n        select: {level: [0]}\n      - var: lsm\n"), `views.yaml:6: view "train": channels[1]: channel lsm is uint8 but channel t (channels[0]) is float32: set dtype to choose the output type`},
		{"float to int", "views:\n  - name: train\n    dtype: int16\n    channels:\n      - var: u10\n      - var: sub/sp\n", `views.yaml:6: view "train": channels[1]: channel sub/sp: casting float32 to int16 is not supported: float-to-integer results are undefined for NaN and out-of-range values`},
		{"stop past end", "views:\n  - name: train\n    samples: {stop: 13}\n    channels:\n      - var: u10\n", `views.yaml:3: view "train": samples.stop: stop 13 is past the end of time: channel u10 has 12 entries`},
		{"stop past shorter channel", "views:\n  - name: train\n    dtype: float32\n    samples: {stop: 11}\n    channels:\n      - var: u10\n      - var: q\n", `views.yaml:4: view "train": samples.stop: stop 11 is past the end of time: channel q has 10 entries`},
		{"start past end", "views:\n  - name: train\n    samples:\n      start: 12\n    channels:\n      - var: u10\n", `views.yaml:4: view "train": samples.start: start 12 is not below the end 12 of time: the range selects no samples`},
		{"lengths differ", "views:\n  - name: train\n    dtype: float32\n    channels:\n      - var: u10\n      - var: q\n", `views.yaml:6: view "train": channels[1]: channel q has 10 entries along time but channel u10 has 12: set samples.stop`},
		{"no sample channel", view("      - var: lsm\n"), `views.yaml:3: view "train": channels: no channel has the sample dimension "time", so the view has no samples`},
		{"other sample dim", "views:\n  - name: train\n    sample_dim: step\n    channels:\n      - var: u10\n", `views.yaml:4: view "train": channels: no channel has the sample dimension "step", so the view has no samples`},
		{"collides with array", "views:\n  - name: t\n    channels:\n      - var: u10\n", `views.yaml:2: view "t": name: name collides with array "t" in the mount`},
		{"collides with coordinate", "views:\n  - name: time\n    channels:\n      - var: u10\n", `views.yaml:2: view "time": name: name collides with array "time" in the mount`},
		{"collides with group", "views:\n  - name: sub\n    channels:\n      - var: u10\n", `views.yaml:2: view "sub": name: name collides with array "sub/sp" in the mount`},
		{"collides with npy name", "views:\n  - name: lsm.npy\n    channels:\n      - var: u10\n", `views.yaml:2: view "lsm.npy": name: name collides with array "lsm" in the mount`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := bindYAML(t, viewtest.ViewHierarchy(), tt.yaml)
			if err == nil {
				t.Fatalf("no error, want %s", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n  %s\nwant\n  %s", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidView) {
				t.Errorf("%v does not wrap ErrInvalidView", err)
			}
		})
	}
	// A group without arrays still owns its name.
	h := viewtest.ViewHierarchy()
	h.Groups["empty"] = map[string]any{}
	_, err := bindYAML(t, h, "views:\n  - name: empty\n    channels:\n      - var: u10\n")
	if want := `views.yaml:2: view "empty": name: name collides with group "empty" in the mount`; err == nil || err.Error() != want {
		t.Errorf("group collision: %v", err)
	}
	// Names are unique across files.
	a, _ := ParseViews("a.yaml", []byte("views:\n  - name: v\n    channels: [{var: u10}]\n"))
	b, _ := ParseViews("b.yaml", []byte("\nviews:\n  - name: v\n    channels: [{var: u10}]\n"))
	_, err = BindViews(context.Background(), viewtest.ViewHierarchy(), append(a, b...), BindOptions{Reader: &valueReader{}})
	if want := `b.yaml:3: view "v": name: a view named "v" is already defined at a.yaml:2`; err == nil || err.Error() != want {
		t.Errorf("duplicate across files: %v", err)
	}
	// A failing coordinate read is reported with the array, not as a spec error.
	specs, _ := ParseViews("v.yaml", []byte("views:\n  - name: v\n    channels: [{var: t, select_values: {level: [850]}}]\n"))
	_, err = specs[0].Bind(context.Background(), viewtest.ViewHierarchy(), BindOptions{Reader: failReader{}})
	if !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), `coordinate array "level"`) {
		t.Errorf("coordinate read failure: %v", err)
	}
}

type failReader struct{}

func (failReader) Read(context.Context, *zarr.Pin, []zarr.Request) error {
	return fmt.Errorf("level/c/0: %w", codec.ErrCorrupt)
}

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

func TestViewBuild(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, trainYAML)
	if err != nil {
		t.Fatal(err)
	}
	v := views[0]
	// Channel order: t levels 2, 0; z 850 (index 1); u10; lsm; then ens with
	// member (axis 1) before level (axis 2), last fastest.
	type sel struct {
		v   string
		sel string
	}
	var got []sel
	for _, ch := range v.Channels {
		s := ""
		for _, x := range ch.Select {
			s += fmt.Sprintf("%s=%d(%v) ", x.Dim, x.Index, x.Value)
		}
		got = append(got, sel{ch.Var, strings.TrimSpace(s)})
	}
	want := []sel{{"t", "level=2(500)"}, {"t", "level=0(1000)"}, {"z", "level=1(850)"}, {"u10", ""}, {"lsm", ""},
		{"ens", "member=1(<nil>) level=1(850)"}, {"ens", "member=1(<nil>) level=2(500)"}, {"ens", "member=0(<nil>) level=1(850)"}, {"ens", "member=0(<nil>) level=2(500)"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("channels\n%v\nwant\n%v", got, want)
	}
	if v.N != 6 || !reflect.DeepEqual(v.SampleShape, []int64{9, 4, 5}) || !reflect.DeepEqual(v.SampleDims, []string{"channel", "latitude", "longitude"}) {
		t.Errorf("n %d shape %v dims %v", v.N, v.SampleShape, v.SampleDims)
	}
	l, err := Build(h, Options{Views: views, Align: 128})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(mustDir(t, l, "train")); !reflect.DeepEqual(got, []string{"0.npy", "1.npy", "2.npy", "3.npy", "4.npy", "5.npy"}) {
		t.Errorf("train/ = %v", got)
	}
	if d := mustDir(t, l, "train"); !d.IsSampleDir() {
		t.Error("a view's directory is not a sample directory")
	} else if i, ok := d.Index("4.npy"); !ok || i != 4 {
		t.Errorf("index of 4.npy: %d %v", i, ok)
	}
	e, ok := l.Lookup("train.json")
	if !ok || e.Kind != KindSidecar {
		t.Fatal("train.json missing")
	}
	var side map[string]any
	if err := json.Unmarshal(e.Data, &side); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"kind": "view", "name": "train", "shape": []any{6.0, 9.0, 4.0, 5.0}, "dtype": "<f8",
		"dims": []any{"time", "channel", "latitude", "longitude"}, "sample_dim": "time", "sample_shape": []any{9.0, 4.0, 5.0},
		"files": 6.0, "data_offset": 128.0, "fill_value": nil, "attributes": map[string]any{},
		"samples":       map[string]any{"start": 1.0, "stop": 12.0, "step": 2.0},
		"sample_coords": []any{6.0, 18.0, 30.0, 42.0, 54.0, 66.0},
	} {
		if !reflect.DeepEqual(side[k], want) {
			t.Errorf("sidecar %s = %#v, want %#v", k, side[k], want)
		}
	}
	chans := side["channels"].([]any)
	if len(chans) != 9 ||
		!reflect.DeepEqual(chans[0], map[string]any{"var": "t", "static": false, "source_dtype": "<f4", "select": map[string]any{"level": map[string]any{"index": 2.0, "value": 500.0}}}) ||
		!reflect.DeepEqual(chans[2], map[string]any{"var": "z", "static": false, "source_dtype": ">f8", "select": map[string]any{"level": map[string]any{"index": 1.0, "value": 850.0}}}) ||
		!reflect.DeepEqual(chans[4], map[string]any{"var": "lsm", "static": true, "source_dtype": "|u1", "select": map[string]any{}}) ||
		!reflect.DeepEqual(chans[5].(map[string]any)["select"], map[string]any{"member": map[string]any{"index": 1.0, "value": nil}, "level": map[string]any{"index": 1.0, "value": 850.0}}) {
		t.Errorf("sidecar channels %v", chans)
	}
	// The layout counts the view's files.
	base, err := Build(h, Options{Align: 128})
	if err != nil {
		t.Fatal(err)
	}
	if l.Files != base.Files+7 {
		t.Errorf("files %d, without the view %d", l.Files, base.Files)
	}
}

func mustDir(t *testing.T, l *Layout, p string) *Dir {
	t.Helper()
	e, ok := l.Lookup(p)
	if !ok || e.Kind != KindDir {
		t.Fatalf("%s: not a directory", p)
	}
	return e.Dir
}

// A view sample's identity follows the view's definition: every change of
// it changes the identity, except that an open-ended view keeps it when
// its arrays grow along the sample dimension.
func TestViewIdentity(t *testing.T) {
	id := func(text string, grow int64) string {
		t.Helper()
		h := viewtest.ViewHierarchy()
		for _, a := range h.Arrays {
			if len(a.Dims) > 0 && a.Dims[0] == "time" {
				a.Shape[0] += grow
			}
		}
		views, err := bindYAML(t, h, text)
		if err != nil {
			t.Fatal(err)
		}
		l, err := Build(h, Options{Views: views})
		if err != nil {
			t.Fatal(err)
		}
		e, ok := l.Lookup(views[0].Name + "/" + sampleFileName(1, sampleWidth(views[0].N)))
		if !ok {
			t.Fatal("no sample 1")
		}
		ident, err := l.Identity(context.Background(), e.Blob)
		if err != nil {
			t.Fatal(err)
		}
		return ident
	}
	base := id(trainYAML, 0)
	if id(trainYAML, 0) != base {
		t.Fatal("identity not stable")
	}
	for name, text := range map[string]string{
		"name":    strings.Replace(trainYAML, "name: train", "name: train2", 1),
		"index":   strings.Replace(trainYAML, "level: [2, 0]", "level: [2, 1]", 1),
		"order":   strings.Replace(trainYAML, "level: [2, 0]", "level: [0, 2]", 1),
		"value":   strings.Replace(trainYAML, "level: [850]", "level: [500]", 1),
		"dtype":   strings.Replace(trainYAML, "float64", "float32", 1),
		"samples": strings.Replace(trainYAML, "step: 2", "step: 3", 1),
		"stop":    strings.Replace(trainYAML, "stop: 12", "stop: 11", 1),
		"channel": strings.Replace(trainYAML, "      - var: lsm\n", "", 1),
	} {
		if id(text, 0) == base {
			t.Errorf("changing the view's %s keeps the identity", name)
		}
	}
	// A value that resolves to the same index is the same view.
	if id(strings.Replace(trainYAML, "level: [850]", "level: [850.0]", 1), 0) != base {
		t.Error("850 and 850.0 give different identities")
	}
	open := strings.Replace(trainYAML, "stop: 12, ", "", 1)
	if id(open, 0) != id(open, 5) {
		t.Error("an open-ended view's sample changed identity when the arrays grew")
	}
}

func TestViewBuildErrors(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, "views:\n  - name: v\n    channels: [{var: u10}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Build(viewtest.ViewHierarchy(), Options{Views: views}); !errors.Is(err, ErrInvalidView) || !strings.Contains(err.Error(), "another store") {
		t.Errorf("view bound elsewhere: %v", err)
	}
	// A store whose root is an array: its files are named after the store.
	root := &zarr.Hierarchy{Store: fakeStore{Name: "file:///x/v.zarr"}, Groups: map[string]map[string]any{},
		Arrays: []*zarr.Array{{Path: "", Shape: []int64{3, 2}, Chunks: []int64{3, 2}, DType: f32, Dims: []string{"time", "x"}}}}
	if _, err := ParseViews("r.yaml", []byte("views:\n  - name: v\n    channels: [{var: ''}]\n")); err == nil {
		t.Error("empty var accepted")
	}
	specs, _ := ParseViews("r.yaml", []byte("views:\n  - name: v\n    channels: [{var: /}]\n"))
	if _, err := BindViews(context.Background(), root, specs, BindOptions{Reader: &valueReader{}}); err == nil || !strings.Contains(err.Error(), `collides with array ""`) {
		t.Errorf("root array collision: %v", err)
	}
	// A view header that does not fit the alignment refuses the layout:
	// find a rank whose array samples fit in 128 bytes but whose view
	// samples (one more dimension) do not.
	for k := 1; k < 40; k++ {
		shape := make([]int64, k)
		for i := range shape {
			shape[i] = 1
		}
		if _, err := NPYHeader("<f4", shape, 128); err != nil {
			t.Fatal("no rank fits")
		}
		if _, err := NPYHeader("<f4", append(shape, 1), 128); err == nil {
			continue
		}
		dims := []string{"time"}
		for i := range k {
			dims = append(dims, fmt.Sprintf("d%d", i))
		}
		deep := &zarr.Hierarchy{Store: fakeStore{Name: "x"}, Groups: map[string]map[string]any{},
			Arrays: []*zarr.Array{{Path: "a", Shape: append([]int64{2}, shape...), Chunks: append([]int64{2}, shape...), DType: f32, Dims: dims}}}
		views, err := bindYAML(t, deep, "views:\n  - name: v\n    channels: [{var: a}]\n")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Build(deep, Options{Align: 128}); err != nil {
			t.Fatal(err)
		}
		if _, err := Build(deep, Options{Views: views, Align: 128}); !errors.Is(err, ErrHeaderTooLarge) || !strings.Contains(err.Error(), `view "v"`) {
			t.Errorf("rank %d view at align 128: %v", k+1, err)
		}
		break
	}
}

type storeArray = viewtest.StoreArray

// select: {dim: all} is every index along dim, in order: the same view as
// listing them, with the same definition (so the same cache layout).
func TestSelectAll(t *testing.T) {
	h := viewtest.ViewHierarchy()
	all, err := bindYAML(t, h, "views:\n  - name: train\n    channels:\n      - var: t\n        select: {level: all}\n      - var: w\n        select: {level: all}\n")
	if err != nil {
		t.Fatal(err)
	}
	listed, err := bindYAML(t, h, "views:\n  - name: train\n    channels:\n      - var: t\n        select: {level: [0, 1, 2]}\n      - var: w\n        select: {level: [0, 1]}\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(all[0].Channels) != 5 || all[0].Definition() != listed[0].Definition() {
		t.Errorf("select all: %d channels, definition %q; listed: %q", len(all[0].Channels), all[0].Definition(), listed[0].Definition())
	}
}
