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
