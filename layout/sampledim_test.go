package layout

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/syncbuf"
	"github.com/zarrfs/zarrfs/objectstore"
	"github.com/zarrfs/zarrfs/zarr"
)

func sampleDimStore(t *testing.T, dims ...[]string) string {
	dir := t.TempDir()
	var arrays []storeArray
	for i, d := range dims {
		shape := make([]int64, len(d))
		for j := range shape {
			shape[j] = 3
		}
		arrays = append(arrays, storeArray{Path: "v" + string(rune('0'+i)), DType: "float32", Shape: shape, Chunks: shape, Dims: d,
			Value: func([]int64) float64 { return 1 }})
	}
	viewtest.WriteStore(t, dir, arrays)
	return dir
}

// The first name of the list that an array has is the sample dimension:
// a store from the new CDS (valid_time) mounts its samples as one from
// ARCO (time) does.
func TestChooseSampleDim(t *testing.T) {
	tests := []struct {
		dims [][]string
		list string
		want string
		ok   bool
	}{
		{[][]string{{"valid_time", "lat", "lon"}}, DefaultSampleDims, "valid_time", true},
		{[][]string{{"time", "lat", "lon"}}, DefaultSampleDims, "time", true},
		{[][]string{{"valid_time", "lat"}, {"time", "lat"}}, DefaultSampleDims, "time", true},
		{[][]string{{"valid_time", "lat"}, {"time", "lat"}}, "valid_time,time", "valid_time", true},
		{[][]string{{"time"}, {"step", "lat"}}, DefaultSampleDims, "time", false}, // a 1-D coordinate is no sample array
		{[][]string{{"step", "lat"}}, "step", "step", true},
	}
	for _, tc := range tests {
		h := viewtest.OpenStore(t, sampleDimStore(t, tc.dims...), zarr.Options{})
		got, ok := ChooseSampleDim(h, tc.list)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%v, %q: got %q %v, want %q %v", tc.dims, tc.list, got, ok, tc.want, tc.ok)
		}
		l, err := Build(h, Options{SampleDim: tc.list})
		if err != nil {
			t.Fatal(err)
		}
		if l.SampleDim() != tc.want {
			t.Errorf("%v, %q: Build took %q", tc.dims, tc.list, l.SampleDim())
		}
		h.Close()
	}
	for _, bad := range []string{"", "time,", ",time", "time,,valid_time"} {
		if _, err := ParseSampleDims(bad); err == nil {
			t.Errorf("ParseSampleDims(%q) accepted", bad)
		}
	}
}

// A mount whose sample dimension no array has says so in one warning,
// naming the dimensions there are; the name chosen at the first open is
// kept by every later one.
func TestSourceSampleDim(t *testing.T) {
	dir := sampleDimStore(t, []string{"step", "lat", "lon"})
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	logs := &syncbuf.Buffer{}
	src := &Source{Store: st, Zarr: zarr.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))}, Layout: Options{SampleDim: DefaultSampleDims}}
	l, err := src.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out := strings.TrimSpace(logs.String())
	if strings.Count(out, "\n") != 0 || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "sample_dim=time,valid_time") ||
		!strings.Contains(out, "dims=lat,lon,step") {
		t.Fatalf("want one warning naming the list and the dimensions there are, got:\n%s", out)
	}
	if e, ok := l.Lookup("v0.npy"); !ok || e.Kind != KindBlob {
		t.Fatalf("v0 is not one file: %+v %v", e, ok)
	}
	// A store that matches: valid_time, kept across reopens.
	dir2 := sampleDimStore(t, []string{"valid_time", "lat"})
	st2, _ := objectstore.OpenPosix(dir2)
	defer st2.Close()
	logs2 := &syncbuf.Buffer{}
	src2 := &Source{Store: st2, Zarr: zarr.Options{Logger: slog.New(slog.NewTextHandler(logs2, nil))}, Layout: Options{SampleDim: DefaultSampleDims}}
	l2, err := src2.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if logs2.String() != "" || l2.SampleDim() != "valid_time" || src2.Layout.SampleDim != "valid_time" {
		t.Fatalf("sample dim %q (source %q), logs %q", l2.SampleDim(), src2.Layout.SampleDim, logs2)
	}
	if e, ok := l2.Lookup("v0"); !ok || e.Kind != KindDir {
		t.Fatalf("v0 is not a directory of samples: %+v %v", e, ok)
	}
	l3, err := src2.Reopen(context.Background(), l2)
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Close()
	if l3.SampleDim() != "valid_time" || l3.ID != l2.ID {
		t.Fatalf("reopen: sample dim %q, id changed %v", l3.SampleDim(), l3.ID != l2.ID)
	}
}

// A store whose first open has no array of two or more dimensions (its
// coordinates only) keeps the first name of the list: an array of the
// second name added later makes no layout of another ID, which a mount's
// refresh would refuse.
func TestSourceKeepsTheSampleDimOfAStoreWithoutSamples(t *testing.T) {
	dir := t.TempDir()
	coord := storeArray{Path: "x", DType: "float32", Shape: []int64{3}, Chunks: []int64{3}, Dims: []string{"x"}, Value: func([]int64) float64 { return 1 }}
	viewtest.WriteStore(t, dir, []storeArray{coord})
	st, err := objectstore.OpenPosix(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src := &Source{Store: st, Layout: Options{SampleDim: DefaultSampleDims}}
	l, err := src.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	viewtest.WriteStore(t, dir, []storeArray{coord, {Path: "v", DType: "float32", Shape: []int64{3, 3}, Chunks: []int64{3, 3},
		Dims: []string{"valid_time", "x"}, Value: func([]int64) float64 { return 1 }}})
	l2, err := src.Reopen(context.Background(), l)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if l2.ID != l.ID || l2.SampleDim() != "time" {
		t.Errorf("reopen: sample dim %q, ID changed %v", l2.SampleDim(), l2.ID != l.ID)
	}
	if e, ok := l2.Lookup("v.npy"); !ok || e.Kind != KindBlob {
		t.Errorf("v after the reopen: %+v %v, want one file", e, ok)
	}
}

// The zero Options and BindOptions mean the command line's default list,
// DefaultSampleDims: a store of valid_time gets its samples, in the tree
// and in a view, with no sample dimension named.
func TestZeroOptionsTryTheDefaultList(t *testing.T) {
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, []storeArray{{Path: "t2m", DType: "float32", Shape: []int64{4, 3}, Chunks: []int64{1, 3},
		Dims: []string{"valid_time", "x"}, Value: func([]int64) float64 { return 1 }}})
	h := viewtest.OpenStore(t, dir, zarr.Options{})
	defer h.Close()
	specs, err := ParseViews("v.yaml", []byte("views:\n  - name: v\n    channels:\n      - var: t2m\n"))
	if err != nil {
		t.Fatal(err)
	}
	views, err := BindViews(context.Background(), h, specs, BindOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if views[0].SampleDim != "valid_time" || views[0].N != 4 {
		t.Errorf("view: sample dim %q, %d samples", views[0].SampleDim, views[0].N)
	}
	l, err := Build(h, Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	if l.SampleDim() != "valid_time" {
		t.Errorf("Build took %q", l.SampleDim())
	}
	if e, ok := l.Lookup("t2m"); !ok || e.Kind != KindDir || e.Dir.Len() != 4 {
		t.Errorf("t2m: %+v %v, want a directory of 4 samples", e, ok)
	}
}
