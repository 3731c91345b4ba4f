package fill

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/viewtest"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

func TestViewDefaultsAndCasts(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, `views:
  - name: same
    channels: [{var: t, select: {level: [1]}}, {var: sub/sp}]
  - name: f16
    dtype: float16
    channels: [{var: u10}, {var: lsm}, {var: half}, {var: z, select: {level: [0]}}]
  - name: long
    samples: {step: 1}
    channels: [{var: u10}]
`)
	if err != nil {
		t.Fatal(err)
	}
	if views[0].DType != f32 || views[0].N != 12 || views[0].Start != 0 || views[0].Stop != 12 {
		t.Errorf("same: %+v", views[0])
	}
	r := &valueReader{}
	l, err := layout.Build(h, layout.Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	f := newFiller(t, Options{Reader: r})
	if got := names(mustDir(t, l, "long")); len(got) != 12 || got[0] != "00.npy" || got[11] != "11.npy" {
		t.Errorf("long/ = %v", got)
	}
	v := views[1]
	b := mustLookup(t, l, "f16/07.npy")
	data, _ := os.ReadFile(fillFile(t, f, l, b))
	if ph, _ := layout.ParseNPYHeader(data); ph.Descr != "<f2" || !reflect.DeepEqual(ph.Shape, []int64{4, 4, 5}) {
		t.Errorf("header %+v", ph)
	}
	for i, x := range expectSample(v, 7) {
		if g := binary.LittleEndian.Uint16(data[4096+2*i:]); g != zarr.Float16Bits(x) {
			t.Fatalf("element %d = %#04x, want half(%v)", i, g, x)
		}
	}
}

// fillRuns fills blobs with FillInto and writes each, header and data,
// into its writer: the runs of FillInto seen as files, to compare with
// Fill's.
func fillRuns(f *Filler, l *layout.Layout, blobs []layout.Blob, ws []io.WriterAt, maxBytes int64) error {
	if len(blobs) != len(ws) {
		return fmt.Errorf("%d blobs and %d writers", len(blobs), len(ws))
	}
	outs := make([][]byte, len(blobs))
	for i, b := range blobs {
		outs[i] = make([]byte, b.Size()-int64(len(b.Header())))
	}
	if err := f.FillInto(context.Background(), l, blobs, outs, maxBytes, nil); err != nil {
		return err
	}
	for i, b := range blobs {
		if _, err := ws[i].WriteAt(b.Header(), 0); err != nil {
			return err
		}
		if _, err := ws[i].WriteAt(outs[i], int64(len(b.Header()))); err != nil {
			return err
		}
	}
	return nil
}

