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
// is registered again with the new context. Registering is slow (the
// driver faults in and pins every page: 4 to 10 GB/s on an H200 host, and
// the calls do not overlap), so a fresh buffer is lent at once and
// registered by one background goroutine: until that is done, jobs in it
// take the staged path, which is correct for any memory.

// hostSize is the size of the buffer that serves n bytes: rounded up to a
// sixteenth of the next power of two (at least 64 KiB), so that a freed
// buffer serves later requests of about its size and none wastes more than
// 1/8.
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
	free  map[int][][]byte // by size (hostSize): buffers returned
	bufs  []hostRange      // every mapped buffer, sorted by start

	// The registrar: fresh buffers wait in pending for the goroutine
	// started by startRegistrar; stopRegistrar ends it.
	pending  [][]byte
	wake     chan struct{}
	stopping bool
	stopped  chan struct{}
}

type hostRange struct {
	start, end uintptr
	mem        []byte // the mapping, start to end
	lent       bool
	registered bool // with the current context: the device may copy it directly
}

// find returns the index of the buffer holding address a, or -1.
func (p *hostPool) find(a uintptr) int {
	i, ok := slices.BinarySearchFunc(p.bufs, a, func(r hostRange, s uintptr) int { return cmpPtr(r.start, s) })
	if !ok {
		i-- // the buffer starting before a
	}
	if i >= 0 && i < len(p.bufs) && a >= p.bufs[i].start && a < p.bufs[i].end {
		return i
	}
	return -1
}

// HostAlloc returns n bytes of pinned host memory for the caller to decode
// from or into (Src or Dst of a job): such jobs skip a host copy on their
// way to and from the GPU. Memory comes from a pool bounded by
// Options.HostBytes; past the bound, or where mapping fails, it is ordinary
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
		if i := p.find(addrOf(b)); i >= 0 {
			p.bufs[i].lent = true
		}
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
	if size >= 4<<20 {
		// Huge pages where the kernel gives them: fewer pages to fault,
		// pin and map. Refused where transparent huge pages are off.
		_ = syscall.Madvise(b, 14) // MADV_HUGEPAGE
	}
	start := addrOf(b)
	p.mu.Lock()
	i, _ := slices.BinarySearchFunc(p.bufs, start, func(r hostRange, s uintptr) int { return cmpPtr(r.start, s) })
	p.bufs = slices.Insert(p.bufs, i, hostRange{start: start, end: start + uintptr(size), mem: b[:size], lent: true})
	if p.wake != nil && !p.stopping {
		p.pending = append(p.pending, b[:size])
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	p.mu.Unlock()
	return b[:n]
}

// HostFree returns a buffer HostAlloc lent.
func (d *Decoder) HostFree(b []byte) {
	if cap(b) == 0 {
		return
	}
	p := &d.host
	start := addrOf(b)
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

func cmpPtr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// pinned reports whether b lies wholly in one registered buffer of the
// pool: whether the device may copy from or to it directly.
func (d *Decoder) pinned(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	p := &d.host
	start := addrOf(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.find(start)
	return i >= 0 && p.bufs[i].registered && start+uintptr(len(b)) <= p.bufs[i].end
}

// startRegistrar starts the goroutine that registers fresh buffers.
func (d *Decoder) startRegistrar() {
	p := &d.host
	p.wake = make(chan struct{}, 1)
	p.stopped = make(chan struct{})
	go func() {
		defer close(p.stopped)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for {
			p.mu.Lock()
			stopping := p.stopping
			var b []byte
			if len(p.pending) > 0 && !stopping {
				b, p.pending = p.pending[0], p.pending[1:]
			}
			p.mu.Unlock()
			if stopping {
				return
			}
			if b == nil {
				<-p.wake
				continue
			}
			if d.register(b) {
				p.mu.Lock()
				if i := p.find(addrOf(b)); i >= 0 {
					p.bufs[i].registered = true
				}
				p.mu.Unlock()
			}
		}
	}()
}

// stopRegistrar ends the registrar, after the registration under way.
func (d *Decoder) stopRegistrar() {
	p := &d.host
	if p.wake == nil {
		return
	}
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	<-p.stopped
}

// register pins b in the Decoder's context. It runs on the registrar's
// locked thread.
func (d *Decoder) register(b []byte) bool {
	const portable = 1 // CU_MEMHOSTREGISTER_PORTABLE
	d.ctxMu.RLock()
	defer d.ctxMu.RUnlock()
	if d.ctx == 0 || d.cu == nil {
		return false
	}
	if d.cu.cuCtxSetCurrent(d.ctx) != cuSuccess {
		return false
	}
	return d.cu.cuMemHostRegister(unsafe.Pointer(&b[0]), uint64(len(b)), portable) == cuSuccess
}

// reregister pins every registered buffer of the pool again, after a
// context reset dropped their registrations. The caller holds the OS
// thread with the new context current, and ctxMu, so the registrar waits.
func (d *Decoder) reregister() {
	const portable = 1
	p := &d.host
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.bufs {
		r := &p.bufs[i]
		if r.registered {
			r.registered = d.cu.cuMemHostRegister(unsafe.Pointer(&r.mem[0]), uint64(len(r.mem)), portable) == cuSuccess
		}
	}
}

// releaseHost unregisters and unmaps the buffers not lent out, at Close;
// those still lent stay mapped (their holders may still read them).
func (d *Decoder) releaseHost() {
	d.stopRegistrar()
	p := &d.host
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.bufs[:0]
	for _, r := range p.bufs {
		if r.lent {
			r.registered = false // the context goes
			kept = append(kept, r)
			continue
		}
		if r.registered && d.cu != nil {
			d.cu.cuMemHostUnregister(unsafe.Pointer(&r.mem[0]))
		}
		syscall.Munmap(r.mem)
		p.used -= int64(r.end - r.start)
	}
	p.bufs = kept
	p.free = nil
	p.pending = nil
}
