package fill

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// arrayCounter counts the requests of each array.
type arrayCounter struct {
	inner zarr.Reader
	mu    *sync.Mutex
	n     map[string]int
}

// Decoding counts the requests of a Reader decoding with d (inner's, a
// zarr.Redecoder) in the same counts.
func (c *arrayCounter) Decoding(d codec.BatchDecoder) zarr.Reader {
	return &arrayCounter{inner: c.inner.(zarr.Redecoder).Decoding(d), mu: c.mu, n: c.n}
}

func (c *arrayCounter) Read(ctx context.Context, pin *zarr.Pin, reqs []zarr.Request) error {
	c.mu.Lock()
	for _, q := range reqs {
		c.n[q.Array.Path]++
	}
	c.mu.Unlock()
	return c.inner.Read(ctx, pin, reqs)
}

// elsewhere is a decoder as a GPU filling a ring slot is: a chunk that
// lands whole in one of outs it writes somewhere else (here: nowhere; the
// buffer gets 0xee), any other it decodes on the CPU.
type elsewhere struct{ outs [][]byte }

func (e elsewhere) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	for i := range jobs {
		j := &jobs[i]
		if e.inOuts(j.Dst) {
			for k := range j.Dst {
				j.Dst[k] = 0xee
			}
			continue
		}
		j.Err = codec.Decode(j.Codec, j.Dst, j.Src)
	}
	return nil
}

func (e elsewhere) inOuts(b []byte) bool {
	for _, o := range e.outs {
		at, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(o)))
		if len(b) > 0 && at >= lo && at < lo+uintptr(len(o)) {
			return true
		}
	}
	return false
}

// FillInto writes a view's samples as Fill does and reads nothing back
// from its buffers, which its decoder may not write (a GPU decoding into
// a ring slot): a static channel is read once, into memory of the fill's
// own, copied into every sample from there and kept as the view's memo,
// which later fills (FillInto's and Fill's) copy instead of reading it.
func TestFillIntoReadsNothingBack(t *testing.T) {
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, []storeArray{
		{Path: "t", DType: "float32", Shape: []int64{4, 2, 3}, Chunks: []int64{1, 2, 3}, Dims: []string{"time", "latitude", "longitude"},
			Value: func(idx []int64) float64 { return float64(idx[0]*10 + idx[1]) }},
		{Path: "lsm", DType: "float32", Shape: []int64{2, 3}, Chunks: []int64{2, 3}, Dims: []string{"latitude", "longitude"},
			Value: func(idx []int64) float64 { return float64(idx[1]) + 0.5 }},
	})
	h := viewtest.OpenStore(t, dir, zarr.Options{ChunkCacheBytes: -1})
	defer h.Close()
	cr := &arrayCounter{inner: h, mu: &sync.Mutex{}, n: map[string]int{}}
	l, views := buildViews(t, h, "views:\n  - name: v\n    channels:\n      - var: t\n      - var: lsm\n", layout.Options{})
	f := newFiller(t, Options{Reader: cr})
	var blobs []layout.Blob
	for k := range 3 {
		blobs = append(blobs, mustDir(t, l, "v").SampleEntry(int64(k)).Blob)
	}
	size := blobs[0].Size() - int64(len(blobs[0].Header()))
	const per = 2 * 3 * 4 // the static channel (1) of a sample
	static := make([]byte, per)
	for i := range 6 {
		binary.LittleEndian.PutUint32(static[4*i:], math.Float32bits(float32(i%3)+0.5))
	}
	into := func() [][]byte {
		outs := make([][]byte, len(blobs))
		for i := range outs {
			outs[i] = make([]byte, size)
		}
		if err := f.FillInto(context.Background(), l, blobs, outs, 0, elsewhere{outs}); err != nil {
			t.Fatal(err)
		}
		return outs
	}
	outs := into()
	if cr.n["lsm"] != 1 {
		t.Fatalf("the static channel was read %d times for 3 samples, want once", cr.n["lsm"])
	}
	for i := range blobs {
		if got := outs[i][per : 2*per]; !bytes.Equal(got, static) {
			t.Fatalf("sample %d: static channel % x, want % x", i, got, static)
		}
		if bytes.Count(outs[i][:per], []byte{0xee}) != per {
			t.Fatalf("sample %d: the time channel's chunk was not decoded elsewhere", i)
		}
	}
	memo, _ := views[0].Static(nil)
	if !bytes.Equal(memo[1], static) {
		t.Fatalf("FillInto kept % x as the static channel's memo, want % x", memo[1], static)
	}
	clear(cr.n)
	outs = into()
	if cr.n["lsm"] != 0 || !bytes.Equal(outs[2][per:2*per], static) {
		t.Fatalf("with a memo: static channel read %d times, bytes equal %v", cr.n["lsm"], bytes.Equal(outs[2][per:2*per], static))
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

// levelStore is a store of 3 time steps of r, 4 levels of 64x64 float32
// (a chunk a level), and s, one level of them, and its layout with the
// view v of s and every level of r.
func levelStore(t *testing.T) (*zarr.Hierarchy, *layout.Layout) {
	t.Helper()
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, []storeArray{
		{Path: "r", DType: "float32", Shape: []int64{3, 4, 64, 64}, Chunks: []int64{1, 1, 64, 64}, Dims: []string{"time", "level", "y", "x"}, Value: noise},
		{Path: "s", DType: "float32", Shape: []int64{3, 64, 64}, Chunks: []int64{1, 64, 64}, Dims: []string{"time", "y", "x"}, Value: noise},
	})
	h := viewtest.OpenStore(t, dir, zarr.Options{ChunkCacheBytes: -1})
	t.Cleanup(func() { h.Close() })
	l, _ := buildViews(t, h, "views:\n  - name: v\n    channels:\n      - var: s\n      - var: r\n        select: {level: all}\n", layout.Options{})
	return h, l
}

