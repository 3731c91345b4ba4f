package gpu

import (
	"testing"
)

// TestHostPool checks the lending bookkeeping of HostAlloc without a GPU:
// a Decoder with no context maps the memory but registers nothing.
func TestHostPool(t *testing.T) {
	d := &Decoder{}
	d.host.limit = 3 << 20
	for _, c := range []struct{ n, size int }{{1, 64 << 10}, {64 << 10, 64 << 10}, {65<<10 + 1, 128 << 10},
		{1 << 20, 1 << 20}, {1<<20 + 1, 1<<20 + 128<<10}, {4152960, 4 << 20}, {4194305, 4<<20 + 512<<10}} {
		if got := hostSize(c.n); got != c.size {
			t.Errorf("hostSize(%d) = %d, want %d", c.n, got, c.size)
		}
	}
	a := d.HostAlloc(1000)
	b := d.HostAlloc(1 << 20)
	if len(a) != 1000 || len(b) != 1<<20 {
		t.Fatalf("lengths %d, %d", len(a), len(b))
	}
	if !d.pinned(a) || !d.pinned(b[100:200]) || !d.pinned(a[:cap(a)][:64<<10]) {
		t.Error("lent memory not recognised")
	}
	if d.pinned(make([]byte, 10)) || d.pinned(nil) {
		t.Error("memory outside the pool taken for pinned")
	}
	a[0], a[999] = 1, 2 // writable
	// Past the bound: ordinary memory.
	c := d.HostAlloc(2 << 20)
	if d.pinned(c) || len(c) != 2<<20 {
		t.Errorf("allocation past the bound: pinned %v, len %d", d.pinned(c), len(c))
	}
	// A freed buffer serves the next request of its size.
	d.HostFree(a)
	d.HostFree(a) // twice: ignored
	d.HostFree(c) // not lent: ignored
	a2 := d.HostAlloc(2000)
	if &a2[0] != &a[0] {
		t.Error("a freed buffer was not reused")
	}
	// Close unmaps what is not lent, keeps what is.
	d.HostFree(b)
	d.releaseHost()
	if !d.pinned(a2) || d.pinned(b) {
		t.Error("releaseHost: lent buffers must stay, free ones go")
	}
	a2[0] = 3
}
