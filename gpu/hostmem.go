package gpu

import (
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"unsafe"
)

// This file is the pinned host memory a Decoder lends its callers
// (codec.HostMemory). A job whose compressed bytes lie in it crosses to the
// device straight from there, and one whose destination lies in it comes
// back straight into it: the two host copies through the Decoder's own
// pinned staging, which bound a round's rate as much as PCIe does, are
// skipped.
//
// Buffers are anonymous mappings registered with the driver, not memory the
// driver allocates: a context reset after a device fault drops the
// registration but not the memory, so a caller's buffer stays valid, and it
// is registered again with the new context. Memory that is not (or no
// longer) registered is still correct to copy from and to, only slower.

// hostSize is the size of the buffer that serves n bytes: rounded up to an
// sixteenth of the next power of two (at least 64 KiB), so that a freed buffer
// serves later requests of about its size and none wastes more than 1/8.
func hostSize(n int) int {
	p := 1 << bits.Len(uint(n-1))
	step := max(p/16, 64<<10)
	return (n + step - 1) / step * step
}

// hostPool is the Decoder's lent pinned memory.
type hostPool struct {
	mu    sync.Mutex
	limit int64 // most bytes mapped at once
	used  int64
	free  map[int][][]byte // by size (hostSize): buffers returned, still registered
	bufs  []hostRange      // every mapped buffer, sorted by start
}

type hostRange struct {
	start, end uintptr
	mem        []byte // the mapping, start to end
	lent       bool
}

// HostAlloc returns n bytes of pinned host memory for the caller to decode
// from or into (Src or Dst of a job): such jobs skip a host copy on their
// way to and from the GPU. Memory comes from a pool bounded by
// Options.HostBytes; past the bound, or where pinning fails, it is ordinary
// memory, which decodes as well, only slower. Give it back with HostFree
// once no DecodeBatch that uses it is running; HostFree of memory that did
// not come from HostAlloc does nothing.
func (d *Decoder) HostAlloc(n int) []byte {
	if n <= 0 {
		return nil
	}
	p := &d.host
	c := hostSize(n)
	p.mu.Lock()
	if l := p.free[c]; len(l) > 0 {
		b := l[len(l)-1]
		p.free[c] = l[:len(l)-1]
		p.setLent(b, true)
		p.mu.Unlock()
		return b[:n]
	}
	size := int64(c)
	if p.used+size > p.limit {
		p.mu.Unlock()
		return make([]byte, n)
	}
	p.used += size
	p.mu.Unlock()
	b, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		p.mu.Lock()
		p.used -= size
		p.mu.Unlock()
		return make([]byte, n)
	}
	prefault(b)
	d.register(b) // a failure leaves it pageable: still correct
	start := uintptr(unsafe.Pointer(&b[0]))
	p.mu.Lock()
	i, _ := slices.BinarySearchFunc(p.bufs, start, func(r hostRange, s uintptr) int { return cmpPtr(r.start, s) })
	p.bufs = slices.Insert(p.bufs, i, hostRange{start: start, end: start + uintptr(size), mem: b[:size], lent: true})
	p.mu.Unlock()
	return b[:n]
}

// HostFree returns a buffer HostAlloc lent.
func (d *Decoder) HostFree(b []byte) {
	if cap(b) == 0 {
		return
	}
	p := &d.host
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := slices.BinarySearchFunc(p.bufs, start, func(r hostRange, s uintptr) int { return cmpPtr(r.start, s) })
	if !ok || !p.bufs[i].lent {
		return // not ours, or already back
	}
	r := &p.bufs[i]
	r.lent = false
	if p.free == nil {
		p.free = map[int][][]byte{}
	}
	p.free[len(r.mem)] = append(p.free[len(r.mem)], r.mem)
}

func (p *hostPool) setLent(b []byte, lent bool) {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if i, ok := slices.BinarySearchFunc(p.bufs, start, func(r hostRange, s uintptr) int { return cmpPtr(r.start, s) }); ok {
		p.bufs[i].lent = lent
	}
}

func cmpPtr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// prefault readies a fresh mapping for pinning: huge pages where the
// kernel gives them (fewer pages to fault, pin and map), and every page
// touched from several goroutines, since the driver's registration would
// fault them in one at a time on one thread.
func prefault(b []byte) {
	const hugePage = 2 << 20
	if len(b) < 2*hugePage {
		return
	}
	_ = syscall.Madvise(b, 14) // MADV_HUGEPAGE; refused where transparent huge pages are off
	const page = 4096
	parts := min(runtime.GOMAXPROCS(0), 8, len(b)/hugePage)
	per := (len(b)/parts + page - 1) / page * page
	var wg sync.WaitGroup
	for p := range parts {
		lo, hi := p*per, min((p+1)*per, len(b))
		wg.Go(func() {
			for i := lo; i < hi; i += page {
				b[i] = 0
			}
		})
	}
	wg.Wait()
}

// pinned reports whether b lies wholly in one buffer of the pool.
func (d *Decoder) pinned(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	p := &d.host
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	end := start + uintptr(len(b))
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := slices.BinarySearchFunc(p.bufs, start, func(r hostRange, s uintptr) int { return cmpPtr(r.start, s) })
	if !ok {
		i-- // the buffer starting at or before start
	}
	return i >= 0 && i < len(p.bufs) && start >= p.bufs[i].start && end <= p.bufs[i].end
}

// register pins b in the Decoder's context.
func (d *Decoder) register(b []byte) bool {
	const portable = 1 // CU_MEMHOSTREGISTER_PORTABLE
	d.ctxMu.RLock()
	defer d.ctxMu.RUnlock()
	if d.ctx == 0 {
		return false
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if d.cu.cuCtxSetCurrent(d.ctx) != cuSuccess {
		return false
	}
	return d.cu.cuMemHostRegister(unsafe.Pointer(&b[0]), uint64(len(b)), portable) == cuSuccess
}

// reregister pins every buffer of the pool again, after a context reset
// dropped their registrations. The caller holds the OS thread with the new
// context current.
func (d *Decoder) reregister() {
	const portable = 1
	p := &d.host
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.bufs {
		d.cu.cuMemHostRegister(unsafe.Pointer(&r.mem[0]), uint64(len(r.mem)), portable)
	}
}

// releaseHost unregisters and unmaps the buffers not lent out, at Close;
// those still lent stay mapped (their holders may still read them).
func (d *Decoder) releaseHost() {
	p := &d.host
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.bufs[:0]
	for _, r := range p.bufs {
		if r.lent {
			kept = append(kept, r)
			continue
		}
		if d.cu != nil {
			d.cu.cuMemHostUnregister(unsafe.Pointer(&r.mem[0]))
		}
		syscall.Munmap(r.mem)
		p.used -= int64(r.end - r.start)
	}
	p.bufs = kept
	p.free = nil
}
