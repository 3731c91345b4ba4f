package cache

import (
	"bytes"
	"context"
	"os"
	"sync"
	"testing"
)

// Filling far more than the budget: the directory never holds more than
// the budget plus one blob, and usage accounting matches the disk.
func TestBudgetSequential(t *testing.T) {
	dir := t.TempDir()
	const budget = 64 << 10
	c := mustOpen(t, Options{Dir: dir, Size: budget})
	defer c.Close()
	const maxBlob = 12 << 10
	for i := range 200 {
		getBlob(t, c, key(i%150)) // some repeats: hits and refills
		disk, _ := diskUsage(t, dir)
		if disk > budget+maxBlob {
			t.Fatalf("after %d fills: %d bytes on disk, budget %d", i+1, disk, budget)
		}
		used, files := c.Usage()
		if d, f := diskUsage(t, dir); d != used || f != files {
			t.Fatalf("Usage = %d bytes %d files, disk has %d bytes %d files", used, files, d, f)
		}
	}
}

// The same with concurrent fills, sampled after each one completes.
func TestBudgetConcurrent(t *testing.T) {
	dir := t.TempDir()
	const budget = 64 << 10
	c := mustOpen(t, Options{Dir: dir, Size: budget})
	defer c.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var peak int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				getBlob(t, c, key(w*1000+i))
				d, _ := diskUsage(t, dir)
				mu.Lock()
				peak = max(peak, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Every fill reserves its size before it writes, so fills in flight
	// alone never push past the budget; but each worker holds its last blob
	// open while it checks it, and a pinned blob cannot make room. The
	// bound is the budget plus the blobs in flight (four workers).
	if peak > budget+4*12<<10 {
		t.Fatalf("peak %d bytes on disk, budget %d", peak, budget)
	}
	t.Logf("peak %d bytes on disk, budget %d", peak, budget)
}

// A blob held open survives eviction pressure: it is neither evicted nor
// unlinked, and reads correctly to the end. Once closed it can go.
func TestPinnedBlobSurvivesEviction(t *testing.T) {
	dir := t.TempDir()
	const budget = 40 << 10
	c := mustOpen(t, Options{Dir: dir, Size: budget})
	defer c.Close()
	k := BlobKey{Layout: "L", Path: "pinned.npy"}
	data := content("pinned", 16<<10)
	h, _, err := c.GetBlob(context.Background(), k, int64(len(data)), writeFill(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 4096)
	if _, err := h.File().ReadAt(first, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		getBlob(t, c, key(i))
		if _, err := os.Stat(c.BlobPath(k)); err != nil {
			t.Fatalf("pinned blob unlinked after %d fills: %v", i+1, err)
		}
	}
	rest := make([]byte, len(data)-4096)
	if _, err := h.File().ReadAt(rest, 4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(append(first, rest...), data) {
		t.Fatal("pinned blob read wrong bytes")
	}
	if !c.HasBlob(k) {
		t.Fatal("pinned blob no longer indexed")
	}
	h.Close()
	for i := range 100 {
		getBlob(t, c, key(1000+i))
	}
	if _, err := os.Stat(c.BlobPath(k)); !os.IsNotExist(err) {
		t.Fatalf("unpinned blob still there under pressure: %v", err)
	}
}

// Everything pinned: fills still succeed (a read must be served) and the
// excess goes as soon as the handles close.
func TestAllPinnedOvershootThenRecover(t *testing.T) {
	dir := t.TempDir()
	const budget = 20 << 10
	c := mustOpen(t, Options{Dir: dir, Size: budget})
	defer c.Close()
	var hs []*Handle
	for i := range 10 {
		p := key(i)
		data := content(p, sizeOf(p))
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: p}, int64(len(data)), writeFill(data), nil)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		h.Close()
	}
	if d, _ := diskUsage(t, dir); d > budget {
		t.Fatalf("%d bytes on disk after all handles closed, budget %d", d, budget)
	}
}

// A blob bigger than the whole budget is served, then dropped once closed.
func TestBlobLargerThanBudget(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir, Size: 1000})
	defer c.Close()
	data := content("big", 5000)
	h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "big.npy"}, 5000, writeFill(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, h), data) {
		t.Fatal("wrong contents")
	}
	h.Close()
	if d, _ := diskUsage(t, dir); d != 0 {
		t.Fatalf("%d bytes left on disk", d)
	}
}

// Stats counts hits, misses and evictions as they happen.
func TestStatsCounts(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir(), Size: int64(2*sizeOf(key(0)) + sizeOf(key(1)))})
	getBlob(t, c, key(0)) // miss
	getBlob(t, c, key(0)) // hit
	getBlob(t, c, key(1)) // miss
	getBlob(t, c, key(2)) // miss, evicts
	getBlob(t, c, key(3)) // miss, evicts
	s := c.Stats()
	if s.BlobHits != 1 || s.BlobMisses != 4 || s.Evictions < 1 || s.EvictedBytes < int64(sizeOf(key(0))) || s.Filling != 0 {
		t.Errorf("stats %+v", s)
	}
	tier := c.ChunkTier()
	tier.Get("k")
	tier.Put("k", []byte("chunk"))
	tier.Get("k")
	if s := c.Stats(); s.ChunkHits != 1 || s.ChunkMisses != 1 {
		t.Errorf("chunk stats %+v", s)
	}
}

// Eviction is least recently used, not first in: a blob read again (a
// hit) outlives blobs filled after it but not read since.
func TestHitMakesRecentlyUsed(t *testing.T) {
	data := bytes.Repeat([]byte{1}, 1000)
	c := mustOpen(t, Options{Dir: t.TempDir(), Size: 3500})
	defer c.Close()
	get := func(p string, fill bool) {
		t.Helper()
		h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: p}, int64(len(data)), func(ctx context.Context, f Writer) error {
			if !fill {
				t.Errorf("%s filled, want a hit", p)
			}
			return writeFill(data)(ctx, f)
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	}
	get("a.npy", true)
	get("b.npy", true)
	get("c.npy", true)
	get("a.npy", false) // a hit: a is now the most recently used
	get("d.npy", true)  // room for one more: the least recently used goes
	for p, want := range map[string]bool{"a.npy": true, "b.npy": false, "c.npy": true, "d.npy": true} {
		if got := c.HasBlob(BlobKey{Layout: "L", Path: p}); got != want {
			t.Errorf("HasBlob(%s) = %v, want %v", p, got, want)
		}
	}
}
