package fill

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/testenv"
	"github.com/zarrfs/zarrfs/internal/viewtest"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// fillFile writes blob b of l, filled by f, to a temporary .npy file.
func fillFile(t *testing.T, f *Filler, l *layout.Layout, b layout.Blob) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), strings.ReplaceAll(b.Path(), "/", "_"))
	out, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := f.Fill(context.Background(), l, b, nil, out); err != nil {
		t.Fatal(err)
	}
	if st, _ := out.Stat(); st.Size() != b.Size() {
		t.Fatalf("%s: wrote %d bytes, size says %d", b.Path(), st.Size(), b.Size())
	}
	return p
}

func TestFillContent(t *testing.T) {
	l, r := build(t, viewtest.Hierarchy(), layout.Options{})
	e, _ := l.Lookup("t/07.npy")
	p := fillFile(t, newFiller(t, Options{Reader: r}), l, e.Blob)
	data, _ := os.ReadFile(p)
	if len(r.reqs) != 1 || !reflect.DeepEqual(r.reqs[0].Start, []int64{7, 0, 0, 0}) || !reflect.DeepEqual(r.reqs[0].Count, []int64{1, 3, 16, 24}) {
		t.Errorf("requests %+v", r.reqs)
	}
	// Element (level 2, lat 5, lon 6) of sample 7.
	off := 4096 + 4*((2*16+5)*24+6)
	got := math.Float32frombits(binary.LittleEndian.Uint32(data[off:]))
	want := float32(((7*3+2)*16+5)*24 + 6)
	if got != want {
		t.Errorf("value %v, want %v", got, want)
	}
	if !reflect.DeepEqual(e.Blob.Sources()[0].Start, []int64{7, 0, 0, 0}) {
		t.Errorf("sources %+v", e.Blob.Sources())
	}
}

func TestFillSlabs(t *testing.T) {
	h := &zarr.Hierarchy{Store: fakeStore{Name: "x"}, Arrays: []*zarr.Array{
		{Path: "big", Shape: []int64{23, 4}, Chunks: []int64{5, 4}, DType: f32, Dims: []string{"y", "x"}},
		{Path: "s", Shape: []int64{2, 1, 17, 3}, Chunks: []int64{1, 1, 4, 3}, DType: f32, Dims: []string{"time", "a", "y", "x"}},
	}}
	// 16 bytes per row of big: a 40-byte slab bound gives one 5-row chunk row per slab.
	l, r := build(t, h, layout.Options{})
	f := newFiller(t, Options{Reader: r, SlabBytes: 40})
	whole := mustLookup(t, l, "big.npy")
	ref := make([]byte, 23*4*4)
	fillIndex(zarr.Request{Array: h.Arrays[0], Start: []int64{0, 0}, Count: []int64{23, 4}, Dst: ref})
	data, _ := os.ReadFile(fillFile(t, f, l, whole))
	if !bytes.Equal(data[4096:], ref) {
		t.Error("slabbed fill differs from one read")
	}
	var starts []int64
	for _, q := range r.reqs {
		starts = append(starts, q.Start[0])
		if q.Start[0]%5 != 0 || (q.Count[0] != 5 && q.Start[0]+q.Count[0] != 23) {
			t.Errorf("slab %v+%v is not cut at chunk boundaries", q.Start, q.Count)
		}
	}
	if !reflect.DeepEqual(starts, []int64{0, 5, 10, 15, 20}) {
		t.Errorf("slab starts %v", starts)
	}
	// A sample whose outer axis has one element splits on the next axis.
	r.reqs = nil
	s := mustLookup(t, l, "s/1.npy")
	data, _ = os.ReadFile(fillFile(t, f, l, s))
	ref = make([]byte, 17*3*4)
	fillIndex(zarr.Request{Array: h.Arrays[1], Start: []int64{1, 0, 0, 0}, Count: []int64{1, 1, 17, 3}, Dst: ref})
	if !bytes.Equal(data[4096:], ref) || len(r.reqs) != 5 {
		t.Errorf("sample slabs: %d requests, equal=%v", len(r.reqs), bytes.Equal(data[4096:], ref))
	}
}

func TestFillError(t *testing.T) {
	l, r := build(t, viewtest.Hierarchy(), layout.Options{})
	r.err = fmt.Errorf("t/c/0/0/0/0: %w", codec.ErrCorrupt)
	b := mustLookup(t, l, "t/00.npy")
	out, _ := os.Create(filepath.Join(t.TempDir(), "x"))
	defer out.Close()
	err := newFiller(t, Options{Reader: r}).Fill(context.Background(), l, b, nil, out)
	if !errors.Is(err, codec.ErrCorrupt) || !strings.Contains(err.Error(), "t/00.npy") {
		t.Errorf("fill error %v", err)
	}
}

// TestNumpyLoads checks that numpy itself parses what we write.
func TestNumpyLoads(t *testing.T) {
	testenv.Python(t, "numpy")
	for _, align := range []int64{128, 4096, layout.MaxAlign} {
		l, r := build(t, viewtest.Hierarchy(), layout.Options{Align: align})
		f := newFiller(t, Options{Reader: r})
		var files []string
		var want []string
		for _, p := range []string{"t/03.npy", "time.npy", "scalar.npy", "lsm.npy", "one/0.npy", "sub/sp/29.npy"} {
			b := mustLookup(t, l, p)
			files = append(files, fillFile(t, f, l, b))
			ph, _ := layout.ParseNPYHeader(b.Header())
			want = append(want, fmt.Sprintf("%s %v", ph.Descr, ph.Shape))
		}
		script := `
import sys, numpy as np
for p in sys.argv[1:]:
    a = np.load(p)
    off = open(p, 'rb').read().index(b'\n') + 1
    assert a.flags.c_contiguous
    flat = a.reshape(-1)
    print(a.dtype.str, list(a.shape), off, float(flat[-1]) if flat.size else None)
`
		out, err := exec.Command("python3", append([]string{"-c", script}, files...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("numpy.load (align %d): %v\n%s", align, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		for i, line := range lines {
			f := strings.Fields(strings.NewReplacer("[", "", "]", "", ",", "").Replace(line))
			if f[0] != strings.Fields(want[i])[0] {
				t.Errorf("%s: numpy dtype %s, want %s", files[i], f[0], want[i])
			}
			if !strings.Contains(line, fmt.Sprintf(" %d ", align)) {
				t.Errorf("%s: numpy sees %q, data not at %d", files[i], line, align)
			}
		}
		// Last element of t/03 is its global linear index.
		if !strings.HasSuffix(lines[0], fmt.Sprintf(" %d.0", 4*3*16*24-1)) {
			t.Errorf("t/03.npy last value: %s", lines[0])
		}
	}
}

func TestNegativeSlabBytesRefused(t *testing.T) {
	if _, err := New(Options{SlabBytes: -1}); err == nil || !strings.Contains(err.Error(), "slab bytes -1") {
		t.Errorf("SlabBytes -1: %v, want a refusal naming it", err)
	}
	if f, err := New(Options{}); err != nil || f.o.SlabBytes != 64<<20 {
		t.Errorf("SlabBytes 0: %v, want 64 MiB", err)
	}
}
