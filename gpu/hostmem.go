package gpu

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/internal/memory"
)

// This file is the pinned host memory a Decoder lends its callers
// (codec.HostMemory). A job whose compressed bytes lie in it crosses to the
// device straight from there, and one whose destination lies in it comes
// back straight into it: the two host copies through the Decoder's own
// pinned staging, which bound a round's rate as much as PCIe does, are
// skipped.
//
// The memory is a few large arenas (anonymous mappings of arenaSize bytes)
// registered with the driver in the background, ahead of demand: pinning
// is slow (a few GB/s, on one thread) and was the first-use cost of every
// command when each buffer was registered as it was lent. Buffers are
// carved from the arenas first fit, in 64 KiB units, and coalesced when
// they come back. A caller never waits for a registration: when no
// registered arena has room, HostAlloc returns ordinary memory (correct,
// only slower) and asks for one more arena, within Options.HostBytes.
// Arenas with nothing lent are given back after Options.HostIdle without
// a request, so a mount that finished its warm-up returns the memory.
//
// Arenas are anonymous mappings, not memory the driver allocates: a
// context reset after a device fault drops the registration but not the
// memory, so a caller's buffer stays valid, and it is registered again with
// the new context.

const (
	// arenaSize is the unit of registration.
	arenaSize = 256 << 20
	// hostUnit is the granularity of lent buffers.
	hostUnit = 64 << 10
	// defaultHostIdle is how long an idle pool keeps its arenas.
	defaultHostIdle = 2 * time.Minute
)

// hostPool is the Decoder's lent pinned memory.
type hostPool struct {
	mu     sync.Mutex
	limit  int64 // most bytes mapped at once (Options.HostBytes)
	unit   int   // arena size: arenaSize, smaller in tests
	closed bool
	idle   time.Duration // arenas with nothing lent go after this long without a request
	// onDemand: no arena is registered before the first request
	// (Options.HostOnDemand).
	onDemand bool
	used     int64    // bytes mapped
	arenas   []*arena // sorted by start
	lent     map[uintptr]lentBuf
	// growing is set while a background registration runs.
	growing bool
	// last is the time of the last HostAlloc or HostFree.
	last time.Time
	// inUse is the bytes lent now (whole units), peak the most at once.
	inUse, peak int64
	// missed is the bytes HostAlloc lent from ordinary memory, for want
	// of room in a registered arena.
	missed atomic.Int64
	// register pins an arena and unregister unpins it; nil (tests without
	// a GPU) maps without pinning, and such arenas count as pinned for the
	// bookkeeping.
	register   func([]byte) bool
	unregister func([]byte)
	stop       chan struct{}
	done       chan struct{}
}

type arena struct {
	mem        []byte
	start, end uintptr
	registered bool
	free       []span // sorted by offset, coalesced
	lentBytes  int
}

type span struct{ off, n int }

type lentBuf struct {
	a     *arena
	n     int // bytes reserved (a multiple of hostUnit)
	holds int // HostAlloc's, and one per Retain (memory.Lender)
}

// hostStats is what the pool holds now, and the most it lent at once.
type hostStats struct {
	Mapped, Lent, Peak, Missed int64
	Arenas                     int
}

func (p *hostPool) stats() hostStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return hostStats{Mapped: p.used, Lent: p.inUse, Peak: p.peak, Missed: p.missed.Load(), Arenas: len(p.arenas)}
}

// start registers the first arena in the background (unless onDemand)
// and starts the idle timer.
func (p *hostPool) start() {
	if p.idle <= 0 {
		p.idle = defaultHostIdle
	}
	if p.unit <= 0 {
		p.unit = arenaSize
	}
	p.lent = map[uintptr]lentBuf{}
	p.last = time.Now()
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	if !p.onDemand {
		p.mu.Lock()
		p.growLocked(p.unit)
		p.mu.Unlock()
	}
	go p.shrinkWhenIdle(p.stop, p.done)
}

