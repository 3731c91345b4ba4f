package cache

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// GetInto reads a chunk into the caller's memory, asked for at the chunk's
// size and only when the tier holds it (the same memory, no copy after
// the read), checked: damage is a miss that drops the file, counted, and
// memory too small is not used.
func TestChunkTierGetInto(t *testing.T) {
	dir := t.TempDir()
	c := mustOpen(t, Options{Dir: dir})
	defer c.Close()
	tier := c.ChunkTier()
	const k = "file:///store\x00t/c/0/0\x00v1"
	data := content(k, 70000)
	var asked []int
	var buf []byte
	alloc := func(n int) []byte {
		asked = append(asked, n)
		buf = make([]byte, n)
		return buf
	}
	if got, ok := tier.GetInto(k, alloc); ok || len(asked) != 0 {
		t.Fatalf("a miss: %d bytes, %v, memory asked for %v", len(got), ok, asked)
	}
	tier.Put(k, data)
	got, ok := tier.GetInto(k, alloc)
	if !ok || !bytes.Equal(got, data) {
		t.Fatalf("GetInto: %v", ok)
	}
	if len(asked) != 1 || asked[0] != len(data) {
		t.Errorf("memory asked for %v, want once, %d bytes", asked, len(data))
	}
	if &got[0] != &buf[0] {
		t.Error("GetInto did not read into the caller's memory")
	}
	small := func(int) []byte { return make([]byte, 100) }
	if got, ok := tier.GetInto(k, small); !ok || !bytes.Equal(got, data) {
		t.Fatalf("GetInto with too little memory: %v", ok)
	}

	// Flip one byte of the file: the next read is a miss, never the
	// damaged bytes, and the file is gone from the tier.
	p := filepath.Join(dir, chunkRel(k))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[12345] ^= 0x01
	if err := os.WriteFile(p, b, 0o400); err != nil {
		t.Fatal(err)
	}
	before := c.Stats()
	if got, ok := tier.GetInto(k, alloc); ok {
		t.Fatalf("a damaged chunk was served (%d bytes)", len(got))
	}
	s := c.Stats()
	if s.ChunkDamaged != before.ChunkDamaged+1 || s.ChunkMisses != before.ChunkMisses+1 {
		t.Errorf("damage not counted: %+v", s)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("the damaged chunk file is still there: %v", err)
	}
	if u := c.TierUsage(); u.Chunks != 0 || u.ChunkBytes != 0 {
		t.Errorf("after the damaged chunk was dropped: %+v", u)
	}
	tier.Put(k, data) // fetched again and stored
	if got, ok := tier.GetInto(k, alloc); !ok || !bytes.Equal(got, data) {
		t.Fatal("the chunk stored again is not served")
	}
}

// A read-only tier serves what the cache holds and stores nothing.
func TestChunkTierReadOnly(t *testing.T) {
	c := mustOpen(t, Options{Dir: t.TempDir()})
	defer c.Close()
	ro := c.ChunkTier().ReadOnly()
	ro.Put("a", []byte("aaaa"))
	if _, ok := ro.Get("a"); ok {
		t.Fatal("a read-only tier stored a chunk")
	}
	c.ChunkTier().Put("a", []byte("aaaa"))
	if b, ok := ro.Get("a"); !ok || string(b) != "aaaa" {
		t.Fatalf("a read-only tier does not serve what the cache holds: %q %v", b, ok)
	}
	if s := c.Stats(); s.ChunkStores != 1 || s.ChunkStoredBytes != 4 {
		t.Errorf("stores %d (%d bytes), want 1 (4)", s.ChunkStores, s.ChunkStoredBytes)
	}
}

