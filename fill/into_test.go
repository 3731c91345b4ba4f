package fill

import (
	"github.com/zarrfs/zarrfs/internal/viewtest"

	"bytes"
	"context"
	"encoding/binary"
	"math"
	"sync"
	"testing"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
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
