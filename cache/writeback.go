package cache

import (
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// writeback starts the disk writes of newly filled blobs, in the order
// they were filled, from one goroutine of its own: sync_file_range blocks
// while the device's queue is full, and a fill that called it itself made
// its reader wait for the disk (a first epoch over a disk cache ran at the
// disk's rate although the page cache could hold every blob). When the
// disk falls behind, requests beyond the queue are dropped: the kernel's
// own writeback writes those pages, and the writers are throttled only
// when dirty memory reaches the kernel's limits. Durability is unchanged:
// entries become trusted only after syncfs (Cache.syncAll).
type writeback struct {
	ch   chan writebackItem
	done sync.WaitGroup
	// hurry counts the flushes waiting: meanwhile files are closed
	// without their writeback started (the kernel's own writes them).
	hurry   atomic.Int32
	mu      sync.Mutex // orders flush's sends against close
	stopped bool
}

// writebackItem is a file to write back, or a flush's marker: closed once
// every file queued before it is closed.
type writebackItem struct {
	f      *os.File
	marker chan struct{}
}

// writebackQueue bounds the blobs waiting for their writeback to start.
const writebackQueue = 256

func newWriteback(off bool) *writeback {
	if off {
		return nil
	}
	w := &writeback{ch: make(chan writebackItem, writebackQueue)}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		for it := range w.ch {
			if it.marker != nil {
				close(it.marker)
				continue
			}
			if w.hurry.Load() == 0 {
				_ = unix.SyncFileRange(int(it.f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
			}
			it.f.Close()
		}
	}()
	return w
}

// start queues the writeback of f's dirty pages; f stays the caller's (a
// duplicate descriptor is queued). A nil writeback does nothing.
func (w *writeback) start(f *os.File) {
	if w == nil {
		return
	}
	dup, err := dupFile(f, f.Name())
	if err != nil {
		return // the kernel's own writeback writes it
	}
	select {
	case w.ch <- writebackItem{f: dup}:
	default:
		dup.Close()
	}
}

// flush returns once every file queued before it is closed, starting no
// more writebacks meanwhile. A queued descriptor keeps its blob's blocks
// allocated after an eviction unlinked the blob: a full filesystem whose
// entries are all evicted may be waiting for these (on a busy machine the
// goroutine runs late). After close it does nothing.
func (w *writeback) flush() {
	if w == nil {
		return
	}
	marker := make(chan struct{})
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.hurry.Add(1)
	defer w.hurry.Add(-1)
	w.ch <- writebackItem{marker: marker}
	w.mu.Unlock()
	<-marker
}

// close stops the goroutine once the queued writebacks have started; it
// may be called more than once.
func (w *writeback) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	if !w.stopped {
		w.stopped = true
		close(w.ch)
	}
	w.mu.Unlock()
	w.done.Wait()
}