// FillInto reads runs of consecutive view samples in one Read each, within
// its bound, and other blobs one by one: the bytes are Fill's.
func TestFillIntoRuns(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, trainYAML)
	if err != nil {
		t.Fatal(err)
	}
	r := &valueReader{}
	l, err := layout.Build(h, layout.Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	f := newFiller(t, Options{Reader: r})
	var blobs []layout.Blob
	var ws []io.WriterAt
	var files []*os.File
	for _, p := range []string{"train/0.npy", "train/1.npy", "train/2.npy", "lsm.npy", "train/3.npy", "train/4.npy", "train/5.npy"} {
		blobs = append(blobs, mustLookup(t, l, p))
		f, err := os.Create(filepath.Join(t.TempDir(), "b"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
		ws = append(ws, f)
	}
	// Room for two samples per run: runs {0,1} {2} lsm {3,4} {5}.
	if err := fillRuns(f, l, blobs, ws, 2*(blobs[0].Size()-4096)); err != nil {
		t.Fatal(err)
	}
	if r.calls != 5 {
		t.Errorf("%d reads, want 5", r.calls)
	}
	for i, b := range blobs {
		want, _ := os.ReadFile(fillFile(t, f, l, b))
		got, _ := os.ReadFile(files[i].Name())
		if !bytes.Equal(got, want) {
			t.Errorf("%s: FillInto differs from Fill", b.Path())
		}
	}
	if err := f.FillInto(context.Background(), l, blobs, make([][]byte, 1), 0, nil); err == nil {
		t.Error("mismatched lengths accepted")
	}
}

// countingReader counts Read calls on the way to the hierarchy.
type countingReader struct {
	zarr.Reader
	calls int
}

func (c *countingReader) Read(ctx context.Context, pin *zarr.Pin, reqs []zarr.Request) error {
	c.calls++
	return c.Reader.Read(ctx, pin, reqs)
}

// TestViewDecodesEachChunkOnce fills every sample of a view over a store
// chunked 4 time steps x 3 levels and checks the zarr decode counter: each
// source chunk is decoded once for the whole run, however many channels and
// samples come from it.
func TestViewDecodesEachChunkOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "s.zarr")
	lin := func(shape []int64, base float64) func([]int64) float64 {
		return func(idx []int64) float64 {
			n := int64(0)
			for d := range idx {
				n = n*shape[d] + idx[d]
			}
			return base + float64(n)
		}
	}
	arrays := []storeArray{
		{Path: "t", DType: "float32", Shape: []int64{14, 3, 6, 7}, Chunks: []int64{4, 3, 6, 7}, Dims: []string{"time", "level", "latitude", "longitude"}, Value: lin([]int64{14, 3, 6, 7}, 0)},
		{Path: "u10", DType: "int16", Shape: []int64{14, 6, 7}, Chunks: []int64{4, 3, 7}, Dims: []string{"time", "latitude", "longitude"}, Value: lin([]int64{14, 6, 7}, -100)},
		{Path: "lsm", DType: "uint8", Shape: []int64{6, 7}, Chunks: []int64{6, 7}, Dims: []string{"latitude", "longitude"}, Value: func(i []int64) float64 { return float64(i[0] % 2) }},
		{Path: "level", DType: "float32", Shape: []int64{3}, Chunks: []int64{3}, Dims: []string{"level"}, Value: func(i []int64) float64 { return []float64{1000, 850, 500}[i[0]] }},
		{Path: "time", DType: "int64", Shape: []int64{14}, Chunks: []int64{14}, Dims: []string{"time"}, Value: func(i []int64) float64 { return float64(i[0]) * 3600 }},
	}
	viewtest.WriteStore(t, dir, arrays)
	text := `views:
  - name: v
    dtype: float32
    channels:
      - var: t
        select: {level: [0, 2]}
      - var: t
        select_values: {level: [850]}
      - var: u10
      - var: lsm
`
	specs, err := layout.ParseViews("v.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	// t: 4 time chunks; u10: 4 time chunks x 2 latitude chunks; lsm: 1.
	const sourceChunks = 4 + 8 + 1
	for _, mode := range []string{"sequential", "batch"} {
		t.Run(mode, func(t *testing.T) {
			h := viewtest.OpenStore(t, dir, zarr.Options{})
			views, err := layout.BindViews(context.Background(), h, specs, layout.BindOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v := views[0]
			if v.SampleCoords[13] != int64(13*3600) {
				t.Errorf("sample coords %v", v.SampleCoords)
			}
			cr := &countingReader{Reader: h}
			l, err := layout.Build(h, layout.Options{Views: views})
			fl := newFiller(t, Options{Reader: cr})
			if err != nil {
				t.Fatal(err)
			}
			before := h.Stats().ChunksDecoded.Load()
			d := mustDir(t, l, "v")
			var blobs []layout.Blob
			var ws []io.WriterAt
			var paths []string
			for i := 0; i < d.Len(); i++ {
				b := d.Entry(i).Blob
				p := filepath.Join(t.TempDir(), "x.npy")
				f, err := os.Create(p)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if mode == "sequential" {
					if err := fl.Fill(context.Background(), l, b, nil, f); err != nil {
						t.Fatal(err)
					}
				}
				blobs, ws, paths = append(blobs, b), append(ws, f), append(paths, p)
			}
			if mode == "batch" {
				if err := fillRuns(fl, l, blobs, ws, 0); err != nil {
					t.Fatal(err)
				}
				if cr.calls != 1 {
					t.Errorf("batch of %d samples took %d reads", len(blobs), cr.calls)
				}
			} else if cr.calls != len(blobs) {
				t.Errorf("%d samples took %d reads", len(blobs), cr.calls)
			}
			if got := h.Stats().ChunksDecoded.Load() - before; got != sourceChunks {
				t.Errorf("decoded %d chunks for %d samples, want each of the %d source chunks once", got, len(blobs), sourceChunks)
			}
			for k, p := range paths {
				data, _ := os.ReadFile(p)
				i := 0
				for c, ch := range v.Channels {
					start, count := ch.Region(int64(k))
					viewtest.ForEachIndex(start, count, func(idx []int64) {
						want := float32(arrays[map[string]int{"t": 0, "u10": 1, "lsm": 2}[ch.Var]].Value(idx))
						if g := math.Float32frombits(binary.LittleEndian.Uint32(data[4096+4*i:])); g != want {
							t.Fatalf("sample %d channel %d element %v = %v, want %v", k, c, idx, g, want)
						}
						i++
					})
				}
			}
		})
	}
}

func BenchmarkViewFill(b *testing.B) {
	h := viewtest.ViewHierarchy()
	specs, _ := layout.ParseViews("b.yaml", []byte(trainYAML))
	views, err := layout.BindViews(context.Background(), h, specs, layout.BindOptions{Reader: &valueReader{}})
	if err != nil {
		b.Fatal(err)
	}
	l, err := layout.Build(h, layout.Options{Views: views})
	fl := newFiller(b, Options{Reader: nopReader{}})
	if err != nil {
		b.Fatal(err)
	}
	blob := mustLookupB(b, l, "train/3.npy")
	w := discardWriterAt{}
	b.SetBytes(blob.Size())
	b.ReportAllocs()
	for b.Loop() {
		if err := fl.Fill(context.Background(), l, blob, nil, w); err != nil {
			b.Fatal(err)
		}
	}
}

type nopReader struct{}

type discardWriterAt struct{}

func mustLookupB(b *testing.B, l *layout.Layout, p string) layout.Blob {
	e, ok := l.Lookup(p)
	if !ok || e.Kind != layout.KindBlob {
		b.Fatalf("%s missing", p)
	}
	return e.Blob
}

// lendingMemory lends ordinary memory and counts what is out, standing in
// for the GPU decoder's pinned memory.
type lendingMemory struct {
	mu    sync.Mutex
	out   map[*byte]int // the bytes of each buffer out
	lends int
	held  int // the bytes out
	peak  int // the most bytes out at once
}

func (m *lendingMemory) HostAlloc(n int) []byte {
	b := make([]byte, n)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.out[&b[0]] = n
	m.lends++
	m.held += n
	m.peak = max(m.peak, m.held)
	return b
}

func (m *lendingMemory) HostFree(b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(b) > 0 {
		m.held -= m.out[&b[0]]
		delete(m.out, &b[0])
	}
}

// Retain holds nothing: fills never share a buffer.
func (m *lendingMemory) Retain([]byte) bool { return false }

// lendingReader is a Reader whose memory fills borrow, as a zarr
// Hierarchy with a GPU decoder is.
type lendingReader struct {
	zarr.Reader
	mem codec.HostMemory
}

func (r lendingReader) Memory() codec.HostMemory { return r.mem }

// TestFillLentMemory fills array samples, slabbed arrays and view samples
// (one by one and in FillInto runs) into lent memory: the bytes are those of a fill
// in ordinary memory, and every buffer comes back.
func TestFillLentMemory(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, trainYAML)
	if err != nil {
		t.Fatal(err)
	}
	mem := &lendingMemory{out: map[*byte]int{}}
	l, err := layout.Build(h, layout.Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	plain := newFiller(t, Options{Reader: &valueReader{}, SlabBytes: 64})
	lent := newFiller(t, Options{Reader: lendingReader{&valueReader{}, mem}, SlabBytes: 64})
	var blobs []layout.Blob
	var ws []io.WriterAt
	paths := []string{"train/0.npy", "train/1.npy", "lsm.npy"}
	for _, p := range paths {
		want, _ := os.ReadFile(fillFile(t, plain, l, mustLookup(t, l, p)))
		got, _ := os.ReadFile(fillFile(t, lent, l, mustLookup(t, l, p)))
		if !bytes.Equal(got, want) {
			t.Errorf("%s: fill into lent memory differs", p)
		}
		blobs = append(blobs, mustLookup(t, l, p))
		f, err := os.Create(filepath.Join(t.TempDir(), "b"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		ws = append(ws, f)
	}
	if err := fillRuns(lent, l, blobs, ws, 2*(blobs[0].Size()-4096)); err != nil {
		t.Fatal(err)
	}
	// The batch reads straight into its buffers: the fills lent them all.
	if mem.lends < len(paths) {
		t.Errorf("%d buffers lent for %d fills", mem.lends, len(paths))
	}
	if len(mem.out) != 0 {
		t.Errorf("%d of %d lent buffers not given back", len(mem.out), mem.lends)
	}
}

func (nopReader) Read(context.Context, *zarr.Pin, []zarr.Request) error { return nil }

func (discardWriterAt) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// Every sample of a view: one Read, the right bytes, the static channel
// read once over all of them.
func TestViewFill(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, trainYAML)
	if err != nil {
		t.Fatal(err)
	}
	v := views[0]
	l, err := layout.Build(h, layout.Options{Views: views, Align: 128})
	if err != nil {
		t.Fatal(err)
	}
	r := &valueReader{}
	f := newFiller(t, Options{Reader: r})
	// Every sample: one Read, the right bytes, the static channel read once.
	for k := range v.N {
		b := mustLookup(t, l, fmt.Sprintf("train/%d.npy", k))
		if b.Size() != 128+9*4*5*8 {
			t.Errorf("size %d", b.Size())
		}
		before := r.calls
		data, _ := os.ReadFile(fillFile(t, f, l, b))
		if r.calls != before+1 {
			t.Errorf("sample %d: %d reads, want 1", k, r.calls-before)
		}
		ph, err := layout.ParseNPYHeader(data)
		if err != nil || ph.Descr != "<f8" || !reflect.DeepEqual(ph.Shape, []int64{9, 4, 5}) || ph.DataOffset != 128 {
			t.Errorf("header %+v %v", ph, err)
		}
		exp := expectSample(v, k)
		for i, x := range exp {
			if g := math.Float64frombits(binary.LittleEndian.Uint64(data[128+8*i:])); g != x {
				t.Fatalf("sample %d element %d = %v, want %v", k, i, g, x)
			}
		}
		if len(b.Sources()) != 9 {
			t.Errorf("sources %d", len(b.Sources()))
		}
	}
	lsmReads := 0
	for _, q := range r.reqs {
		if q.Array.Path == "lsm" {
			lsmReads++
		}
	}
	if lsmReads != 1 {
		t.Errorf("static channel read %d times over %d samples", lsmReads, v.N)
	}
}

// A negative bound on a batch is refused, not taken for the default.
func TestBatchBoundRefused(t *testing.T) {
	h := viewtest.ViewHierarchy()
	views, err := bindYAML(t, h, trainYAML)
	if err != nil {
		t.Fatal(err)
	}
	l, err := layout.Build(h, layout.Options{Views: views})
	if err != nil {
		t.Fatal(err)
	}
	f := newFiller(t, Options{Reader: &valueReader{}})
	b := mustLookup(t, l, "train/0.npy")
	out := make([]byte, b.Size()-int64(len(b.Header())))
	if err := f.FillInto(context.Background(), l, []layout.Blob{b}, [][]byte{out}, -1, nil); err == nil {
		t.Error("FillInto with a negative bound accepted")
	}
}
