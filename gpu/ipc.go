package gpu

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
)

// This file shares device memory with another process: a Ring is one
// allocation of slots, exported with a CUDA IPC memory handle, with an
// interprocess event per slot that the owner records once a slot is
// written, and the reader's own interprocess events, one per slot (its
// consumer events: slot k's recorded when the reader lets go of slot k),
// which the slot's writes wait for. The reader opens the handle in its own
// context (cuIpcOpenMemHandle) and reads the slots at device speed.

// ipcHandle is CUipcMemHandle and CUipcEventHandle: 64 opaque bytes,
// passed by value to the open calls.
type ipcHandle struct{ w [8]uint64 }

func (h ipcHandle) hex() string {
	b := make([]byte, 64)
	for i, w := range h.w {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	return hex.EncodeToString(b)
}

func parseIPCHandle(s string) (ipcHandle, error) {
	var h ipcHandle
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 64 {
		return h, fmt.Errorf("gpu: IPC handle %q: want 128 hex digits", s)
	}
	for i := range h.w {
		h.w[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return h, nil
}

// ipcLib is the driver's IPC and cross-stream calls, bound at the first
// Ring: a driver without them decodes as before.
type ipcLib struct {
	cuIpcGetMemHandle    func(h *ipcHandle, p uintptr) cuResult
	cuIpcGetEventHandle  func(h *ipcHandle, ev uintptr) cuResult
	cuIpcOpenEventHandle func(ev *uintptr, h ipcHandle) cuResult
	cuStreamWaitEvent    func(s, ev uintptr, flags uint32) cuResult
	cuMemcpyDtoDAsync    func(dst, src uintptr, n uint64, s uintptr) cuResult
	cuDeviceGetPCIBusId  func(id *byte, n int32, dev int32) cuResult
}

var (
	ipcOnce sync.Once
	ipcErr  error
	ipcOf   *ipcLib
)

// ipc returns the IPC calls of the Decoder's driver, bound once.
func (d *Decoder) ipc() (*ipcLib, error) {
	if d.ipcCalls != nil {
		return d.ipcCalls, nil
	}
	ipcOnce.Do(func() {
		l := &ipcLib{}
		for _, s := range []struct {
			fn   any
			name string
		}{
			{&l.cuIpcGetMemHandle, "cuIpcGetMemHandle"},
			{&l.cuIpcGetEventHandle, "cuIpcGetEventHandle"},
			{&l.cuIpcOpenEventHandle, "cuIpcOpenEventHandle"},
			{&l.cuStreamWaitEvent, "cuStreamWaitEvent"},
			{&l.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
			{&l.cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"},
		} {
			if err := register(s.fn, d.cu.handle, s.name); err != nil {
				ipcErr = err
				return
			}
		}
		ipcOf = l
	})
	return ipcOf, ipcErr
}

// PCIBusID is the PCI bus id of the Decoder's GPU, lower case
// ("0000:3b:00.0"): the name of a GPU that every process shares, whatever
// its CUDA_VISIBLE_DEVICES.
func (d *Decoder) PCIBusID() (string, error) {
	l, err := d.ipc()
	if err != nil {
		return "", err
	}
	buf := make([]byte, 64)
	if err := d.cu.check("cuDeviceGetPCIBusId", l.cuDeviceGetPCIBusId(&buf[0], int32(len(buf)), d.dev)); err != nil {
		return "", err
	}
	return strings.ToLower(cString(&buf[0])), nil
}

// ErrRingClosed is returned by a Ring's methods after Close.
var ErrRingClosed = errors.New("gpu: ring closed")

// ErrRingLost is wrapped by a Ring's methods once the Decoder's context
// was rebuilt after a device error: the rebuild freed the ring's memory,
// and its reader must open another.
var ErrRingLost = errors.New("gpu: ring lost")

// Ring is device memory shared with another process: Slots slots of
// SlotBytes each, one allocation counted in the Decoder's device memory
// (Options.DeviceBytes: the rounds' buffers have that much less). Its
// methods may be called for different slots concurrently; one slot's
// calls come one at a time.
type Ring struct {
	d         *Decoder
	l         *ipcLib
	base      uintptr
	bytes     int64
	slotBytes int64
	streams   []uintptr // per slot
	events    []uintptr // per slot: recorded once the slot is written (interprocess)
	copied    []uintptr // per slot: host-waited marks of the slot's copies
	// consumers are the reader's events, per slot, opened from their
	// handles (none: writes wait for nothing).
	consumers []uintptr
	handle    ipcHandle
	evHandles []ipcHandle
	// Timeout bounds a wait for a slot's copies.
	timeout time.Duration
	// reserved: bytes are counted in the Decoder's devHeld and ringHeld
	// (takeRingMemory), until free.
	reserved bool

	mu     sync.Mutex
	closed bool
	// lost wraps ErrRingLost once a context rebuild freed the ring
	// (Decoder.loseRings); stuck is set when a slot's copies did not end
	// in the ring's timeout: the device may still run them, so nothing is
	// queued on the ring again, and its memory is never freed.
	lost, stuck error
}

// NewRing allocates slots slots of slotBytes on the Decoder's GPU, within
// Options.DeviceBytes beside the rounds' buffers, and opens the reader's
// consumer events from their handles (hex), one per slot: slot k's writes
// wait for consumers[k] only, so a fill of one slot never waits for the
// trainer's kernels on another. No consumers: writes wait for nothing.
func (d *Decoder) NewRing(slots int, slotBytes int64, consumers []string) (*Ring, error) {
	if slots < 1 || slotBytes < 1 {
		return nil, fmt.Errorf("gpu: ring of %d slots of %d bytes", slots, slotBytes)
	}
	if len(consumers) != 0 && len(consumers) != slots {
		return nil, fmt.Errorf("gpu: %d consumer events for a ring of %d slots: want one per slot", len(consumers), slots)
	}
	l, err := d.ipc()
	if err != nil {
		return nil, err
	}
	chs := make([]ipcHandle, len(consumers))
	for k, c := range consumers {
		if chs[k], err = parseIPCHandle(c); err != nil {
			return nil, fmt.Errorf("consumer event of slot %d: %w", k, err)
		}
	}
	for try := 0; ; try++ {
		// A context broken by a device fault is rebuilt first: a ring lost
		// to the fault is replaced before the next round comes to do it.
		if err := d.mendIdle(ringRoomWait); err != nil {
			if d.Retired() != nil {
				return nil, fmt.Errorf("gpu: decoding on device %d is off until the daemon restarts: %w", d.opts.Device, err)
			}
			return nil, err
		}
		r, err := d.openRing(l, slots, slotBytes, chs)
		var ce *CUDAError
		if err == nil || !errors.As(err, &ce) || !ce.Sticky() {
			return r, err
		}
		// The fault came where no round saw it yet: recorded, the context
		// is rebuilt and the ring made again, once.
		d.deviceFailed(err)
		if try > 0 {
			return nil, err
		}
	}
}

// openRing makes a ring of slots slots of slotBytes in the Decoder's
// context, its consumer events opened from chs.
func (d *Decoder) openRing(l *ipcLib, slots int, slotBytes int64, chs []ipcHandle) (*Ring, error) {
	n := int64(slots) * slotBytes
	r := &Ring{d: d, l: l, bytes: n, slotBytes: slotBytes, timeout: d.opts.RoundTimeout + 60*time.Second}
	if err := d.takeRingMemory(n, min(r.timeout, ringRoomWait)); err != nil {
		return nil, err
	}
	r.reserved = true
	var runErr error
	ran := d.inContext(func() {
		if runErr = r.init(slots, chs); runErr == nil {
			d.ringsMu.Lock()
			if d.rings == nil {
				d.rings = map[*Ring]struct{}{}
			}
			d.rings[r] = struct{}{}
			d.ringsMu.Unlock()
		}
	})
	if !ran {
		runErr = fmt.Errorf("gpu: device %d has no context", d.opts.Device)
	}
	if runErr != nil {
		d.inContext(r.free)
		r.unreserve() // without a context, free did not run: nothing was allocated
		return nil, runErr
	}
	return r, nil
}

// init allocates the ring's memory, streams and events, and opens the
// reader's consumer events chs, in the Decoder's context on a locked
// thread.
func (r *Ring) init(slots int, chs []ipcHandle) error {
	cu, l := r.d.cu, r.l
	if err := cu.check("cuMemAlloc", cu.cuMemAlloc(&r.base, uint64(r.bytes))); err != nil {
		return err
	}
	if err := cu.check("cuIpcGetMemHandle", l.cuIpcGetMemHandle(&r.handle, r.base)); err != nil {
		return err
	}
	const nonBlocking = 1
	const disableTiming, interprocess, blockingSync = 2, 4, 1
	r.streams = make([]uintptr, slots)
	r.events = make([]uintptr, slots)
	r.copied = make([]uintptr, slots)
	r.evHandles = make([]ipcHandle, slots)
	for k := range slots {
		if err := cu.check("cuStreamCreate", cu.cuStreamCreate(&r.streams[k], nonBlocking)); err != nil {
			return err
		}
		if err := cu.check("cuEventCreate", cu.cuEventCreate(&r.events[k], disableTiming|interprocess)); err != nil {
			return err
		}
		if err := cu.check("cuEventCreate", cu.cuEventCreate(&r.copied[k], disableTiming|blockingSync)); err != nil {
			return err
		}
		// A slot's event is shared recorded (the reader may wait on it
		// before the first fill).
		if err := cu.check("cuEventRecord", cu.cuEventRecord(r.events[k], r.streams[k])); err != nil {
			return err
		}
		if err := cu.check("cuIpcGetEventHandle", l.cuIpcGetEventHandle(&r.evHandles[k], r.events[k])); err != nil {
			return err
		}
	}
	if len(chs) > 0 {
		r.consumers = make([]uintptr, len(chs))
		for k, h := range chs {
			if err := cu.check("cuIpcOpenEventHandle", l.cuIpcOpenEventHandle(&r.consumers[k], h)); err != nil {
				return err
			}
		}
	}
	return nil
}

// free releases what init made. The caller holds the context on a locked
// thread, and nothing is queued on the ring's streams any more.
func (r *Ring) free() {
	cu := r.d.cu
	for _, evs := range [][]uintptr{r.events, r.copied} {
		for _, e := range evs {
			if e != 0 {
				cu.cuEventDestroy(e)
			}
		}
	}
	for _, s := range r.streams {
		if s != 0 {
			cu.cuStreamDestroy(s)
		}
	}
	for _, e := range r.consumers {
		if e != 0 {
			cu.cuEventDestroy(e)
		}
	}
	if r.base != 0 {
		cu.cuMemFree(r.base)
	}
	r.d.ringsMu.Lock()
	delete(r.d.rings, r)
	r.d.ringsMu.Unlock()
	r.unreserve()
	r.base, r.consumers, r.streams, r.events, r.copied = 0, nil, nil, nil, nil
}

// loseRings marks every open ring lost, its bytes no longer counted: the
// context reset about to run frees them. The caller holds ctxMu.
func (d *Decoder) loseRings(cause error) {
	d.ringsMu.Lock()
	defer d.ringsMu.Unlock()
	for r := range d.rings {
		r.mu.Lock()
		r.lost = fmt.Errorf("%w: GPU %d's context was reset after a device error (%v): open a new ring", ErrRingLost, d.opts.Device, cause)
		r.mu.Unlock()
		r.unreserve()
		delete(d.rings, r)
	}
}

// lostErr is the ring's ErrRingLost error, nil while it is not lost.
func (r *Ring) lostErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

// unreserve gives back the ring's bytes counted in the Decoder's memory.
func (r *Ring) unreserve() {
	if r.reserved {
		r.d.devHeld.Add(-r.bytes)
		r.d.ringHeld.Add(-r.bytes)
		r.reserved = false
	}
}

// takeRingMemory counts n bytes of a ring in the Decoder's device memory,
// within Options.DeviceBytes. Where they do not fit beside what the
// rounds' buffers hold, those are given back first (waiting up to wait for
// the rounds in flight): rounds past grew them, and keep them until
// HostIdle, idle (nvCOMP's scratch for rounds of large zstd chunks takes
// gigabytes); the rounds grow them again within what the rings leave
// (roundLimit).
func (d *Decoder) takeRingMemory(n int64, wait time.Duration) error {
	if d.takeDevice(n) {
		d.ringHeld.Add(n)
		return nil
	}
	sets, ok := d.holdSets(wait)
	if ok {
		d.trim()
		d.roundCap.Store(0) // what a cut made room beside is gone
	}
	took := d.takeDevice(n)
	if took {
		d.ringHeld.Add(n)
	}
	held := d.devHeld.Load()
	for _, s := range sets {
		d.free <- s
	}
	if !took {
		return fmt.Errorf("%w: a ring of %d bytes beside %d held, budget %d (--gpu-memory)", ErrBudget, n, held, d.opts.DeviceBytes)
	}
	return nil
}

// ringRoomWait bounds what opening a ring waits for the rounds in flight
// to give their buffers back; the submitter, readying a round alone, may
// hold sets it waits for meanwhile (holdSets).
const ringRoomWait = 10 * time.Second

// takeDevice counts n bytes more in devHeld if they fit DeviceBytes.
func (d *Decoder) takeDevice(n int64) bool {
	for {
		held := d.devHeld.Load()
		if held+n > d.opts.DeviceBytes {
			return false
		}
		if d.devHeld.CompareAndSwap(held, held+n) {
			return true
		}
	}
}

// holdSets takes every buffer set, waiting up to wait for the rounds in
// flight; on false it holds none (what it took is given back). A
// submitter that readies a round alone holds sets and waits for the rest
// too: the bound breaks that tie in its favour.
func (d *Decoder) holdSets(wait time.Duration) ([]int, bool) {
	held := make([]int, 0, len(d.sets))
	t := time.NewTimer(wait)
	defer t.Stop()
	for len(held) < len(d.sets) {
		select {
		case s := <-d.free:
			held = append(held, s)
			continue
		case <-t.C:
		case <-d.hungCh:
		case <-d.stopped:
		}
		for _, s := range held {
			d.free <- s
		}
		return nil, false
	}
	if d.hung.Load() {
		// What the buffers hold may still be in use: never freed.
		return held, false
	}
	return held, true
}

// Handle is the ring's CUDA IPC memory handle, hex.
func (r *Ring) Handle() string { return r.handle.hex() }

// EventHandles are the slots' interprocess events, hex.
func (r *Ring) EventHandles() []string {
	out := make([]string, len(r.evHandles))
	for i, h := range r.evHandles {
		out[i] = h.hex()
	}
	return out
}

// Bytes is the ring's size; Device the Decoder's ordinal.
func (r *Ring) Bytes() int64 { return r.bytes }
func (r *Ring) Device() int  { return r.d.opts.Device }

// Addr is the device address of slot k at off.
func (r *Ring) Addr(k int, off int64) uintptr {
	return r.base + uintptr(int64(k)*r.slotBytes+off)
}

// call runs f in the Decoder's context unless the ring is closed, lost or
// stuck. f runs under the context's read lock: it must not wait for the
// device (a rebuild of the context waits for it).
func (r *Ring) call(f func() error) error {
	return r.inContext(func() error {
		r.mu.Lock()
		closed, stuck := r.closed, r.stuck
		r.mu.Unlock()
		if closed {
			return ErrRingClosed
		}
		if stuck != nil {
			return stuck
		}
		return f()
	})
}

// inContext runs f in the Decoder's context unless the ring is lost (the
// check and f under the context's read lock, so no rebuild comes between).
func (r *Ring) inContext(f func() error) error {
	var err error
	if !r.d.inContext(func() {
		if err = r.lostErr(); err == nil {
			err = f()
		}
	}) {
		if err := r.lostErr(); err != nil {
			return err
		}
		return fmt.Errorf("gpu: device %d has no context", r.d.opts.Device)
	}
	return err
}

// Begin makes slot k's stream wait for the reader's consumer event of
// slot k as recorded now: what its kernels queued on the slot before it
// let go of it is done before anything writes the slot.
func (r *Ring) Begin(k int) error {
	if r.consumers == nil {
		return nil
	}
	return r.call(func() error {
		return r.d.cu.check("cuStreamWaitEvent", r.l.cuStreamWaitEvent(r.streams[k], r.consumers[k], 0))
	})
}

// Write copies host bytes b (pinned for a copy at full speed) into slot k
// at off, on the slot's stream, and returns once they are copied (b may
// then be reused). Nothing is queued before the reader's consumer event
// of the slot is done (waited for on the host, until ctx ends or the
// ring's timeout): a copy queued behind a trainer that never lets go
// would outlive the call and read b after the caller reused it. A copy
// that still does not end in the ring's timeout (a device that stopped)
// keeps a hold on b (when HostAlloc lent it) until it ends, and the ring
// takes no more work.
func (r *Ring) Write(ctx context.Context, k int, off int64, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if off < 0 || off+int64(len(b)) > r.slotBytes {
		return fmt.Errorf("gpu: a write of %d bytes at %d passes slot %d's %d bytes", len(b), off, k, r.slotBytes)
	}
	if err := r.awaitConsumer(ctx, k); err != nil {
		return err
	}
	err := r.call(func() error {
		cu := r.d.cu
		if err := cu.check("cuMemcpyHtoDAsync", cu.cuMemcpyHtoDAsync(r.Addr(k, off), unsafe.Pointer(&b[0]), uint64(len(b)), r.streams[k])); err != nil {
			return err
		}
		return cu.check("cuEventRecord", cu.cuEventRecord(r.copied[k], r.streams[k]))
	})
	if err != nil {
		return err
	}
	return r.await(k, b)
}

// Copy copies n device bytes at src into slot k at off, on the slot's
// stream, once the reader's consumer event of the slot is done (as
// Write), and returns once they are copied.
func (r *Ring) Copy(ctx context.Context, k int, off int64, src uintptr, n int64) error {
	if off < 0 || off+n > r.slotBytes {
		return fmt.Errorf("gpu: a copy of %d bytes at %d passes slot %d's %d bytes", n, off, k, r.slotBytes)
	}
	if err := r.awaitConsumer(ctx, k); err != nil {
		return err
	}
	err := r.call(func() error {
		if err := r.d.cu.check("cuMemcpyDtoDAsync", r.l.cuMemcpyDtoDAsync(r.Addr(k, off), src, uint64(n), r.streams[k])); err != nil {
			return err
		}
		return r.d.cu.check("cuEventRecord", r.d.cu.cuEventRecord(r.copied[k], r.streams[k]))
	})
	if err != nil {
		return err
	}
	return r.await(k, nil)
}

// await waits, within the ring's timeout, for slot k's copies queued
// before copied[k] was recorded, polling outside the context's lock. Past
// the timeout, or at once where the watchdog retired the device (a kernel
// that does not end, which the copies may wait behind for good), the ring
// is stuck, and host memory b the copies read (nil: none) stays held
// until they end.
func (r *Ring) await(k int, b []byte) error {
	deadline := time.Now().Add(r.timeout)
	for {
		done, err := r.copiedDone(k)
		if err != nil || done {
			return err
		}
		switch {
		case r.d.hung.Load():
			// Retired: the device stopped answering, and the copies may
			// wait behind its kernel for good.
			err = fmt.Errorf("gpu: slot %d's copies not done on a device that stopped answering (%w): the ring takes no more work", k, r.d.Retired())
		case time.Now().After(deadline):
			err = fmt.Errorf("gpu: slot %d's copies not done in %v: the ring takes no more work", k, r.timeout)
		}
		if err != nil {
			r.mu.Lock()
			r.stuck = err
			r.mu.Unlock()
			if b != nil && r.d.Retain(b) {
				go r.holdUntilCopied(k, b)
			}
			return err
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// copiedDone reports whether slot k's copied event is done.
func (r *Ring) copiedDone(k int) (bool, error) {
	var done bool
	err := r.inContext(func() error {
		switch res := r.d.cu.cuEventQuery(r.copied[k]); res {
		case cuSuccess:
			done = true
		case cuErrNotReady:
		default:
			return r.d.cu.check("cuEventQuery", res)
		}
		return nil
	})
	return done, err
}

// holdUntilCopied gives back the hold await took on b once slot k's
// copies end, or the ring is lost (a context reset ended them); never
// while the device may still read b.
func (r *Ring) holdUntilCopied(k int, b []byte) {
	for {
		time.Sleep(100 * time.Millisecond)
		done, err := r.copiedDone(k)
		switch {
		case done, errors.Is(err, ErrRingLost):
			r.d.HostFree(b)
			return
		case err != nil || r.d.Retired() != nil:
			return
		}
	}
}

// Done records slot k's event: the reader's stream waits for it before
// reading the slot.
func (r *Ring) Done(k int) error {
	return r.call(func() error {
		return r.d.cu.check("cuEventRecord", r.d.cu.cuEventRecord(r.events[k], r.streams[k]))
	})
}

// Close frees the ring once its streams are idle (within the ring's
// timeout; past it, when the ring is stuck, or on a device the watchdog
// retired, the memory is left allocated, as a device that does not finish
// may still write it). A lost ring has nothing left to free. The reader
// must have closed its handle.
func (r *Ring) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	stuck := r.stuck
	r.mu.Unlock()
	if r.d.hung.Load() {
		// Freeing device memory waits for the whole device (cuMemFree
		// synchronizes it), here for a kernel that does not end: the
		// ring goes with the process, as the Decoder's memory does.
		return fmt.Errorf("gpu: ring left allocated on a device that stopped answering: %w", r.d.Retired())
	}
	for k := 0; stuck != nil && k < len(r.streams); k++ {
		// Freed only once the copies that were late are done.
		if done, err := r.copiedDone(k); err != nil || !done {
			return cmp.Or(err, stuck)
		}
	}
	err := r.inContext(func() error {
		for k := range r.streams {
			if err := r.d.cu.check("cuEventRecord", r.d.cu.cuEventRecord(r.copied[k], r.streams[k])); err != nil {
				return err
			}
		}
		return nil
	})
	for k := 0; err == nil && k < len(r.streams); k++ {
		err = r.await(k, nil)
	}
	if err == nil {
		err = r.inContext(func() error { r.free(); return nil })
	}
	if errors.Is(err, ErrRingLost) {
		return nil
	}
	return err
}

// Decode decodes jobs on the ring's GPU straight into slot k: job i's
// decoded bytes go to offs[i] of the slot (offs[i] < 0: to its Dst, as
// DecodeBatch). It is DecodeRuns with one run a job.
func (r *Ring) Decode(ctx context.Context, k int, jobs []codec.Job, offs []int64, times *RingTimes) error {
	runs := make([][]Run, len(offs))
	for i, off := range offs {
		if off >= 0 && i < len(jobs) && len(jobs[i].Dst) > 0 {
			runs[i] = []Run{{At: off, N: int64(len(jobs[i].Dst))}}
		}
	}
	return r.DecodeRuns(ctx, k, jobs, runs, times)
}

// A Run is N bytes of a decoded chunk, from its byte From, bound for byte
// At of a ring's slot (Ring.DecodeRuns).
type Run struct{ From, At, N int64 }

// devRun is a Run on the device: to is the address of its slot's bytes.
type devRun struct {
	to      uintptr
	from, n int64
}

// DecodeRuns decodes jobs on the ring's GPU straight into slot k: the
// runs[i] of job i's decoded bytes go where each says in the slot (the
// whole chunk at one offset, or the steps of a chunk of several time steps
// that the slot's samples take), never through host memory, once the
// reader's consumer event is done; a job with no runs goes to its Dst, as
// DecodeBatch. The rest of a chunk's bytes go nowhere. Only chunks whose
// every check is made before decoding (LZ4 walked, blosc framing parsed)
// or on the device (a zstd frame's content checksum, by xxh64_check when
// the PTX has it) go there: one the host must verify over its decoded
// bytes (a deflate CRC; a zstd checksum with PTX from before the kernel)
// fails with ErrUnsupported, as does anything DecodeBatch leaves to the
// CPU; the caller decodes those elsewhere. A job's Dst gives its decoded
// length, and is neither read nor written when it goes to the slot. It
// returns when the bytes are in the slot. LZ4 blocks are walked on the
// device (Options.WalkOnDevice's kernel), not on the host: the host's CPU
// is what the device path is there to save. times, when not nil, gets
// where the call's time went.
func (r *Ring) DecodeRuns(ctx context.Context, k int, jobs []codec.Job, runs [][]Run, times *RingTimes) error {
	// An error before the jobs reach the device leaves every one of them
	// to the caller, as a failed round does: none is taken for decoded.
	failAll := func(err error) error {
		for i := range jobs {
			jobs[i].Err = fmt.Errorf("gpu: not decoded into the ring: %w: %w", codec.ErrUnsupported, err)
		}
		return err
	}
	if len(runs) != len(jobs) {
		return failAll(fmt.Errorf("gpu: Ring.DecodeRuns with %d jobs and %d run lists", len(jobs), len(runs)))
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return failAll(ErrRingClosed)
	}
	dev := make([][]devRun, len(jobs))
	for i, rs := range runs {
		n := int64(len(jobs[i].Dst))
		for _, run := range rs {
			if run.N <= 0 || run.From < 0 || run.From+run.N > n || run.At < 0 || run.At+run.N > r.slotBytes {
				return failAll(fmt.Errorf("gpu: a run of %d bytes from %d of a %d-byte chunk to %d passes the chunk or slot %d's %d bytes",
					run.N, run.From, n, run.At, k, r.slotBytes))
			}
			dev[i] = append(dev[i], devRun{to: r.Addr(k, run.At), from: run.From, n: run.N})
		}
	}
	// The reader's kernels on the slot's last batch finish first, waited
	// for here, on the host, within the ring's timeout: a round held on
	// the device for a long training step would trip the watchdog, which
	// gives up on the GPU.
	t0 := time.Now()
	err := r.awaitConsumer(ctx, k)
	if times != nil {
		times.Consumer += time.Since(t0)
	}
	if err != nil {
		return failAll(err)
	}
	return r.d.decodeBatch(ctx, jobs, 0, &ringCall{ring: r, dev: dev, times: times})
}

// LargestPiece is the decoded size of the largest part of chunk j that
// nvCOMP decodes alone (a zstd frame, an LZ4 block, a blosc stream), or 0
// where the GPU path does not read its framing. nvCOMP decodes a round's
// parts side by side, but each part on its own: a round takes at least
// its largest part's time, however idle the rest of the GPU, and for a
// large part a host core may be the sooner (package deliver decodes such
// chunks on idle cores). It reads j's framing only.
func LargestPiece(j *codec.Job) int64 {
	p := frame(j)
	if p.err != nil {
		return 0
	}
	var most int64
	for _, pc := range p.pieces {
		if pc.algo != rawPiece {
			most = max(most, pc.n)
		}
	}
	return most
}

// awaitConsumer waits until the reader's consumer event of slot k, as
// recorded when it let go of the slot, is done, or ctx ends.
func (r *Ring) awaitConsumer(ctx context.Context, k int) error {
	if r.consumers == nil {
		return nil
	}
	ev := r.consumers[k]
	deadline := time.Now().Add(r.timeout)
	for {
		var res cuResult
		if err := r.call(func() error { res = r.d.cu.cuEventQuery(ev); return nil }); err != nil {
			return err
		}
		switch res {
		case cuSuccess:
			return nil
		case cuErrNotReady:
		default:
			return r.d.cu.check("cuEventQuery", res)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gpu: the reader's consumer event of slot %d not done in %v", k, r.timeout)
		}
		if r.d.hung.Load() {
			// The reader's stream may wait for this ring's work, behind
			// the kernel that does not end.
			return fmt.Errorf("gpu: the reader's consumer event of slot %d not done on a device that stopped answering: %w", k, r.d.Retired())
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// copyOnDevice queues a device-to-device copy of n bytes on stream.
func (d *Decoder) copyOnDevice(dst, src uintptr, n int64, stream uintptr) error {
	l, err := d.ipc()
	if err != nil {
		return err
	}
	if err := d.cu.check("cuMemcpyDtoDAsync", l.cuMemcpyDtoDAsync(dst, src, uint64(n), stream)); err != nil {
		return d.deviceFailed(err)
	}
	return nil
}