// TierUsage splits what the cache holds between the tiers, for this
// instance and what another instance sharing the directory logged; both
// tiers share one budget, evicted in one least-recently-used order.
func TestTierUsageAndSharedEviction(t *testing.T) {
	dir := t.TempDir()
	blobs := int64(sizeOf(key(0)) + sizeOf(key(1)))
	const chunk = 3000
	budget := blobs + 2*chunk
	c := mustOpen(t, Options{Dir: dir, Size: budget})
	defer c.Close()
	tier := c.ChunkTier()
	getBlob(t, c, key(0))
	tier.Put("c0", content("c0", chunk))
	getBlob(t, c, key(1))
	tier.Put("c1", content("c1", chunk))
	u := c.TierUsage()
	if u.Blobs != 2 || u.Chunks != 2 || u.BlobBytes != blobs || u.ChunkBytes != 2*chunk {
		t.Fatalf("usage %+v", u)
	}
	// The budget is full: a chunk evicts the least recently used entry
	// (blob 0), then a blob the next ones (chunk c0, blob 1), whatever
	// their tier.
	tier.Put("c2", content("c2", chunk))
	if c.HasBlob(BlobKey{Layout: "L", Path: key(0)}) || !c.HasBlob(BlobKey{Layout: "L", Path: key(1)}) {
		t.Error("a chunk's store did not evict the least recently used blob")
	}
	if _, ok := tier.Get("c1"); !ok { // c1 is now the most recent
		t.Fatal("c1 evicted")
	}
	// As large as blob 0: room for it needs the room of one chunk more.
	big := content("big", sizeOf(key(0)))
	h, _, err := c.GetBlob(context.Background(), BlobKey{Layout: "L", Path: "big.npy"}, int64(len(big)), writeFill(big), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	if !c.HasBlob(BlobKey{Layout: "L", Path: key(1)}) {
		t.Error("blob 1 evicted before the older chunk c0")
	}
	if _, ok := tier.Get("c0"); ok {
		t.Error("a blob's fill did not evict the least recently used chunk")
	}
	s := c.Stats()
	if s.ChunkEvictions < 1 || s.Evictions <= s.ChunkEvictions {
		t.Errorf("evictions %d, of chunks %d: want both tiers evicted", s.Evictions, s.ChunkEvictions)
	}
	used, files := c.Usage()
	u = c.TierUsage()
	if used > budget || u.BlobBytes+u.ChunkBytes != used || u.Blobs+u.Chunks != files {
		t.Errorf("usage %d bytes in %d files, tiers %+v, budget %d", used, files, u, budget)
	}
	// Another instance sees the same split.
	o := mustOpen(t, Options{Dir: dir, Size: budget})
	defer o.Close()
	if ou := o.TierUsage(); ou != u {
		t.Errorf("another instance: %+v, want %+v", ou, u)
	}
	o.ChunkTier().Put("c9", content("c9", 10))
	if nu := c.TierUsage(); nu.ChunkBytes < u.ChunkBytes+10-chunk || nu.Chunks < 1 {
		t.Errorf("after another instance stored a chunk: %+v", nu)
	}
}

// Chunk files are read-only to their owner, as blobs are, and stay
// owner-only when blobs are shared.
func TestChunkFileMode(t *testing.T) {
	withUmask(t, 0)
	for _, mode := range []uint32{0, 0o444} {
		dir := t.TempDir()
		c := mustOpen(t, Options{Dir: dir, BlobMode: os.FileMode(mode)})
		c.ChunkTier().Put("k", []byte("chunk bytes"))
		fi, err := os.Stat(filepath.Join(dir, chunkRel("k")))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o400 {
			t.Errorf("blob mode %04o: chunk file mode %04o, want 0400", mode, got)
		}
		for d := filepath.Dir(filepath.Join(dir, chunkRel("k"))); d != dir; d = filepath.Dir(d) {
			if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("blob mode %04o: %s: %v, want 0700", mode, d, fi.Mode().Perm())
			}
		}
		c.Close()
	}
}

// HoldsStore tells whether the tier holds any chunk of a store, whatever
// else fills the budget: true while one chunk of it is there (kept by any
// instance, across restarts), false once the last is evicted. A Put of a
// chunk the tier holds (read again from the source) makes it the most
// recently used, and records a chunk kept before stores were recorded as
// its store's.
func TestChunkTierHoldsStore(t *testing.T) {
	dir := t.TempDir()
	const chunk = 8192
	opts := Options{Dir: dir, Size: 3 * chunk}
	c := mustOpen(t, opts)
	a, b := c.ChunkTier().Of("http://h/a.zarr"), c.ChunkTier().Of("http://h/b.zarr")
	if a.HoldsStore() || c.ChunkTier().HoldsStore() {
		t.Fatal("an empty tier holds a store")
	}
	a.Put("a0", content("a0", chunk))
	a.Put("a1", content("a1", chunk))
	if !a.HoldsStore() || b.HoldsStore() {
		t.Fatalf("after two chunks of a: a %v, b %v", a.HoldsStore(), b.HoldsStore())
	}
	o := mustOpen(t, opts) // another instance reads what c recorded
	if !o.ChunkTier().Of("http://h/a.zarr").HoldsStore() {
		t.Error("another instance does not see the chunks of a")
	}
	o.Close()
	a.Put("a0", content("a0", chunk)) // read again: now the most recent
	b.Put("b0", content("b0", chunk))
	b.Put("b1", content("b1", chunk)) // evicts a1, the least recently used
	if a.Holds("a1") {
		t.Error("a1 not evicted")
	}
	if !a.Holds("a0") {
		t.Fatal("a0, put again before b's chunks, was evicted first")
	}
	if !a.HoldsStore() || !b.HoldsStore() {
		t.Fatalf("with a0, b0 and b1 held: a %v, b %v", a.HoldsStore(), b.HoldsStore())
	}
	b.Put("b2", content("b2", chunk)) // evicts a0, the last of a
	if a.HoldsStore() || !b.HoldsStore() {
		t.Fatalf("after a's last chunk was evicted: a %v, b %v", a.HoldsStore(), b.HoldsStore())
	}
	// A chunk kept without its store (before stores were recorded) is
	// recorded as one when put again.
	c.ChunkTier().Put("c0", content("c0", 10))
	cs := c.ChunkTier().Of("http://h/c.zarr")
	if cs.HoldsStore() {
		t.Fatal("a chunk kept without a store counts as c's")
	}
	cs.Put("c0", content("c0", 10))
	if !cs.HoldsStore() {
		t.Fatal("a chunk put again is not recorded as its store's")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = mustOpen(t, opts)
	defer c.Close()
	for store, want := range map[string]bool{"http://h/a.zarr": false, "http://h/b.zarr": true, "http://h/c.zarr": true} {
		if got := c.ChunkTier().Of(store).HoldsStore(); got != want {
			t.Errorf("reopened: holds %s %v, want %v", store, got, want)
		}
	}
	if s := c.Stats(); s.ChunkStores != 0 {
		t.Errorf("reopening stored %d chunks", s.ChunkStores)
	}
}
