package zarr

import (
	"testing"

	"github.com/zarrfs/zarrfs/internal/memory"
)

// A decoded chunk the cache keeps in lent memory goes back to the lender
// only once neither the cache nor a reader holds it: a reader that got it
// before another evicted it reads memory nobody else was lent.
func TestChunkCacheHolds(t *testing.T) {
	const n = 1 << 20
	arena := memory.NewArena(64 << 20)
	defer arena.Close()
	c := newChunkCache(n, arena)
	b := arena.HostAlloc(n) // a Read decoded a chunk into it
	if !c.put("a", b, -1) {
		t.Fatal("not kept")
	}
	arena.HostFree(b) // the Read that decoded it ended
	got, held, ok := c.get("a")
	if !ok || !held || &got[0] != &b[0] {
		t.Fatalf("get: ok %v, held %v", ok, held)
	}
	// Another Read evicts it while the first still reads it.
	other := arena.HostAlloc(n)
	c.put("b", other, -1)
	arena.HostFree(other)
	if _, _, ok := c.get("a"); ok {
		t.Fatal("not evicted")
	}
	if x := arena.HostAlloc(n); &x[0] == &b[0] {
		t.Fatal("a chunk a reader still holds was lent again after its eviction")
	} else {
		arena.HostFree(x)
	}
	arena.HostFree(got) // the reader is done
	if x := arena.HostAlloc(n); &x[0] != &b[0] {
		t.Error("the chunk did not go back once its last reader was done")
	} else {
		arena.HostFree(x)
	}
	// Dropping the cache gives back what it holds.
	c.reset()
	if mapped, idle := arena.Held(); mapped != idle {
		t.Errorf("%d bytes still lent after reset", mapped-idle)
	}
	// Memory the lender did not lend is kept without a hold.
	if !c.put("c", make([]byte, 10), -1) {
		t.Fatal("not kept")
	}
	if _, held, ok := c.get("c"); !ok || held {
		t.Errorf("memory nobody lent: ok %v, held %v", ok, held)
	}
}
