package layout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/zarrfs/zarrfs/internal/memory"
	"github.com/zarrfs/zarrfs/zarr"
)

// rewriteChunk gives the chunk file at rel (below dir) the bytes of the
// one at from: a new file, dated an hour ahead, so a new version.
func rewriteChunk(t *testing.T, dir, rel, from string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, from))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, rel)
	os.Remove(p)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(p, later, later)
}

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
		writeStore(t, dir, []storeArray{{path: "t", dtype: "float32", shape: []int64{4, 2, 3}, chunks: []int64{1, 2, 3},
			dims: []string{"time", "latitude", "longitude"}, value: func(idx []int64) float64 { return float64(idx[0]) }}})
		h := openStore(t, dir, zarr.Options{ChunkCacheBytes: -1, LazyVersions: keep})
		l, err := Build(h, Options{})
		if err != nil {
			t.Fatal(err)
		}
		b := mustLookup(t, l, "t/1.npy")
		// The identity was taken, and the listing asked, before the rewrite.
		if _, err := l.Identity(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		var idents []string
		var fills []error
		out := make(memWriter, b.Size())
		err = l.Do(context.Background(), b, func(ctx context.Context, ident string) error {
			idents = append(idents, ident)
			if len(idents) == 1 {
				rewriteChunk(t, dir, "t/c/1/0/0", "t/c/3/0/0")
			}
			err := b.Fill(ctx, out)
			fills = append(fills, err)
			return err
		})
		if err != nil || len(fills) != 2 || !errors.Is(fills[0], zarr.ErrChanged) {
			t.Fatalf("keep %d: Do: %v; fills %v, want ErrChanged then success", keep, err, fills)
		}
		if idents[0] == idents[1] {
			t.Errorf("keep %d: filled again under the old identity", keep)
		}
		data := out[len(out)-6*4:]
		for i := range 6 {
			if v := math.Float32frombits(binary.LittleEndian.Uint32(data[i*4:])); v != 3 {
				t.Fatalf("keep %d: element %d is %v, want the new chunk's 3", keep, i, v)
			}
		}
		now, err := l.Identity(context.Background(), b)
		if err != nil || now != idents[1] {
			t.Errorf("keep %d: identity now %s (%v), the fill recorded %s", keep, now, err, idents[1])
		}
		h.Close()
	}
}

// An identity names a region's chunks in sorted key order, as it always
// has, though it walks them one at a time: chunk coordinates of one, two
// and three digits ("10" sorts before "2") give the hash of the sorted
// keys and their versions, so that blobs cached by an earlier release
// keep their identity.
func TestIdentityNamesChunksSorted(t *testing.T) {
	dir := t.TempDir()
	writeStore(t, dir, []storeArray{{path: "s", dtype: "uint8", shape: []int64{2, 3, 120}, chunks: []int64{1, 1, 1},
		dims: []string{"time", "y", "x"}, value: func(idx []int64) float64 { return float64(idx[2]) }}})
	os.Remove(filepath.Join(dir, "s", "c", "1", "2", "7")) // one missing: "absent"
	h := openStore(t, dir, zarr.Options{})
	defer h.Close()
	l, err := Build(h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := mustLookup(t, l, "s/1.npy")
	got, err := l.Identity(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	src := b.Sources()[0]
	keys := src.Array.RegionChunks(src.Start, src.Count)
	if !sort.StringsAreSorted(keys) || len(keys) != 360 {
		t.Fatalf("%d keys", len(keys))
	}
	want := sha256.New()
	io.WriteString(want, layoutVersion)
	want.Write([]byte{0})
	io.WriteString(want, b.Inputs())
	lst := src.Array.Listing()
	for _, k := range keys {
		v, ok, err := lst.Version(k)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			v = "absent"
		}
		want.Write([]byte{0})
		io.WriteString(want, k)
		want.Write([]byte{0})
		io.WriteString(want, v)
	}
	if w := hex.EncodeToString(want.Sum(nil))[:32]; got != w {
		t.Errorf("identity %s, want %s (the sorted keys')", got, w)
	}
}

// A view sample whose one Read would not fit the memory budget (chunks of
// one element: 4 KiB of bookkeeping each) is filled channel by channel in
// pieces, within the budget, with the bytes the one Read gives: a cast
// channel, a selected level and a static channel included.
func TestViewFillsByChannelPastTheBudget(t *testing.T) {
	dir := t.TempDir()
	writeStore(t, dir, []storeArray{
		{path: "t", dtype: "float32", shape: []int64{2, 3, 24, 24}, chunks: []int64{1, 1, 1, 1},
			dims: []string{"time", "level", "y", "x"}, value: func(i []int64) float64 { return float64(i[0]*10000 + i[1]*1000 + i[2]*24 + i[3]) }},
		{path: "q", dtype: "int16", shape: []int64{2, 24, 24}, chunks: []int64{1, 1, 1},
			dims: []string{"time", "y", "x"}, value: func(i []int64) float64 { return float64(-i[0]*100 - i[1]*24 - i[2]) }},
		{path: "lsm", dtype: "uint8", shape: []int64{24, 24}, chunks: []int64{1, 1},
			dims: []string{"y", "x"}, value: func(i []int64) float64 { return float64((i[0] + i[1]) % 2) }},
	})
	const view = "views:\n  - name: v\n    dtype: float32\n    channels:\n      - var: t\n        select: {level: 2}\n      - var: q\n      - var: lsm\n"
	fill := func(budget *memory.Budget) ([]byte, error) {
		h := openStore(t, dir, zarr.Options{ChunkCacheBytes: -1})
		defer h.Close()
		l, views := buildViews(t, h, view, Options{MemoryBudget: budget})
		b := mustLookup(t, l, "v/1.npy")
		if budget != nil && budget.Fits(views[0].fillCost(b.Size()-l.opts.Align, []int64{1})) {
			t.Fatal("the one Read fits the budget: the test proves nothing")
		}
		out := make(memWriter, b.Size())
		err := l.Do(context.Background(), b, func(ctx context.Context, _ string) error { return b.Fill(ctx, out) })
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
