package memory

import "testing"

// A class holds what it serves, at most an eighth more (and the smallest
// class) than asked.
func TestArenaClasses(t *testing.T) {
	for _, n := range []int{1, minClass, minClass + 1, 3 << 20, 100 << 20} {
		if c := class(n); c < n || c > n+n/8+minClass {
			t.Errorf("class(%d) = %d", n, c)
		}
	}
}

// Memory the arena did not lend is not taken back; what it lent is, once.
func TestArenaFree(t *testing.T) {
	a := NewArena(8 << 20)
	defer a.Close()
	if a.Free(make([]byte, 1<<20)) {
		t.Error("took back memory it did not lend")
	}
	b := a.HostAlloc(1 << 20)
	if !a.Free(b) || a.Free(b) {
		t.Error("its own buffer not taken back exactly once")
	}
}

// A buffer with holds beside its caller's is lent again only once every
// hold is given back: a reader still using it never finds it lent to
// another.
func TestArenaRetain(t *testing.T) {
	a := NewArena(8 << 20)
	defer a.Close()
	if a.Retain(make([]byte, 1<<20)) || a.Retain(nil) {
		t.Error("held memory it did not lend")
	}
	b := a.HostAlloc(1 << 20)
	if !a.Retain(b[:0]) || !a.Retain(b) {
		t.Fatal("its own buffer not held")
	}
	for i := range 2 {
		if !a.Free(b) {
			t.Fatalf("hold %d not given back", i)
		}
		if c := a.HostAlloc(1 << 20); &c[0] == &b[0] {
			t.Fatalf("lent again with %d holds left", 2-i)
		} else {
			a.Free(c)
		}
	}
	if !a.Free(b) || a.Free(b) || a.Retain(b) {
		t.Error("the last hold did not take the buffer back exactly once")
	}
	if c := a.HostAlloc(1 << 20); &c[0] != &b[0] {
		t.Error("the buffer all gave back was not lent again")
	}
}
