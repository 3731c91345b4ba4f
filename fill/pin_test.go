package fill

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/zarrfs/zarrfs/cache"
	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/internal/viewtest"
	"github.com/zarrfs/zarrfs/layout"
	"github.com/zarrfs/zarrfs/zarr"
)

// A chunk rewritten after a blob's identity was taken and before its fill
// reads it is never filled under the old identity: the fill reads under
// the pin of the versions the identity named, fails with ErrChanged, and
// Do fills again under the new identity with the new bytes. So it goes
// whether the lazy listing keeps the version it first answered or, past
// what it keeps (LazyVersions -1: none), asks the store again, when only
// the pin can tell.
func TestChangeBetweenIdentityAndFill(t *testing.T) {
	for _, keep := range []int{0, -1} {
		dir := t.TempDir()
		viewtest.WriteStore(t, dir, []storeArray{{Path: "t", DType: "float32", Shape: []int64{4, 2, 3}, Chunks: []int64{1, 2, 3},
			Dims: []string{"time", "latitude", "longitude"}, Value: func(idx []int64) float64 { return float64(idx[0]) }}})
		h := viewtest.OpenStore(t, dir, zarr.Options{ChunkCacheBytes: -1, LazyVersions: keep})
		l, err := layout.Build(h, layout.Options{})
		if err != nil {
			t.Fatal(err)
		}
		b := mustLookup(t, l, "t/1.npy")
		// The identity was taken, and the listing asked, before the rewrite.
		before, err := l.Identity(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		// The chunk is rewritten as the fill starts: after its identity
		// and pin were taken.
		var reads []error
		r := readerFunc(func(ctx context.Context, pin *zarr.Pin, reqs []zarr.Request) error {
			if len(reads) == 0 {
				viewtest.RewriteChunk(t, dir, "t/c/1/0/0", "t/c/3/0/0")
			}
			err := h.Read(ctx, pin, reqs)
			reads = append(reads, err)
			return err
		})
		c, err := cache.Open(cache.Options{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		bk, id, err := newFiller(t, Options{Cache: c, Reader: r}).Open(context.Background(), l, b)
		if err != nil || len(reads) != 2 || !errors.Is(reads[0], zarr.ErrChanged) {
			t.Fatalf("keep %d: Open: %v; reads %v, want ErrChanged then success", keep, err, reads)
		}
		defer bk.Close()
		if id == before {
			t.Errorf("keep %d: filled again under the old identity", keep)
		}
		data := make([]byte, 6*4)
		if _, err := bk.File().ReadAt(data, b.Size()-6*4); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			if v := math.Float32frombits(binary.LittleEndian.Uint32(data[i*4:])); v != 3 {
				t.Fatalf("keep %d: element %d is %v, want the new chunk's 3", keep, i, v)
			}
		}
		now, err := l.Identity(context.Background(), b)
		if err != nil || now != id {
			t.Errorf("keep %d: identity now %s (%v), the fill recorded %s", keep, now, err, id)
		}
		h.Close()
	}
}

// A view sample whose one Read would not fit the memory budget (chunks of
// one element: 4 KiB of bookkeeping each) is filled channel by channel in
// pieces, within the budget, with the bytes the one Read gives: a cast
// channel, a selected level and a static channel included.
func TestViewFillsByChannelPastTheBudget(t *testing.T) {
	dir := t.TempDir()
	viewtest.WriteStore(t, dir, []storeArray{
		{Path: "t", DType: "float32", Shape: []int64{2, 3, 24, 24}, Chunks: []int64{1, 1, 1, 1},
			Dims: []string{"time", "level", "y", "x"}, Value: func(i []int64) float64 { return float64(i[0]*10000 + i[1]*1000 + i[2]*24 + i[3]) }},
		{Path: "q", DType: "int16", Shape: []int64{2, 24, 24}, Chunks: []int64{1, 1, 1},
			Dims: []string{"time", "y", "x"}, Value: func(i []int64) float64 { return float64(-i[0]*100 - i[1]*24 - i[2]) }},
		{Path: "lsm", DType: "uint8", Shape: []int64{24, 24}, Chunks: []int64{1, 1},
			Dims: []string{"y", "x"}, Value: func(i []int64) float64 { return float64((i[0] + i[1]) % 2) }},
	})
	const view = "views:\n  - name: v\n    dtype: float32\n    channels:\n      - var: t\n        select: {level: 2}\n      - var: q\n      - var: lsm\n"
	fill := func(budget *memory.Budget) ([]byte, error) {
		h := viewtest.OpenStore(t, dir, zarr.Options{ChunkCacheBytes: -1})
		defer h.Close()
		l, views := buildViews(t, h, view, layout.Options{})
		b := mustLookup(t, l, "v/1.npy")
		if budget != nil && budget.Fits(fillCost(views[0], b.Size()-l.Align(), []int64{1})) {
			t.Fatal("the one Read fits the budget: the test proves nothing")
		}
		out := make(memWriter, b.Size())
		p, err := plan(context.Background(), l, b, false)
		if err != nil {
			t.Fatal(err)
		}
		err = newFiller(t, Options{MemoryBudget: budget}).Fill(context.Background(), l, b, p.Pin, out)
		if budget != nil && budget.Peak() > budget.Total() {
			t.Errorf("peak %d past the budget %d", budget.Peak(), budget.Total())
		}
		return out, err
	}
	want, err := fill(nil)
	if err != nil {
		t.Fatal(err)
	}
	budget := memory.New(1 << 20)
	got, err := fill(budget)
	if err != nil {
		t.Fatalf("fill within 1 MiB: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Error("filled by channel, the sample differs from the one Read's")
	}
	if budget.Peak() == 0 || budget.Used() != 0 {
		t.Errorf("budget peak %d, used %d after", budget.Peak(), budget.Used())
	}
}