// chunk is a chunk's bytes in levelStore.
const chunk = 64 * 64 * 4

// A view's sample too large for one Read is filled by FillInto channel by
// channel, within the budget, as Fill fills it; a channel of one piece in
// its own type is read straight into the caller's buffer, where the
// decoder may put its chunks elsewhere (nothing is read back).
func TestFillIntoByChannelInPlace(t *testing.T) {
	h, l := levelStore(t)
	budget := memory.New(4 * chunk)
	f := newFiller(t, Options{Reader: h, MemoryBudget: budget, SlabBytes: chunk})
	b := mustDir(t, l, "v").SampleEntry(1).Blob
	data := b.Size() - int64(len(b.Header()))
	if budget.Fits(fillCost(b.(*layout.ViewBlob).View(), data, []int64{1})) {
		t.Fatal("the one Read fits the budget: the test proves nothing")
	}
	want := &bufAt{}
	if err := f.Fill(context.Background(), l, b, nil, want); err != nil {
		t.Fatal(err)
	}
	outs := [][]byte{make([]byte, data)}
	if err := f.FillInto(context.Background(), l, []layout.Blob{b}, outs, 0, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(outs[0], want.b[len(b.Header()):]) {
		t.Fatal("filled by channel into the buffer, the sample differs from Fill's")
	}
	if err := f.FillInto(context.Background(), l, []layout.Blob{b}, outs, 0, elsewhere{outs}); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(outs[0], []byte{0xee}); n != len(outs[0]) {
		t.Fatalf("%d of the sample's %d bytes were decoded elsewhere, want every channel's", n, len(outs[0]))
	}
	if budget.Peak() > budget.Total() || budget.Used() != 0 {
		t.Fatalf("budget peak %d of %d, %d used after", budget.Peak(), budget.Total(), budget.Used())
	}
}

// An array's sample larger than a piece (r: 4 levels, a chunk a level,
// in pieces of one chunk) is read by FillInto piece by piece straight into
// the caller's buffer: the bytes are Fill's, no piece buffer is lent, and
// every chunk, landing whole there, may be decoded elsewhere (a GPU into a
// ring slot). One whose pieces do not land there as one run each (q:
// chunks of 2 levels x 16 rows, in pieces of 2 levels x 32 rows) is read
// through a piece buffer, and comes out as Fill writes it whatever the
// decoder.
func TestFillIntoPiecesInPlace(t *testing.T) {
	dir := t.TempDir()
	dims := []string{"time", "level", "y", "x"}
	viewtest.WriteStore(t, dir, []storeArray{
		{Path: "r", DType: "float32", Shape: []int64{3, 4, 64, 64}, Chunks: []int64{1, 1, 64, 64}, Dims: dims, Value: noise},
		{Path: "q", DType: "float32", Shape: []int64{3, 4, 64, 64}, Chunks: []int64{1, 2, 16, 64}, Dims: dims, Value: noise},
	})
	h := viewtest.OpenStore(t, dir, zarr.Options{ChunkCacheBytes: -1})
	defer h.Close()
	l, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir    string
		pieces int
		slab   bool
	}{{"r", 4, false}, {"q", 4, true}} {
		t.Run(tc.dir, func(t *testing.T) {
			mem := &lendingMemory{out: map[*byte]int{}}
			cr := &arrayCounter{inner: h, mu: &sync.Mutex{}, n: map[string]int{}}
			f := newFiller(t, Options{Reader: cr, SlabBytes: chunk, Memory: mem})
			b := mustDir(t, l, tc.dir).SampleEntry(1).Blob
			want := &bufAt{}
			if err := f.Fill(context.Background(), l, b, nil, want); err != nil {
				t.Fatal(err)
			}
			if cr.n[tc.dir] != tc.pieces {
				t.Fatalf("Fill read the sample in %d pieces, want %d", cr.n[tc.dir], tc.pieces)
			}
			mem.lends = 0
			out := make([]byte, b.Size()-int64(len(b.Header())))
			if err := f.FillInto(context.Background(), l, []layout.Blob{b}, [][]byte{out}, 0, nil); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, want.b[len(b.Header()):]) || (mem.lends > 0) != tc.slab {
				t.Fatalf("FillInto's bytes equal Fill's: %v; %d piece buffers lent (want some: %v)", bytes.Equal(out, want.b[len(b.Header()):]), mem.lends, tc.slab)
			}
			clear(out)
			if err := f.FillInto(context.Background(), l, []layout.Blob{b}, [][]byte{out}, 0, elsewhere{[][]byte{out}}); err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(out, []byte{0xee}); !tc.slab && n != len(out) {
				t.Fatalf("%d of the sample's %d bytes were decoded elsewhere, want all", n, len(out))
			}
			if tc.slab && !bytes.Equal(out, want.b[len(b.Header()):]) {
				t.Fatal("read through a piece buffer with a decoder that puts chunks landing in the buffer elsewhere, the sample differs from Fill's")
			}
			if len(mem.out) != 0 {
				t.Fatalf("%d lent buffers not given back", len(mem.out))
			}
		})
	}
}

