// Package memory bounds the memory that a daemon's work holds at once: a
// Budget of bytes that fills acquire before they allocate what a store's
// metadata sizes (slabs, chunk buffers, shard indexes), so that no store,
// however absurd its shapes, can make the process allocate more than its
// configuration allows.
//
// A Budget is safe for concurrent use. Acquire waits (in arrival order) for
// bytes to be released; a request larger than the whole budget fails at once
// with ErrExceeded, since waiting could never satisfy it. Callers acquire
// everything one step needs in one call and never acquire while holding, so
// that waiting cannot deadlock.
package memory

import (
	"bufio"
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/dustin/go-humanize"
)

// ErrExceeded is returned (wrapped) when a request is larger than the whole
// budget.
var ErrExceeded = errors.New("exceeds the memory budget")

// Budget is a weighted semaphore over bytes.
type Budget struct {
	total int64

	mu      sync.Mutex
	used    int64
	peak    int64
	waiters list.List // of *waiter, in arrival order
}

type waiter struct {
	n     int64
	ready chan struct{}
}

// New returns a budget of total bytes; total <= 0 means unlimited (nil is
// also an unlimited budget).
func New(total int64) *Budget {
	if total <= 0 {
		return nil
	}
	return &Budget{total: total}
}

// Total is the budget in bytes; 0 for an unlimited (nil) budget.
func (b *Budget) Total() int64 {
	if b == nil {
		return 0
	}
	return b.total
}

// Peak is the most bytes held at once so far.
func (b *Budget) Peak() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak
}

// Used is the bytes held now.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Fits reports whether n bytes could ever be acquired.
func (b *Budget) Fits(n int64) bool { return b == nil || n <= b.total }

// Acquire waits until n bytes are free and takes them; release gives them
// back (call it once). It fails with ErrExceeded when n is larger than the
// whole budget, and with ctx.Err() when ctx ends first. A nil Budget grants
// everything at once.
func (b *Budget) Acquire(ctx context.Context, n int64) (release func(), err error) {
	if b == nil || n <= 0 {
		return func() {}, nil
	}
	if n > b.total {
		return nil, fmt.Errorf("%w: %s needed, %s in all", ErrExceeded, Human(n), Human(b.total))
	}
	b.mu.Lock()
	if b.waiters.Len() == 0 && b.used+n <= b.total {
		b.take(n)
		b.mu.Unlock()
		return b.releaser(n), nil
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	el := b.waiters.PushBack(w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return b.releaser(n), nil
	case <-ctx.Done():
		b.mu.Lock()
		select {
		case <-w.ready:
			// Granted meanwhile: give it back.
			b.used -= n
			b.wake()
		default:
			b.waiters.Remove(el)
			b.wake() // a large waiter leaving may unblock smaller ones
		}
		b.mu.Unlock()
		return nil, ctx.Err()
	}
}

func (b *Budget) take(n int64) {
	b.used += n
	b.peak = max(b.peak, b.used)
}

func (b *Budget) releaser(n int64) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.used -= n
			b.wake()
			b.mu.Unlock()
		})
	}
}

// wake grants waiters in arrival order while they fit. Called with b.mu held.
func (b *Budget) wake() {
	for el := b.waiters.Front(); el != nil; el = b.waiters.Front() {
		w := el.Value.(*waiter)
		if b.used+w.n > b.total {
			return
		}
		b.take(w.n)
		b.waiters.Remove(el)
		close(w.ready)
	}
}

// Human formats a byte count with a binary unit ("1.5 GiB", "64 MiB").
func Human(n int64) string {
	if n < 0 {
		return "-" + humanize.IBytes(uint64(-n))
	}
	return humanize.IBytes(uint64(n))
}

// Available is the memory this process may use: the machine's physical
// memory, or its cgroup's limit when that is lower. 0 when unknown.
func Available() int64 {
	total := memTotal()
	if c := cgroupLimit(); c > 0 && (total == 0 || c < total) {
		total = c
	}
	return total
}

func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			fs := strings.Fields(rest)
			if len(fs) >= 1 {
				kb, err := strconv.ParseInt(fs[0], 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}

// cgroupLimit reads the memory limit of the process's cgroup (v2, then v1).
func cgroupLimit() int64 {
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err == nil && n > 0 && n < 1<<60 {
			return n
		}
	}
	return 0
}

// DefaultBudget is the daemon's memory budget when none is configured: a
// quarter of the memory available to the process, at least 512 MiB.
func DefaultBudget() int64 {
	return max(Available()/4, 512<<20)
}
