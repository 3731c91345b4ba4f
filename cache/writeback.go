package cache

import (
	"os"
	"sync"

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
	ch     chan *os.File
	queued sync.WaitGroup // one for each file queued and not yet closed
	done   sync.WaitGroup
	closed sync.Once
}

// writebackQueue bounds the blobs waiting for their writeback to start.
const writebackQueue = 256

func newWriteback(off bool) *writeback {
	if off {
		return nil
	}
	w := &writeback{ch: make(chan *os.File, writebackQueue)}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		for f := range w.ch {
			_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
			f.Close()
			w.queued.Done()
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
	w.queued.Add(1)
	select {
	case w.ch <- dup:
	default:
		w.queued.Done()
		dup.Close()
	}
}

// flush waits until every file queued so far is closed. A queued
// descriptor keeps its blob's blocks allocated after an eviction
// unlinked the blob: a full filesystem whose entries are all evicted may
// be waiting for these (on a busy machine the goroutine runs late).
func (w *writeback) flush() {
	if w == nil {
		return
	}
	w.queued.Wait()
}

// close stops the goroutine once the queued writebacks have started; it
// may be called more than once.
func (w *writeback) close() {
	if w == nil {
		return
	}
	w.closed.Do(func() { close(w.ch) })
	w.done.Wait()
}