// A region's edge pieces are charged what they hold: a sample of 5 levels
// chunked 2 levels a chunk, in pieces of 2 levels, ends in a piece of one
// level whose chunk (levels 4-5, past the array's edge) does not land whole
// in it and is decoded into a buffer of its own. The budget counts at
// least what the fill's lenders hand out at once, by Fill and by FillInto.
func TestFillEdgePieceCharged(t *testing.T) {
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, []storeArray{
		{Path: "e", DType: "float32", Shape: []int64{3, 5, 64, 64}, Chunks: []int64{1, 2, 64, 64}, Dims: []string{"time", "level", "y", "x"}, Value: noise},
	})
	mem := &lendingMemory{out: map[*byte]int{}}
	h := viewtest.OpenStore(t, dir, zarr.Options{ChunkCacheBytes: -1, Memory: mem, Host: mem})
	defer h.Close()
	l, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustDir(t, l, "e").SampleEntry(1).Blob
	out := make([]byte, b.Size()-int64(len(b.Header())))
	for _, into := range []bool{false, true} {
		budget := memory.New(1 << 30)
		cr := &arrayCounter{inner: h, mu: &sync.Mutex{}, n: map[string]int{}}
		f := newFiller(t, Options{Reader: lendingReader{cr, mem}, MemoryBudget: budget, SlabBytes: 2 * chunk, Memory: mem})
		mem.peak = 0
		if into {
			err = f.FillInto(context.Background(), l, []layout.Blob{b}, [][]byte{out}, 0, nil)
		} else {
			err = f.Fill(context.Background(), l, b, nil, &bufAt{})
		}
		if err != nil {
			t.Fatal(err)
		}
		name := map[bool]string{false: "Fill", true: "FillInto"}[into]
		if cr.n["e"] != 3 {
			t.Fatalf("%s read the sample in %d pieces, want 3 (levels 0-2, 2-4, 4)", name, cr.n["e"])
		}
		if int64(mem.peak) > budget.Peak() || len(mem.out) != 0 {
			t.Fatalf("%s: lenders handed out %d bytes at once, the budget counted %d at most; %d buffers not given back", name, mem.peak, budget.Peak(), len(mem.out))
		}
	}
}

