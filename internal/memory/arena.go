package memory

// The memory a process's fills and reads use comes from one lender
// (Lender), passed to every package that needs buffers, so that none keeps
// a pool of its own. Arena is the lender of host memory; the decoding
// pipeline lends a GPU's pinned memory before it (package decode).

import (
	"math/bits"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Lender lends buffers and takes them back. A buffer lent has holders:
// HostAlloc's caller, and one more for each Retain; each gives its hold
// back with HostFree, and the buffer is lent again only once the last has.
// So a buffer that several readers share (a decoded chunk a cache keeps,
// a read that may still be landing in it after its caller gave up) stays
// theirs until each is done with it, and none needs to know of the others.
// HostFree and Retain ignore memory the lender did not lend, so a caller
// can give back whatever it got without tracking who lent it.
// Implementations must be safe for concurrent use.
type Lender interface {
	// HostAlloc returns n bytes (contents unspecified), with one hold:
	// the caller's.
	HostAlloc(n int) []byte
	// HostFree gives back one hold on a buffer HostAlloc returned (any
	// reslice of it that starts where it started).
	HostFree(b []byte)
	// Retain adds a hold on a buffer HostAlloc returned and not yet given
	// back (any reslice of it that starts where it started), and reports
	// whether b is such a buffer: false for memory the lender did not
	// lend, which it cannot keep from being reused.
	Retain(b []byte) bool
}

// A Trimmer is a Lender that takes back the tail of a buffer it lent:
// HostTrim(b, n), where b is a buffer HostAlloc returned and its caller
// holds alone, keeps b's first n bytes lent and returns them (capacity
// n: the rest may be lent again at once). Memory the lender did not lend,
// or held by others too, comes back as b[:n], its tail still lent. For a
// buffer sized for the most an object may take (a compressed chunk read
// into room for its decoded size), so that what is lent is what it holds.
type Trimmer interface {
	HostTrim(b []byte, n int) []byte
}

var _ Lender = (*Arena)(nil)

// Arena lends host memory outside the Go heap: anonymous mappings, kept
// mapped once used and lent again, in size classes. Fills hold tens of
// megabytes per sample (the compressed chunks, the sample itself), and
// fresh memory costs a page fault per 4 KiB the first time it is written
// (a few GB/s per core), while a buffer of the Go heap is zeroed on every
// reuse and dropped by its pools at each collection; memory kept mapped and
// lent again costs neither. The collector never scans it, and a buffer
// given back by one fill serves the next.
//
// Buffers are rounded up to a class: 64 KiB at least, then eight classes
// per power of two (at most 12.5% more than asked). Idle buffers are kept
// up to maxIdle bytes; past that they are unmapped. HostFree ignores memory
// the arena did not lend, so callers can give back whatever they got from
// a lender without tracking which. Safe for concurrent use.
type Arena struct {
	mu      sync.Mutex
	free    map[int][][]byte // idle buffers by class size, full length
	lent    map[uintptr]lent // every buffer lent, by address
	idle    int64
	maxIdle int64
	mapped  int64 // bytes mapped now, lent or idle
}

// lent is a buffer lent: its class size and how many hold it.
type lent struct {
	class, holds int
}

// NewArena returns an Arena that keeps up to maxIdle bytes of idle
// buffers mapped.
func NewArena(maxIdle int64) *Arena {
	return &Arena{free: map[int][][]byte{}, lent: map[uintptr]lent{}, maxIdle: maxIdle}
}

// minClass is the smallest buffer the arena maps; smaller requests are
// served from the Go heap (not worth a mapping).
const minClass = 64 << 10

// class is the size of the buffer that serves n bytes.
func class(n int) int {
	if n <= minClass {
		return minClass
	}
	// n in (2^(k-1), 2^k]: steps of 2^(k-4).
	k := bits.Len(uint(n - 1))
	step := 1 << (k - 4)
	return (n + step - 1) / step * step
}

// HostAlloc returns n bytes of memory the arena owns (contents
// unspecified), or of the Go heap when n is small or the mapping fails.
func (a *Arena) HostAlloc(n int) []byte {
	if n < minClass {
		return make([]byte, n)
	}
	c := class(n)
	a.mu.Lock()
	if fl := a.free[c]; len(fl) > 0 {
		b := fl[len(fl)-1]
		a.free[c] = fl[:len(fl)-1]
		a.idle -= int64(c)
		a.lent[addr(b)] = lent{c, 1}
		a.mu.Unlock()
		return b[:n]
	}
	a.mu.Unlock()
	b, err := unix.Mmap(-1, 0, c, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, n)
	}
	if c >= 2<<20 {
		// Fewer faults and TLB misses where the kernel backs anonymous
		// memory with huge pages on request.
		_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	}
	a.mu.Lock()
	a.lent[addr(b)] = lent{c, 1}
	a.mapped += int64(c)
	a.mu.Unlock()
	return b[:n]
}

// HostFree gives back a hold on a buffer HostAlloc lent; anything else is
// left to its owner.
func (a *Arena) HostFree(b []byte) { a.Free(b) }

// Retain adds a hold on a buffer HostAlloc lent (Lender).
func (a *Arena) Retain(b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	b = b[:cap(b)]
	p := addr(b)
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.lent[p]
	if !ok || l.class != len(b) {
		return false
	}
	l.holds++
	a.lent[p] = l
	return true
}

// Free gives back a hold on a buffer HostAlloc lent (any reslice of it
// that starts where it started), taking the buffer back with the last,
// and reports whether it was the arena's; anything else is left to its
// owner.
func (a *Arena) Free(b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	b = b[:cap(b)]
	p := addr(b)
	a.mu.Lock()
	l, ok := a.lent[p]
	if !ok || l.class != len(b) {
		a.mu.Unlock()
		return false
	}
	if l.holds > 1 {
		l.holds--
		a.lent[p] = l
		a.mu.Unlock()
		return true
	}
	c := l.class
	delete(a.lent, p)
	if a.idle+int64(c) <= a.maxIdle {
		a.free[c] = append(a.free[c], b)
		a.idle += int64(c)
		a.mu.Unlock()
		return true
	}
	a.mapped -= int64(c)
	a.mu.Unlock()
	_ = unix.Munmap(b)
	return true
}

// Held reports the bytes mapped (lent and idle) and those idle.
func (a *Arena) Held() (mapped, idle int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mapped, a.idle
}

// Close unmaps every idle buffer and keeps none from now on: a buffer
// still lent is unmapped when it comes back.
func (a *Arena) Close() {
	a.mu.Lock()
	a.maxIdle = 0
	var bufs [][]byte
	for c, fl := range a.free {
		bufs = append(bufs, fl...)
		a.mapped -= int64(c) * int64(len(fl))
		delete(a.free, c)
	}
	a.idle = 0
	a.mu.Unlock()
	for _, b := range bufs {
		_ = unix.Munmap(b)
	}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