// HostAlloc returns n bytes of pinned host memory for the caller to decode
// from or into (Src or Dst of a job): such jobs skip a host copy on their
// way to and from the GPU. Without room in a registered arena it returns
// ordinary memory, which decodes as well, only slower, and registers more
// in the background, within Options.HostBytes. Give it back with HostFree
// once no DecodeBatch that uses it is running; HostFree of memory that did
// not come from HostAlloc does nothing.
func (d *Decoder) HostAlloc(n int) []byte {
	if n <= 0 {
		return nil
	}
	if b := d.host.alloc(n); b != nil {
		return b
	}
	d.host.missed.Add(int64(n))
	return make([]byte, n)
}

// TryHostAlloc is HostAlloc without the fallback: it returns nil when no
// registered arena has room (registering more in the background), so that
// a caller with memory of its own to lend uses that instead of the Go
// heap.
func (d *Decoder) TryHostAlloc(n int) []byte {
	if n <= 0 {
		return nil
	}
	return d.host.alloc(n)
}

// HostAllocWait is HostAlloc that waits up to timeout for pinned memory to
// be registered rather than return ordinary memory: for benchmarks and
// tests of the pinned path, which must not measure the staged one.
func (d *Decoder) HostAllocWait(n int, timeout time.Duration) []byte {
	deadline := time.Now().Add(timeout)
	for {
		if b := d.host.alloc(n); b != nil {
			return b
		}
		if time.Now().After(deadline) {
			return make([]byte, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// HostReserve registers pinned memory ahead of demand until n bytes are
// mapped (within Options.HostBytes), waiting up to wait for it: a caller
// about to read many chunks into HostAlloc's memory (a ring's fills, in
// a pipeline that registers on demand) then finds it pinned from the
// first, rather than ordinary memory that the rounds must copy into
// their staging.
func (d *Decoder) HostReserve(n int64, wait time.Duration) {
	p := &d.host
	deadline := time.Now().Add(wait)
	for {
		p.mu.Lock()
		if p.lent == nil || p.closed {
			p.mu.Unlock()
			return // not started, or closed
		}
		want := min(n, p.limit/hostUnit*hostUnit)
		if p.used >= want && !p.growing {
			p.mu.Unlock()
			return
		}
		if p.used < want {
			p.growLocked(int(want - p.used)) // nothing while one grows
		}
		p.mu.Unlock()
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// HostFree gives back a hold on a buffer HostAlloc lent: the buffer is
// lent again once every hold is back (memory.Lender).
func (d *Decoder) HostFree(b []byte) { d.host.free(b) }

// HostTrim keeps the first n bytes of b, a buffer HostAlloc lent whose
// caller holds it alone, and lends the rest again (memory.Trimmer): a
// compressed chunk read into room for its decoded size holds only its
// own bytes of pinned memory once read.
func (d *Decoder) HostTrim(b []byte, n int) []byte { return d.host.trim(b, n) }

var _ memory.Trimmer = (*Decoder)(nil)

// Retain adds a hold on a buffer HostAlloc lent and reports whether it was
// one (memory.Lender).
func (d *Decoder) Retain(b []byte) bool { return d.host.retain(b) }

// HostLent is the pinned memory lent by HostAlloc and not yet given back,
// in bytes (whole units of the pool).
func (d *Decoder) HostLent() int64 { return d.host.stats().Lent }

func (p *hostPool) alloc(n int) []byte {
	size := (n + hostUnit - 1) / hostUnit * hostUnit
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lent == nil || p.closed {
		return nil // not started, or closed
	}
	p.last = time.Now()
	for _, a := range p.arenas {
		if !a.registered {
			continue
		}
		for i, s := range a.free {
			if s.n < size {
				continue
			}
			off := s.off
			if s.n == size {
				a.free = slices.Delete(a.free, i, i+1)
			} else {
				a.free[i] = span{s.off + size, s.n - size}
			}
			a.lentBytes += size
			p.inUse += int64(size)
			p.peak = max(p.peak, p.inUse)
			b := a.mem[off : off+n : off+size]
			p.lent[uintptr(unsafe.Pointer(&b[0]))] = lentBuf{a, size, 1}
			p.growIfLowLocked(size)
			return b
		}
	}
	p.growIfLowLocked(size)
	return nil
}

// growIfLowLocked registers another arena in the background when the room
// left is under one request of size (or one arena), within the limit.
func (p *hostPool) growIfLowLocked(size int) {
	room := 0
	for _, a := range p.arenas {
		if a.registered {
			for _, s := range a.free {
				room = max(room, s.n)
			}
		}
	}
	if room >= max(size, p.unit/2) {
		return
	}
	p.growLocked(max(size, p.unit))
}

// growLocked maps and registers one arena of n bytes in the background.
func (p *hostPool) growLocked(n int) {
	n = (n + hostUnit - 1) / hostUnit * hostUnit
	// Near the limit, a smaller arena: what is left of it, in whole units
	// (a limit under one arena still lends).
	n = int(min(int64(n), (p.limit-p.used)/hostUnit*hostUnit))
	if p.growing || p.closed || n <= 0 {
		return
	}
	p.growing = true
	p.used += int64(n)
	go func() {
		mem, err := mapFaulted(n)
		ok := err == nil && (p.register == nil || p.register(mem))
		p.mu.Lock()
		defer p.mu.Unlock()
		p.growing = false
		if ok && p.closed {
			// Closed meanwhile. Unpin outside p.mu: the driver's lock
			// (ctxMu) is taken before p.mu elsewhere.
			p.mu.Unlock()
			if p.unregister != nil {
				p.unregister(mem)
			}
			p.mu.Lock()
			ok = false
		}
		if !ok {
			// Pageable memory would cross to the device no faster than
			// through the staging: give it back.
			if err == nil {
				unix.Munmap(mem)
			}
			p.used -= int64(n)
			return
		}
		// Registered for a request: it counts as activity, so the idle
		// timer does not take it back before it is used.
		p.last = time.Now()
		a := &arena{mem: mem, start: uintptr(unsafe.Pointer(&mem[0])), registered: true, free: []span{{0, n}}}
		a.end = a.start + uintptr(n)
		i, _ := slices.BinarySearchFunc(p.arenas, a.start, func(x *arena, s uintptr) int { return cmpPtr(x.start, s) })
		p.arenas = slices.Insert(p.arenas, i, a)
	}()
}

func (p *hostPool) retain(b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.lent[start]
	if ok {
		l.holds++
		p.lent[start] = l
	}
	return ok
}

func (p *hostPool) free(b []byte) {
	if cap(b) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.lent[start]
	if !ok {
		return // not ours, or already back
	}
	if l.holds > 1 {
		l.holds--
		p.lent[start] = l
		return
	}
	delete(p.lent, start)
	p.last = time.Now()
	p.inUse -= int64(l.n)
	l.a.giveBack(int(start-l.a.start), l.n)
}

// trim keeps the first n bytes of b, lent and held by its caller alone,
// and gives the rest of its units back (memory.Trimmer).
func (p *hostPool) trim(b []byte, n int) []byte {
	n = min(max(n, 0), cap(b))
	if cap(b) == 0 {
		return b[:n]
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	keep := max((n+hostUnit-1)/hostUnit*hostUnit, hostUnit) // a buffer keeps one unit: its key
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.lent[start]
	if !ok || l.holds > 1 || keep >= l.n {
		return b[:n]
	}
	p.inUse -= int64(l.n - keep)
	l.a.giveBack(int(start-l.a.start)+keep, l.n-keep)
	l.n = keep
	p.lent[start] = l
	return b[:n:n]
}

// giveBack returns n bytes at off to the arena's free spans, coalesced
// with their neighbours.
func (a *arena) giveBack(off, n int) {
	a.lentBytes -= n
	i, _ := slices.BinarySearchFunc(a.free, off, func(s span, o int) int { return s.off - o })
	a.free = slices.Insert(a.free, i, span{off, n})
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = slices.Delete(a.free, i+1, i+2)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off {
		a.free[i-1].n += a.free[i].n
		a.free = slices.Delete(a.free, i, i+1)
	}
}

// shrinkWhenIdle gives back the arenas with nothing lent once the pool has
// had no request for p.idle.
func (p *hostPool) shrinkWhenIdle(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(max(p.idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			var drop []*arena
			p.mu.Lock()
			if now.Sub(p.last) >= p.idle && !p.growing && !p.closed {
				drop = p.releaseLocked()
			}
			p.mu.Unlock()
			p.drop(drop)
		}
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

// mapFaulted maps n bytes of anonymous memory and faults them in
// (prefault): what the lent arenas and the rounds' large staging buffers
// are made of before they are registered.
func mapFaulted(n int) ([]byte, error) {
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANONYMOUS|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	prefault(m)
	return m, nil
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
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // refused where transparent huge pages are off
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

// pinned reports whether b lies wholly in one registered arena.
func (d *Decoder) pinned(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	p := &d.host
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	end := start + uintptr(len(b))
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := slices.BinarySearchFunc(p.arenas, start, func(a *arena, s uintptr) int { return cmpPtr(a.start, s) })
	if !ok {
		i-- // the arena starting at or before start
	}
	return i >= 0 && i < len(p.arenas) && start >= p.arenas[i].start && end <= p.arenas[i].end && p.arenas[i].registered
}

// inContext runs f on a locked OS thread with the Decoder's context
// current, under ctxMu's read lock, and reports whether it ran (there is a
// context, and it could be made current).
func (d *Decoder) inContext(f func()) bool {
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
	f()
	return true
}

// register pins b in the Decoder's context.
func (d *Decoder) register(b []byte) bool {
	ok := false
	d.inContext(func() { ok = d.pin(b) })
	return ok
}

// pin registers b with the context current on the caller's OS thread.
func (d *Decoder) pin(b []byte) bool {
	const portable = 1 // CU_MEMHOSTREGISTER_PORTABLE
	return d.cu.cuMemHostRegister(unsafe.Pointer(&b[0]), uint64(len(b)), portable) == cuSuccess
}

// unregister unpins b in the Decoder's context.
func (d *Decoder) unregister(b []byte) {
	d.inContext(func() { d.cu.cuMemHostUnregister(unsafe.Pointer(&b[0])) })
}

// reregister pins every arena again, after a context reset dropped their
// registrations. The caller holds the OS thread with the new context
// current.
func (d *Decoder) reregister() {
	p := &d.host
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.arenas {
		a.registered = d.pin(a.mem)
	}
}

// releaseHost stops the idle timer and gives back the arenas with nothing
// lent, at Close; those with lent buffers stay mapped (their holders may
// still read them).
func (d *Decoder) releaseHost() {
	p := &d.host
	if p.stop != nil {
		close(p.stop)
		<-p.done
		p.stop = nil
	}
	p.mu.Lock()
	p.closed = true
	drop := p.releaseLocked()
	p.mu.Unlock()
	p.drop(drop)
}

// abandon is releaseHost for a Decoder whose device may still be copying
// from or into the arenas: they stay mapped and registered (the process's
// exit frees them), nothing more is registered, and HostAlloc lends
// ordinary memory from now on. It does not wait for the idle timer, which
// may be in a driver call.
func (p *hostPool) abandon() {
	p.mu.Lock()
	p.closed = true
	stop := p.stop
	p.stop = nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
	}
}

// releaseLocked takes every arena with nothing lent out of the pool, for
// drop to unpin and unmap once p.mu is released (the driver's lock, ctxMu,
// is taken before p.mu elsewhere).
func (p *hostPool) releaseLocked() []*arena {
	var drop []*arena
	kept := p.arenas[:0]
	for _, a := range p.arenas {
		if a.lentBytes > 0 {
			kept = append(kept, a)
			continue
		}
		drop = append(drop, a)
		p.used -= int64(len(a.mem))
	}
	clear(p.arenas[len(kept):])
	p.arenas = kept
	return drop
}

func (p *hostPool) drop(arenas []*arena) {
	for _, a := range arenas {
		if p.unregister != nil && a.registered {
			p.unregister(a.mem)
		}
		unix.Munmap(a.mem)
	}
}