// drainer is a FillInto decoder as a ring slot's is (Drainer): it decodes
// on the CPU, and at each Drain records the run and what the budget
// counts then.
type drainer struct {
	budget *memory.Budget
	outs   [][]byte
	runs   []string
	// need is, per blob, the least the budget must count while a run of
	// that blob alone is drained (nil: its bytes).
	need  []int64
	short int64 // the most bytes of what a run needs that the budget did not count at its Drain
	most  int64 // the most the budget counted at a Drain
	// over is the most the budget counted before a Drain past the most it
	// counted at the Drains up to it: what a run acquired while it held
	// its charge.
	over int64
}

func (d *drainer) DecodeBatch(ctx context.Context, jobs []codec.Job) error {
	return codec.Inline{}.DecodeBatch(ctx, jobs)
}

func (d *drainer) Drain(_ context.Context, i, j int) error {
	var n int64
	for _, o := range d.outs[i:j] {
		n += int64(len(o))
	}
	if j == i+1 && d.need != nil {
		n = d.need[i]
	}
	used := d.budget.Used()
	d.short, d.most = max(d.short, n-used), max(d.most, used)
	d.over = max(d.over, d.budget.Peak()-d.most)
	d.runs = append(d.runs, fmt.Sprintf("%d-%d", i, j))
	return nil
}

// FillInto with a Drainer counts every sample's bytes in the memory
// budget until its run is drained, an array's samples read in pieces
// (whose fill alone holds less than the sample) as a view's, acquiring
// each run's memory in one call and nothing while it holds it; samples
// come out as Fill writes them. A sample whose bytes and fill together
// pass the whole budget fails at once, naming it, though a Fill of it
// alone fits.
func TestFillIntoDrainsCounted(t *testing.T) {
	h, l := levelStore(t)
	budget := memory.New(1 << 30)
	// Pieces of one chunk: an array's sample is read in 4.
	f := newFiller(t, Options{Reader: h, MemoryBudget: budget, SlabBytes: chunk})
	sample := func(d string, k int64) layout.Blob { return mustDir(t, l, d).SampleEntry(k).Blob }
	blobs := []layout.Blob{sample("r", 0), sample("r", 1), sample("v", 0), sample("v", 1), sample("v", 2), sample("r", 2)}
	d := &drainer{budget: budget}
	for _, b := range blobs {
		data := b.Size() - int64(len(b.Header()))
		d.outs = append(d.outs, make([]byte, data))
		// An array's sample is read straight into its bytes, piece by
		// piece: what a FillInto of it alone holds (its pieces' reads),
		// and its bytes.
		fb := memory.New(1 << 30)
		alone := [][]byte{make([]byte, data)}
		if err := newFiller(t, Options{Reader: h, MemoryBudget: fb, SlabBytes: chunk}).FillInto(context.Background(), l, []layout.Blob{b}, alone, 0, nil); err != nil {
			t.Fatal(err)
		}
		d.need = append(d.need, data+fb.Peak())
	}
	if err := f.FillInto(context.Background(), l, blobs, d.outs, 0, d); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(d.runs) != "[0-1 1-2 2-5 5-6]" {
		t.Fatalf("runs drained %v, want each array sample alone and the view's three together, in order", d.runs)
	}
	if d.short != 0 {
		t.Fatalf("a run was drained with %d bytes of what it holds (its samples; an array's, and what its fill holds) not counted in the budget", d.short)
	}
	if d.over != 0 || budget.Used() != 0 {
		t.Fatalf("a run acquired %d bytes more while it held its charge; the budget counts %d after the fill", d.over, budget.Used())
	}
	for i, b := range blobs {
		w := &bufAt{}
		if err := f.Fill(context.Background(), l, b, nil, w); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(d.outs[i], w.b[len(b.Header()):]) {
			t.Fatalf("%s: FillInto's bytes differ from Fill's", b.Path())
		}
	}

	// A budget of one sample: a Fill of it fits, its bytes and fill do not.
	f = newFiller(t, Options{Reader: h, MemoryBudget: memory.New(4 * chunk), SlabBytes: chunk})
	b := sample("r", 0)
	if err := f.Fill(context.Background(), l, b, nil, &bufAt{}); err != nil {
		t.Fatalf("a Fill within the budget: %v", err)
	}
	d = &drainer{outs: [][]byte{make([]byte, 4*chunk)}}
	err := f.FillInto(context.Background(), l, []layout.Blob{b}, d.outs, 0, d)
	if !errors.Is(err, memory.ErrExceeded) || !strings.HasPrefix(err.Error(), "r/0.npy: ") || len(d.runs) != 0 {
		t.Fatalf("a sample past the budget with its fill: %v (runs drained %v)", err, d.runs)
	}
}

