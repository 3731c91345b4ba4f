package parallel

import (
	"sync/atomic"
	"testing"
)

// Every index is called exactly once, by no more goroutines than allowed.
func TestFor(t *testing.T) {
	for _, c := range []struct{ n, par int }{{0, 4}, {1, 4}, {5, 1}, {100, 4}, {3, 16}, {7, 0}} {
		calls := make([]atomic.Int32, c.n)
		var live, most atomic.Int32
		For(c.n, c.par, func(i int) {
			l := live.Add(1)
			for m := most.Load(); l > m && !most.CompareAndSwap(m, l); m = most.Load() {
			}
			calls[i].Add(1)
			live.Add(-1)
		})
		for i := range calls {
			if got := calls[i].Load(); got != 1 {
				t.Fatalf("n=%d par=%d: index %d called %d times", c.n, c.par, i, got)
			}
		}
		if m := int(most.Load()); m > max(c.par, 1) {
			t.Fatalf("n=%d par=%d: %d calls at once", c.n, c.par, m)
		}
	}
}
