package layout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/internal/viewtest"
	"github.com/zarrfs/zarrfs/zarr"
)

var (
	f32 = viewtest.F32
	f64 = viewtest.F64
	i64 = viewtest.I64
	u8  = viewtest.U8
	i16 = viewtest.I16
)

type fakeStore = viewtest.FakeStore

func build(t *testing.T, h *zarr.Hierarchy, o Options) *Layout {
	t.Helper()
	l, err := Build(h, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func names(d *Dir) []string {
	var s []string
	for i := 0; i < d.Len(); i++ {
		s = append(s, d.Entry(i).Name)
	}
	return s
}

func TestTree(t *testing.T) {
	l := build(t, viewtest.Hierarchy(), Options{})
	if got, want := names(l.Root()), []string{"empty", "lsm.json", "lsm.npy", "one", "one.json", "scalar.json", "scalar.npy", "sub", "t", "t.json", "time.json", "time.npy"}; !reflect.DeepEqual(got, want) {
		t.Errorf("root = %q, want %q", got, want)
	}
	if len(l.Skipped) != 1 || l.Skipped[0].Path != "bad" || !strings.Contains(l.Skipped[0].Reason, "bitround") {
		t.Errorf("skipped = %+v", l.Skipped)
	}
	if l.Arrays != 6 {
		t.Errorf("arrays = %d", l.Arrays)
	}
	// 12 t samples + 30 sp samples + 1 one sample + 3 whole blobs, plus 6 sidecars.
	if l.Files != 12+30+1+3+6 {
		t.Errorf("files = %d", l.Files)
	}
	e, ok := l.Lookup("sub")
	if !ok || e.Kind != KindDir || !reflect.DeepEqual(names(e.Dir), []string{"sp", "sp.json"}) {
		t.Errorf("sub = %+v", e)
	}
	if e, ok := l.Lookup("empty"); !ok || e.Dir.Len() != 0 {
		t.Errorf("empty group = %+v %v", e, ok)
	}
	tests := []struct {
		path string
		kind Kind
		size int64
	}{
		{"t/00.npy", KindBlob, 4096 + 3*16*24*4},
		{"t/11.npy", KindBlob, 4096 + 3*16*24*4},
		{"sub/sp/29.npy", KindBlob, 4096 + 16*24*2},
		{"one/0.npy", KindBlob, 4096 + 5*4},
		{"time.npy", KindBlob, 4096 + 12*8},
		{"scalar.npy", KindBlob, 4096 + 8},
		{"lsm.npy", KindBlob, 4096 + 16*24},
		{"t", KindDir, 0},
	}
	for _, tt := range tests {
		e, ok := l.Lookup(tt.path)
		if !ok || e.Kind != tt.kind || e.Size() != tt.size {
			t.Errorf("%s: ok=%v kind=%v size=%d, want kind %v size %d", tt.path, ok, e.Kind, e.Size(), tt.kind, tt.size)
		}
		if ok && e.Kind == KindBlob && e.Blob.Path() != tt.path {
			t.Errorf("%s: blob path %q", tt.path, e.Blob.Path())
		}
	}
	for _, missing := range []string{"bad.npy", "bad.json", "t/12.npy", "t/0.npy", "t/1.npy", "t/-1.npy", "t/00.npz", "t/+1.npy", "sub/sp/30.npy", "t/00.npy/x"} {
		if _, ok := l.Lookup(missing); ok {
			t.Errorf("%s exists", missing)
		}
	}
	var blobs int
	if err := l.Walk(func(Blob) error { blobs++; return nil }); err != nil || blobs != 12+30+1+3 {
		t.Errorf("walk: %d blobs, %v", blobs, err)
	}
}

// The names a sample had before its directory grew past powers of ten.
func TestNarrowerPaths(t *testing.T) {
	for p, want := range map[string]string{
		"t/0042.npy":  "t/042.npy t/42.npy",
		"v/000.npy":   "v/00.npy v/0.npy",
		"t/42.npy":    "",
		"t/0.npy":     "",
		"t/0x1.npy":   "",
		"lsm.npy":     "",
		"t/0042.json": "",
		"a/b/010.npy": "a/b/10.npy",
		"0042.npy":    "042.npy 42.npy",
	} {
		if got := strings.Join(NarrowerPaths(p), " "); got != want {
			t.Errorf("NarrowerPaths(%q) = %q, want %q", p, got, want)
		}
	}
}

func TestSampleNames(t *testing.T) {
	for _, tt := range []struct {
		n           int64
		first, last string
	}{
		{1, "0.npy", "0.npy"},
		{2, "0.npy", "1.npy"},
		{10, "0.npy", "9.npy"},
		{11, "00.npy", "10.npy"},
		{30, "00.npy", "29.npy"},
		{100, "00.npy", "99.npy"},
		{101, "000.npy", "100.npy"},
		{100000, "00000.npy", "99999.npy"},
	} {
		h := &zarr.Hierarchy{Store: fakeStore{Name: "x"}, Arrays: []*zarr.Array{{Path: "a", Shape: []int64{tt.n, 2}, Chunks: []int64{1, 2}, DType: f32, Dims: []string{"time", "x"}}}}
		l := build(t, h, Options{})
		e, _ := l.Lookup("a")
		d := e.Dir
		if d.Len() != int(tt.n) || d.Entry(0).Name != tt.first || d.Entry(d.Len()-1).Name != tt.last {
			t.Errorf("n=%d: len %d, %s..%s, want %s..%s", tt.n, d.Len(), d.Entry(0).Name, d.Entry(d.Len()-1).Name, tt.first, tt.last)
		}
		if _, ok := d.Lookup(tt.last); !ok {
			t.Errorf("n=%d: lookup %s failed", tt.n, tt.last)
		}
	}
}

func TestOptions(t *testing.T) {
	h := viewtest.Hierarchy()
	for _, tt := range []struct {
		align int64
		ok    bool
	}{{0, true}, {128, true}, {4096, true}, {8192, true}, {MaxAlign, true}, {MaxAlign + 64, false}, {64, false}, {100, false}, {-64, false}, {32, false}} {
		_, err := Build(h, Options{Align: tt.align})
		if (err == nil) != tt.ok {
			t.Errorf("align %d: err %v", tt.align, err)
		}
		if err != nil && !errors.Is(err, ErrInvalidOption) && !errors.Is(err, ErrHeaderTooLarge) {
			t.Errorf("align %d: %v is not ErrInvalidOption", tt.align, err)
		}
	}
	// Other sample dim: "latitude" turns lsm into a sample directory.
	l := build(t, h, Options{SampleDim: "latitude"})
	if e, ok := l.Lookup("lsm/15.npy"); !ok || e.Size() != 4096+24 {
		t.Errorf("lsm/15.npy with sample dim latitude: %v %d", ok, e.Size())
	}
	if _, ok := l.Lookup("time.npy"); !ok {
		t.Error("time.npy missing")
	}
}

// The layout ID (the cache directory) depends on the source, --align and
// --sample-dim only; a blob's identity on its array's metadata, less the
// sample dimension's length.
func TestLayoutID(t *testing.T) {
	base := build(t, viewtest.Hierarchy(), Options{})
	same := build(t, viewtest.Hierarchy(), Options{Align: 4096, SampleDim: "time"})
	if base.ID != same.ID || len(base.ID) != 32 {
		t.Fatalf("ids %q %q", base.ID, same.ID)
	}
	changed := viewtest.Hierarchy()
	changed.Arrays[4].MetaHash = "t2"
	other := viewtest.Hierarchy()
	other.Store = fakeStore{Name: "file:///data/other.zarr"}
	for name, l := range map[string]*Layout{
		"align":      build(t, viewtest.Hierarchy(), Options{Align: 128}),
		"sample dim": build(t, viewtest.Hierarchy(), Options{SampleDim: "level"}),
		"source":     build(t, other, Options{}),
	} {
		if l.ID == base.ID {
			t.Errorf("%s change keeps layout id", name)
		}
	}
	meta := build(t, changed, Options{})
	if meta.ID != base.ID {
		t.Error("a metadata change moved the layout")
	}
	ident := func(l *Layout, p string) string {
		t.Helper()
		e, ok := l.Lookup(p)
		if !ok {
			t.Fatalf("%s missing", p)
		}
		id, err := l.Identity(context.Background(), e.Blob)
		if err != nil || !cacheIdent(id) {
			t.Fatalf("identity of %s: %q %v", p, id, err)
		}
		return id
	}
	if ident(meta, "t/03.npy") == ident(base, "t/03.npy") {
		t.Error("t's metadata changed but its sample keeps its identity")
	}
	if ident(meta, "sub/sp/03.npy") != ident(base, "sub/sp/03.npy") || ident(meta, "time.npy") != ident(base, "time.npy") {
		t.Error("t's metadata changed and other arrays' blobs changed identity")
	}
	if ident(base, "t/03.npy") == ident(base, "t/04.npy") || ident(build(t, viewtest.Hierarchy(), Options{Align: 128}), "t/03.npy") == ident(base, "t/03.npy") {
		t.Error("identity ignores the sample or the alignment")
	}
	// Growing along time keeps the samples' identities, not the whole
	// time coordinate's.
	grown := viewtest.Hierarchy()
	grown.Arrays[4].Shape[0], grown.Arrays[5].Shape[0] = 20, 20
	g := build(t, grown, Options{})
	if ident(g, "t/03.npy") != ident(base, "t/03.npy") {
		t.Error("appending changed an old sample's identity")
	}
	if ident(g, "time.npy") == ident(base, "time.npy") {
		t.Error("the grown time coordinate kept its identity")
	}
}

// cacheIdent reports whether id is usable as a cache identity: 32 hex digits.
func cacheIdent(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func TestHeaders(t *testing.T) {
	for _, tt := range []struct {
		shape []int64
		descr string
		text  string
	}{
		{[]int64{}, "<f8", "'shape': ()"},
		{[]int64{5}, "<i8", "'shape': (5,)"},
		{[]int64{1}, "|u1", "'shape': (1,)"},
		{[]int64{721, 1440}, "<f4", "'shape': (721, 1440)"},
		{[]int64{0, 3}, "|b1", "'shape': (0, 3)"},
	} {
		for _, align := range []int64{128, 4096, MaxAlign} {
			h, err := NPYHeader(tt.descr, tt.shape, align)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(h)) != align || h[len(h)-1] != '\n' || !bytes.Contains(h, []byte(tt.text)) {
				t.Errorf("%v align %d: %q", tt.shape, align, h[:80])
			}
			want := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, %s, }", tt.descr, tt.text)
			if !bytes.HasPrefix(h[10:], []byte(want)) {
				t.Errorf("%v: header %q, want prefix %q", tt.shape, h[10:80], want)
			}
			p, err := ParseNPYHeader(h)
			if err != nil || p.Descr != tt.descr || p.FortranOrder || !reflect.DeepEqual(p.Shape, tt.shape) || p.DataOffset != align {
				t.Errorf("%v: parsed %+v, %v", tt.shape, p, err)
			}
		}
	}
	many := make([]int64, 20)
	for i := range many {
		many[i] = 123456789
	}
	if _, err := NPYHeader("<f4", many, 64); !errors.Is(err, ErrHeaderTooLarge) {
		t.Errorf("20-d header in 64 bytes: %v", err)
	}
	// An array whose header does not fit refuses the layout, naming the array.
	h := viewtest.Hierarchy()
	h.Arrays = append(h.Arrays, &zarr.Array{Path: "wide", Shape: many, Chunks: many, DType: f32, MetaHash: "w"})
	_, err := Build(h, Options{Align: 128})
	if !errors.Is(err, ErrHeaderTooLarge) || !strings.Contains(err.Error(), `"wide"`) {
		t.Errorf("build with a 20-d array at align 128: %v", err)
	}
}

func mustLookup(t *testing.T, l *Layout, p string) Blob {
	t.Helper()
	e, ok := l.Lookup(p)
	if !ok || e.Kind != KindBlob {
		t.Fatalf("%s: not a blob", p)
	}
	return e.Blob
}

func TestSidecar(t *testing.T) {
	l := build(t, viewtest.Hierarchy(), Options{Align: 128})
	for _, tt := range []struct {
		path string
		want map[string]any
	}{
		{"t.json", map[string]any{
			"kind": "array", "path": "t", "shape": []any{12.0, 3.0, 16.0, 24.0}, "dtype": "<f4",
			"dims": []any{"time", "level", "latitude", "longitude"}, "sample_dim": "time",
			"sample_shape": []any{3.0, 16.0, 24.0}, "files": 12.0, "data_offset": 128.0, "fill_value": "NaN",
			"attributes": map[string]any{"units": "K"}, "chunks": []any{5.0, 3.0, 8.0, 8.0}, "codecs": []any{"bytes", "zstd"},
			"source_dtype": "<f4", "zarr_format": 3.0,
		}},
		{"scalar.json", map[string]any{
			"kind": "array", "shape": []any{}, "dtype": "<f8", "source_dtype": ">f8", "dims": []any{}, "sample_dim": nil,
			"sample_shape": []any{}, "files": 1.0, "fill_value": "NaN", "attributes": map[string]any{},
		}},
		{"one.json", map[string]any{"dims": []any{nil, "time"}, "sample_dim": "time", "sample_shape": []any{5.0}, "files": 1.0}},
		{"sub/sp.json", map[string]any{"path": "sub/sp", "fill_value": -32768.0, "dtype": "<i2"}},
	} {
		e, ok := l.Lookup(tt.path)
		if !ok || e.Kind != KindSidecar {
			t.Fatalf("%s missing", tt.path)
		}
		if !bytes.Contains(e.Data, []byte(`"dtype": "<`)) && !bytes.Contains(e.Data, []byte(`"dtype": "|`)) {
			t.Errorf("%s: dtype not written literally: %s", tt.path, e.Data)
		}
		var got map[string]any
		if err := json.Unmarshal(e.Data, &got); err != nil {
			t.Fatal(err)
		}
		for k, v := range tt.want {
			if !reflect.DeepEqual(got[k], v) {
				t.Errorf("%s: %s = %#v, want %#v", tt.path, k, got[k], v)
			}
		}
	}
}

func FuzzParseNPYHeader(f *testing.F) {
	for _, s := range [][]int64{{}, {5}, {721, 1440}, {3, 0, 2}} {
		h, _ := NPYHeader("<f4", s, 128)
		f.Add(h)
	}
	f.Add([]byte("\x93NUMPY\x01\x00\x10\x00{'descr': '<i2'}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseNPYHeader(b)
		if err != nil {
			return
		}
		if p.DataOffset > int64(len(b)) || p.Descr == "" {
			t.Fatalf("parsed %+v from %d bytes", p, len(b))
		}
	})
}