// readCounter counts the Reads of a Reader and their requests.
type readCounter struct {
	inner       zarr.Reader
	reads, reqs int
}

func (c *readCounter) Decoding(d codec.BatchDecoder) zarr.Reader {
	return &readCounter{inner: c.inner.(zarr.Redecoder).Decoding(d)}
}

func (c *readCounter) Read(ctx context.Context, pin *zarr.Pin, reqs []zarr.Request) error {
	c.reads++
	c.reqs += len(reqs)
	return c.inner.Read(ctx, pin, reqs)
}

// An array's samples that each fit one piece are read by FillInto in runs,
// one Read a run of one array, as a view's are: a chunk of several steps
// that a run's samples share is decoded once. A run ends at another
// array's sample, at maxBytes, and where twice what it holds would pass
// the memory budget; the bytes are Fill's either way.
func TestFillIntoArrayRuns(t *testing.T) {
	dir := t.TempDir()
	dims := []string{"time", "y", "x"}
	viewtest.WriteStore(t, dir, []storeArray{
		{Path: "a", DType: "float32", Shape: []int64{6, 8, 16}, Chunks: []int64{3, 8, 16}, Dims: dims, Value: noise},
		{Path: "b", DType: "float32", Shape: []int64{6, 8, 16}, Chunks: []int64{1, 8, 16}, Dims: dims, Value: noise},
	})
	stats := &zarr.Stats{}
	h := viewtest.OpenStore(t, dir, zarr.Options{ChunkCacheBytes: -1, Stats: stats})
	defer h.Close()
	l, err := layout.Build(h, layout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sample := func(p string, k int64) layout.Blob { return mustDir(t, l, p).SampleEntry(k).Blob }
	const data = 8 * 16 * 4
	for _, tc := range []struct {
		name         string
		blobs        []layout.Blob
		maxBytes     int64
		budget       int64
		reads, chunk int64 // Reads, and chunks decoded
	}{
		{"one run", []layout.Blob{sample("a", 0), sample("a", 1), sample("a", 2), sample("a", 3), sample("a", 4), sample("a", 5)}, 0, 0, 1, 2},
		{"two arrays", []layout.Blob{sample("a", 0), sample("a", 1), sample("b", 0), sample("b", 1), sample("a", 2)}, 0, 0, 3, 4},
		{"maxBytes", []layout.Blob{sample("a", 0), sample("a", 1), sample("a", 2), sample("a", 3)}, 2 * data, 0, 2, 3},
		// A sample holds about 7 KiB (its chunk of 3 steps, decoded and
		// compressed): twice a run of 2 fits 32 KiB, of 3 does not.
		{"budget", []layout.Blob{sample("a", 0), sample("a", 1), sample("a", 2)}, 0, 32 << 10, 2, 2},
		{"small budget", []layout.Blob{sample("a", 0), sample("a", 1), sample("a", 2)}, 0, 10 << 10, 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cr := &readCounter{inner: h}
			o := Options{Reader: cr}
			if tc.budget > 0 {
				o.MemoryBudget = memory.New(tc.budget)
			}
			f := newFiller(t, o)
			outs := make([][]byte, len(tc.blobs))
			for i := range outs {
				outs[i] = make([]byte, data)
			}
			before := stats.ChunksDecoded.Load()
			if err := f.FillInto(context.Background(), l, tc.blobs, outs, tc.maxBytes, nil); err != nil {
				t.Fatal(err)
			}
			if got := stats.ChunksDecoded.Load() - before; int64(cr.reads) != tc.reads || got != tc.chunk {
				t.Fatalf("%d Reads of %d requests, %d chunks decoded; want %d and %d", cr.reads, cr.reqs, got, tc.reads, tc.chunk)
			}
			for i, b := range tc.blobs {
				want := &bufAt{}
				if err := newFiller(t, Options{}).Fill(context.Background(), l, b, nil, want); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(outs[i], want.b[len(b.Header()):]) {
					t.Fatalf("%s differs from Fill's bytes", b.Path())
				}
			}
		})
	}
}
