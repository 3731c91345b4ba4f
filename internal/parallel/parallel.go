// Package parallel runs the iterations of a loop on a bounded number of
// goroutines, each claiming the next index until none is left: a loop of a
// million small steps costs as many goroutine stacks as it is allowed, not
// a million.
package parallel

import (
	"sync"
	"sync/atomic"
)

// For calls fn(0) ... fn(n-1) from at most par goroutines and returns when
// every call has. With par or n at most 1 it calls them in order on the
// caller's goroutine.
func For(n, par int, fn func(i int)) {
	par = min(max(par, 1), n)
	if par <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range par {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}
