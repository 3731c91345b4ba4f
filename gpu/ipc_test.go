package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/zarrfs/zarrfs/codec"
)

// fakeIPC is the driver's IPC calls over the fake GPU: handles carry the
// address or event they name, and the waits a stream was told to do are
// recorded.
type fakeIPC struct {
	f     *fakeGPU
	mu    sync.Mutex
	waits []uintptr // consumer events streams were told to wait for
}

func (x *fakeIPC) lib() *ipcLib {
	return &ipcLib{
		cuIpcGetMemHandle:   func(h *ipcHandle, p uintptr) cuResult { h.w[0] = uint64(p); return cuSuccess },
		cuIpcGetEventHandle: func(h *ipcHandle, ev uintptr) cuResult { h.w[0], h.w[1] = uint64(ev), 0xe7e7; return cuSuccess },
		cuIpcOpenEventHandle: func(ev *uintptr, h ipcHandle) cuResult {
			*ev = uintptr(h.w[0])
			return cuSuccess
		},
		cuStreamWaitEvent: func(s, ev uintptr, flags uint32) cuResult {
			x.mu.Lock()
			x.waits = append(x.waits, ev)
			x.mu.Unlock()
			return cuSuccess
		},
		cuMemcpyDtoDAsync: func(dst, src uintptr, n uint64, s uintptr) cuResult {
			if x.f.idle {
				return cuSuccess
			}
			to, from := x.f.devBytes("cuMemcpyDtoDAsync", uint64(dst), n), x.f.devBytes("cuMemcpyDtoDAsync", uint64(src), n)
			if to == nil || from == nil {
				return cuErrInvalidValue
			}
			copy(to, from)
			return cuSuccess
		},
		cuDeviceGetPCIBusId: func(id *byte, n int32, dev int32) cuResult {
			copy(unsafe.Slice(id, n), "0000:3B:00.0\x00")
			return cuSuccess
		},
	}
}

func ringDecoder(t *testing.T, opts Options) (*Decoder, *fakeGPU, *fakeIPC) {
	t.Helper()
	f := newFakeGPU()
	d := f.decoder(t, opts)
	x := &fakeIPC{f: f}
	d.ipcCalls = x.lib()
	return d, f, x
}

// A ring is one device allocation counted in the Decoder's device memory;
// writes land in their slot after the reader's consumer event; Close gives
// the memory back.
func TestRingOnTheDevice(t *testing.T) {
	d, f, x := ringDecoder(t, Options{DeviceBytes: 64 << 20})
	if id, err := d.PCIBusID(); err != nil || id != "0000:3b:00.0" {
		t.Fatalf("PCIBusID %q, %v", id, err)
	}
	if _, err := d.NewRing(4, 32<<20, nil); !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "--gpu-memory") {
		t.Fatalf("a ring over the device budget: %v", err)
	}
	before, _, _ := d.MemoryHeld()
	if _, err := d.NewRing(3, 1<<20, consumerEvents(0xc0ffee, 2)); err == nil || !strings.Contains(err.Error(), "one per slot") {
		t.Fatalf("a ring of 3 slots with 2 consumer events: %v", err)
	}
	r, err := d.NewRing(3, 1<<20, consumerEvents(0xc0ffee, 3))
	if err != nil {
		t.Fatal(err)
	}
	if held, _, _ := d.MemoryHeld(); held != before+3<<20 {
		t.Fatalf("device memory held %d, want %d with the ring", held, before+3<<20)
	}
	if h, _ := parseIPCHandle(r.Handle()); uintptr(h.w[0]) != r.Addr(0, 0) || len(r.EventHandles()) != 3 {
		t.Fatalf("handles %s %v", r.Handle(), r.EventHandles())
	}
	src := d.HostAllocWait(4096, 5*time.Second)
	defer d.HostFree(src)
	for i := range src {
		src[i] = byte(i * 13)
	}
	if err := r.Begin(1); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Write(ctx, 1, 8192, src); err != nil {
		t.Fatal(err)
	}
	if err := r.Copy(ctx, 2, 0, r.Addr(1, 8192), 4096); err != nil {
		t.Fatal(err)
	}
	if err := r.Done(1); err != nil {
		t.Fatal(err)
	}
	for _, at := range []uintptr{r.Addr(1, 8192), r.Addr(2, 0)} {
		if got := f.devBytes("check", uint64(at), 4096); !bytes.Equal(got, src) {
			t.Fatalf("slot bytes at %#x differ from what was written", at)
		}
	}
	if len(x.waits) != 1 || x.waits[0] != 0xc0ffee+1 {
		t.Fatalf("the slot's writes waited for %v, want slot 1's consumer event once", x.waits)
	}
	if err := r.Write(ctx, 0, 1<<20-10, src[:11]); err == nil {
		t.Fatal("a write past its slot was accepted")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if held, _, _ := d.MemoryHeld(); held != before {
		t.Fatalf("device memory held %d after Close, want %d", held, before)
	}
	if err := r.Write(ctx, 1, 0, src); !errors.Is(err, ErrRingClosed) {
		t.Fatalf("write after Close: %v", err)
	}
	// A decode that never reaches the device leaves every job to the
	// caller: none may pass for decoded into the slot.
	jobs := []codec.Job{{Codec: codec.LZ4, Src: compress(codec.LZ4, src), Dst: make([]byte, len(src))}}
	if err := r.Decode(context.Background(), 1, jobs, []int64{0}, nil); !errors.Is(err, ErrRingClosed) ||
		!errors.Is(jobs[0].Err, codec.ErrUnsupported) || !errors.Is(jobs[0].Err, ErrRingClosed) {
		t.Fatalf("decode into a closed ring: %v, the job's %v", err, jobs[0].Err)
	}
}

// consumerEvents are n consumer event handles naming events first,
// first+1, ... (the fake driver opens a handle as the event it names).
func consumerEvents(first uint64, n int) []string {
	out := make([]string, n)
	for k := range out {
		out[k] = ipcHandle{w: [8]uint64{first + uint64(k)}}.hex()
	}
	return out
}

// A slot's writes and decodes wait for the reader's consumer event of that
// slot only: while the trainer's kernels still read slot 1 (its event not
// done), slot 0 is filled at once, and slot 1's decode waits until they
// are done.
func TestRingSlotWaitsForItsOwnConsumer(t *testing.T) {
	d, f, x := ringDecoder(t, Options{})
	r, err := d.NewRing(2, 1<<20, consumerEvents(0x5107, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f.setBusy(0x5107+1, true)
	a := field(32, 64, 3)
	enc := compress(codec.LZ4, a)
	job := func() []codec.Job {
		src := d.HostAllocWait(len(enc), 5*time.Second)
		t.Cleanup(func() { d.HostFree(src) })
		copy(src, enc)
		return []codec.Job{{Codec: codec.LZ4, Src: src, Dst: make([]byte, len(a))}}
	}
	for k := range 2 {
		if err := r.Begin(k); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(x.waits) != fmt.Sprint([]uintptr{0x5107, 0x5108}) {
		t.Fatalf("slots 0 and 1 waited for events %#x, want each its own", x.waits)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j0 := job()
	if err := r.Decode(ctx, 0, j0, []int64{0}, nil); err != nil || j0[0].Err != nil {
		t.Fatalf("slot 0 while slot 1's consumer is busy: %v, %v", err, j0[0].Err)
	}
	if got := f.devBytes("check", uint64(r.Addr(0, 0)), uint64(len(a))); !bytes.Equal(got, a) {
		t.Fatal("slot 0's bytes differ from the chunk's")
	}
	done := make(chan error, 1)
	j1 := job()
	go func() { done <- r.Decode(ctx, 1, j1, []int64{0}, nil) }()
	select {
	case err := <-done:
		t.Fatalf("slot 1 decoded while its consumer event was not done: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	f.setBusy(0x5107+1, false)
	if err := <-done; err != nil || j1[0].Err != nil {
		t.Fatalf("slot 1 once its consumer is done: %v, %v", err, j1[0].Err)
	}
	// A fill whose connection goes does not wait out the ring's timeout
	// for a consumer that never comes.
	f.setBusy(0x5107, true)
	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, ccancel)
	if err := r.Decode(cctx, 0, job(), []int64{0}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("a decode whose context ended while the consumer was busy: %v", err)
	}
}

// A write into a slot whose reader still uses it (its consumer event not
// done) waits on the host, queueing nothing: a copy queued behind the
// trainer would outlive the call, and read its buffer after the caller
// lent it to another fill. The wait ends with the ring's timeout, or the
// caller's context.
func TestRingWriteQueuesNothingBeforeTheConsumer(t *testing.T) {
	d, f, _ := ringDecoder(t, Options{})
	r, err := d.NewRing(2, 1<<20, consumerEvents(0x7e57, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var queued atomic.Int64
	copyNow := d.cu.cuMemcpyHtoDAsync
	d.cu.cuMemcpyHtoDAsync = func(dst uintptr, src unsafe.Pointer, n uint64, s uintptr) cuResult {
		queued.Add(1)
		return copyNow(dst, src, n, s)
	}
	b := d.HostAllocWait(4096, 5*time.Second)
	defer d.HostFree(b)
	for i := range b {
		b[i] = 0x11
	}
	f.setBusy(0x7e57, true) // the trainer's kernels still read slot 0
	if err := r.Begin(0); err != nil {
		t.Fatal(err)
	}
	r.timeout = 100 * time.Millisecond
	if err := r.Write(context.Background(), 0, 0, b); err == nil || queued.Load() != 0 {
		t.Fatalf("a write while the slot's consumer is busy: %v, %d copies queued", err, queued.Load())
	}
	r.timeout = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := r.Write(ctx, 0, 0, b); !errors.Is(err, context.Canceled) || queued.Load() != 0 {
		t.Fatalf("a write whose context ended while the consumer was busy: %v, %d copies queued", err, queued.Load())
	}
	f.setBusy(0x7e57, false)
	if err := r.Write(context.Background(), 0, 0, b); err != nil || queued.Load() != 1 {
		t.Fatalf("a write once the consumer is done: %v, %d copies queued", err, queued.Load())
	}
	if got := f.devBytes("check", uint64(r.Addr(0, 0)), 4096); !bytes.Equal(got, b) {
		t.Fatal("slot 0 does not hold the write's bytes")
	}
}

// A copy that does not end in the ring's timeout (a device that stopped)
// keeps the buffer it reads from: the caller's HostFree does not lend it
// again until the copy ends. The ring takes no more work meanwhile, and
// is freed once the late copy is done.
func TestRingLateCopyHoldsItsBuffer(t *testing.T) {
	d, f, _ := ringDecoder(t, Options{})
	r, err := d.NewRing(2, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.timeout = 100 * time.Millisecond
	b := d.HostAllocWait(4096, 5*time.Second)
	lent := d.HostLent()
	f.setBusy(r.copied[0], true) // the copy does not end
	if err := r.Write(context.Background(), 0, 0, b); err == nil {
		t.Fatal("a write whose copy never ended returned no error")
	}
	d.HostFree(b) // as every caller does, error or not
	if d.HostLent() != lent {
		t.Fatalf("pinned memory lent %d after the caller gave the buffer back, want %d: the late copy's buffer went back", d.HostLent(), lent)
	}
	if err := r.Write(context.Background(), 1, 0, make([]byte, 16)); err == nil || !strings.Contains(err.Error(), "no more work") {
		t.Fatalf("a write into a stuck ring: %v", err)
	}
	if err := r.Close(); err == nil {
		t.Fatal("a stuck ring closed while its copy is not done")
	}
	f.setBusy(r.copied[0], false)
	deadline := time.Now().Add(5 * time.Second)
	for d.HostLent() == lent && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if d.HostLent() >= lent {
		t.Fatalf("pinned memory lent %d once the late copy ended, want less than %d", d.HostLent(), lent)
	}
	r.mu.Lock()
	r.closed = false // Close again, now that the copy is done: it frees the ring
	r.mu.Unlock()
	if err := r.Close(); err != nil {
		t.Fatalf("closing the ring once the late copy ended: %v", err)
	}
}

// A device the watchdog retired (a kernel that does not end) holds no
// ring's Write or Close: copies queued behind the kernel may never end, so
// the ring is stuck at once, and no ring is freed (cuMemFree would wait
// for the kernel), its memory left to the process's exit; the next ring
// open says the GPU is off until the daemon restarts. A daemon's shutdown
// waits for its rings' Close.
func TestRingOnARetiredDevice(t *testing.T) {
	d, f, _ := ringDecoder(t, Options{DeviceBytes: 64 << 20})
	r, err := d.NewRing(2, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.timeout < time.Minute {
		t.Fatalf("the ring's timeout is %v: the test needs one past its own waits", r.timeout)
	}
	idle, err := d.NewRing(2, 1<<20, nil) // nothing queued on it
	if err != nil {
		t.Fatal(err)
	}
	// A ring whose reader's kernels on slot 0 wait behind the hung one:
	// its consumer event never ends.
	read, err := d.NewRing(2, 1<<20, consumerEvents(0x7e57, 2))
	if err != nil {
		t.Fatal(err)
	}
	f.setBusy(0x7e57, true)
	b := d.HostAllocWait(4096, 5*time.Second)
	defer d.HostFree(b)
	f.setBusy(r.copied[0], true) // queued behind the kernel that does not end
	d.retire(fmt.Errorf("%w: a round of 1 chunks was not done by its deadline", ErrHung))
	// Freeing waits for the whole device (cuMemFree synchronizes it): a
	// ring with nothing queued is left allocated too.
	f.mu.Lock()
	allocated := len(f.dev)
	f.mu.Unlock()
	if err := idle.Close(); !errors.Is(err, ErrHung) {
		t.Fatalf("closing an idle ring on a retired device: %v, want ErrHung", err)
	}
	f.mu.Lock()
	freed := allocated - len(f.dev)
	f.mu.Unlock()
	if freed != 0 {
		t.Fatalf("%d device allocations freed on a retired device", freed)
	}
	t0 := time.Now()
	if err := r.Write(context.Background(), 0, 0, b); !errors.Is(err, ErrHung) {
		t.Fatalf("a write whose copy waits behind the hung kernel: %v, want ErrHung", err)
	}
	if err := r.Close(); !errors.Is(err, ErrHung) {
		t.Fatalf("closing the ring: %v, want ErrHung", err)
	}
	data := bytes.Repeat([]byte("behind the hung kernel"), 512)
	enc := compress(codec.LZ4, data)
	src := d.HostAllocWait(len(enc), 5*time.Second)
	defer d.HostFree(src)
	copy(src, enc)
	jobs := []codec.Job{{Codec: codec.LZ4, Src: src, Dst: make([]byte, len(data))}}
	if err := read.Decode(context.Background(), 0, jobs, []int64{0}, nil); !errors.Is(err, ErrHung) {
		t.Fatalf("a decode waiting for a consumer behind the hung kernel: %v, want ErrHung", err)
	}
	if took := time.Since(t0); took > 10*time.Second {
		t.Fatalf("the write, close and decode took %v on a retired device", took)
	}
	_, err = d.NewRing(2, 1<<20, nil)
	if !errors.Is(err, ErrHung) || !strings.Contains(err.Error(), "off until the daemon restarts") {
		t.Fatalf("a ring open on a retired device: %v", err)
	}
}

// A device fault poisons the context: a reader whose ring it lost opens
// the next one before any round rebuilds the context, and gets it, the
// context rebuilt by NewRing, whether a round recorded the fault first or
// the ring's allocation is the first to meet it.
func TestNewRingAfterADeviceFault(t *testing.T) {
	for _, recorded := range []bool{true, false} {
		t.Run(fmt.Sprintf("recorded=%v", recorded), func(t *testing.T) {
			d, f, _ := ringDecoder(t, Options{DeviceBytes: 64 << 20, RoundTimeout: 300 * time.Millisecond})
			lost, err := d.NewRing(2, 1<<20, nil)
			if err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			f.poisoned = true
			f.mu.Unlock()
			if recorded {
				d.deviceFailed(&CUDAError{Op: "cuEventSynchronize", Code: 700, Name: "CUDA_ERROR_ILLEGAL_ADDRESS"})
			}
			r, err := d.NewRing(2, 1<<20, nil)
			if err != nil {
				t.Fatalf("a ring after the fault: %v", err)
			}
			defer r.Close()
			if err := d.Retired(); err != nil {
				t.Fatalf("retired: %v", err)
			}
			if err := lost.Write(context.Background(), 0, 0, make([]byte, 64)); !errors.Is(err, ErrRingLost) {
				t.Fatalf("the ring from before the rebuild: %v", err)
			}
			data := bytes.Repeat([]byte("after the fault"), 4096)
			jobs := []codec.Job{{Codec: codec.LZ4, Src: compress(codec.LZ4, data), Dst: make([]byte, len(data))}}
			if err := r.Decode(context.Background(), 1, jobs, []int64{0}, nil); err != nil || jobs[0].Err != nil {
				t.Fatalf("a decode into the new ring: %v, %v", err, jobs[0].Err)
			}
			if got := f.devBytes("check", uint64(r.Addr(1, 0)), uint64(len(data))); !bytes.Equal(got, data) {
				t.Fatal("the new ring's slot does not hold the decoded chunk")
			}
		})
	}
}

// A rebuild that the driver does not finish is bounded as a round is: the
// GPU retires at the limit (its callers go to the CPU), and the ring open
// that rebuilt says so once the driver answers.
func TestNewRingRebuildStuck(t *testing.T) {
	d, f, _ := ringDecoder(t, Options{DeviceBytes: 64 << 20, RoundTimeout: 200 * time.Millisecond})
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release() // the driver answers before the test ends, whatever it found
	f.mu.Lock()
	f.resetHold = hold
	f.mu.Unlock()
	d.deviceFailed(&CUDAError{Op: "cuEventSynchronize", Code: 700, Name: "CUDA_ERROR_ILLEGAL_ADDRESS"})
	opened := make(chan error, 1)
	go func() {
		r, err := d.NewRing(2, 1<<20, nil)
		if r != nil {
			r.Close()
		}
		opened <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for d.Retired() == nil {
		if time.Now().After(deadline) {
			t.Fatal("a rebuild stuck in the driver did not retire the GPU")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := d.Retired(); !errors.Is(err, ErrHung) {
		t.Fatalf("retired: %v, want ErrHung", err)
	}
	release()
	if err := <-opened; !errors.Is(err, ErrHung) {
		t.Fatalf("the ring open that rebuilt: %v, want the retirement", err)
	}
}

// A context rebuild (after a sticky device error) frees every ring's
// memory, and the addresses come back in other allocations: a ring opened
// before it is lost. Its writes, copies and decodes fail with ErrRingLost
// (nothing lands at its old addresses), its bytes are no longer counted,
// and its Close frees nothing. A write waiting for its copy does not hold
// the rebuild back.
func TestRingLostToAContextRebuild(t *testing.T) {
	d, f, _ := ringDecoder(t, Options{DeviceBytes: 64 << 20, RoundTimeout: 300 * time.Millisecond})
	r, err := d.NewRing(2, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := d.HostAllocWait(4096, 5*time.Second)
	defer d.HostFree(b)
	f.setBusy(r.copied[0], true) // slot 0's copy waits
	waiting := make(chan error, 1)
	go func() { waiting <- r.Write(context.Background(), 0, 0, b) }()
	time.Sleep(50 * time.Millisecond)
	d.stateMu.Lock()
	d.broken = &CUDAError{Op: "cuLaunchKernel", Code: 700, Name: "CUDA_ERROR_ILLEGAL_ADDRESS"}
	d.stateMu.Unlock()
	data := bytes.Repeat([]byte("zarrfs"), 4096)
	jobs := []codec.Job{{Codec: codec.LZ4, Src: compress(codec.LZ4, data), Dst: make([]byte, len(data))}}
	if err := d.DecodeBatch(context.Background(), jobs); err != nil || jobs[0].Err != nil {
		t.Fatalf("the round after the error: %v, %v", err, jobs[0].Err)
	}
	if err := d.Retired(); err != nil {
		t.Fatalf("a write waiting for its copy held the rebuild back past the watchdog: %v", err)
	}
	if err := <-waiting; !errors.Is(err, ErrRingLost) {
		t.Fatalf("the write waiting through the rebuild: %v", err)
	}
	if held := d.ringHeld.Load(); held != 0 {
		t.Fatalf("rings hold %d bytes of device memory after the rebuild lost the only one", held)
	}
	r2, err := d.NewRing(2, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	for i := range b {
		b[i] = 0xee
	}
	if err := r.Write(context.Background(), 1, 0, b); !errors.Is(err, ErrRingLost) || !strings.Contains(err.Error(), "open a new ring") {
		t.Fatalf("a write into the lost ring: %v", err)
	}
	if err := r.Copy(context.Background(), 1, 0, r2.Addr(0, 0), 16); !errors.Is(err, ErrRingLost) {
		t.Fatalf("a copy into the lost ring: %v", err)
	}
	// A decode into it (no consumer events: nothing waits before the
	// round) fails in the round, never reaching its old addresses (its
	// bytes unlike the round's before, which the rounds' buffers hold).
	data = bytes.Repeat([]byte("lost ring"), 4096)
	enc := compress(codec.LZ4, data)
	src := d.HostAllocWait(len(enc), 5*time.Second)
	defer d.HostFree(src)
	copy(src, enc)
	jobs = []codec.Job{{Codec: codec.LZ4, Src: src, Dst: make([]byte, len(data))}}
	r.Decode(context.Background(), 1, jobs, []int64{0}, nil)
	if !errors.Is(jobs[0].Err, ErrRingLost) || !errors.Is(jobs[0].Err, codec.ErrUnsupported) {
		t.Fatalf("a decode into the lost ring: %v", jobs[0].Err)
	}
	f.mu.Lock()
	for p, m := range f.dev {
		if at := r.Addr(1, 0); at >= p && at < p+uintptr(len(m)) && bytes.Contains(m, data[:64]) {
			t.Errorf("the lost ring's decode landed in an allocation at %#x", p)
		}
	}
	f.mu.Unlock()
	if err := r.Close(); err != nil {
		t.Fatalf("closing the lost ring: %v", err)
	}
	if _, ok := func() ([]byte, bool) { f.mu.Lock(); defer f.mu.Unlock(); m, ok := f.dev[r2.Addr(0, 0)]; return m, ok }(); !ok {
		t.Fatal("closing the lost ring freed the ring opened after the rebuild")
	}
}

// A chunk's runs go where each says in the slot, and nothing else of it:
// the steps of a chunk of several time steps that a slot's samples take,
// out of order and apart, beside a whole chunk at one offset. A run that
// passes its chunk leaves every job to the caller. (On the GPU:
// TestGPURingDecodeRuns.)
func TestRingDecodeRuns(t *testing.T) {
	d, _, _ := ringDecoder(t, Options{KernelsPTX: testPTX(t, false)})
	ringRuns(t, d)
}

// The same on the GPU (make test-gpu).
func TestGPURingDecodeRuns(t *testing.T) {
	d, err := New(Options{})
	if err != nil {
		t.Skipf("no GPU decoding here: %v", err)
	}
	defer d.Close()
	ringRuns(t, d)
}

func ringRuns(t *testing.T, d *Decoder) {
	r, err := d.NewRing(1, 4<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	steps, whole := field(64, 128, 3), field(64, 128, 4) // 64 rows of 512 bytes: 8 "steps" of 8 rows
	const step = 8 * 512
	marks := d.HostAllocWait(2<<20, 5*time.Second)
	defer d.HostFree(marks)
	for i := range marks {
		marks[i] = 0xaa
	}
	if err := r.Write(ctx, 0, 0, marks); err != nil {
		t.Fatal(err)
	}
	srcs := [][]byte{bloscCompress(steps, 4, 0, codec.ByteShuffle, "lz4"), compress(codec.LZ4, whole)}
	names := []codec.Name{codec.Blosc, codec.LZ4}
	jobs := make([]codec.Job, len(srcs))
	for i := range jobs {
		dst := d.HostAllocWait(len(steps), 5*time.Second)
		defer d.HostFree(dst)
		src := d.HostAllocWait(len(srcs[i]), 5*time.Second)
		defer d.HostFree(src)
		copy(src, srcs[i])
		jobs[i] = codec.Job{Codec: names[i], Src: src, Dst: dst}
	}
	base := int64(1 << 20)
	runs := [][]Run{
		{{From: 5 * step, At: base, N: step}, {From: 2 * step, At: base + 3*step, N: 2 * step}},
		{{At: 0, N: int64(len(whole))}},
	}
	if err := r.DecodeRuns(ctx, 0, jobs, runs, nil); err != nil {
		t.Fatal(err)
	}
	for i, j := range jobs {
		if j.Err != nil {
			t.Fatalf("job %d: %v", i, j.Err)
		}
	}
	for _, run := range runs[0] {
		if got := ringBytes(t, r, run.At, run.N); !bytes.Equal(got, steps[run.From:run.From+run.N]) {
			t.Fatalf("the run from %d to %d: slot bytes differ from the chunk's", run.From, run.At)
		}
	}
	if got := ringBytes(t, r, 0, int64(len(whole))); !bytes.Equal(got, whole) {
		t.Fatal("the whole chunk at 0: slot bytes differ from the CPU's")
	}
	if got := ringBytes(t, r, base+step, 2*step); bytes.Count(got, []byte{0xaa}) != len(got) {
		t.Fatal("the slot between two runs was written")
	}
	bad := [][]Run{{{From: 7 * step, At: base, N: 2 * step}}, nil}
	if err := r.DecodeRuns(ctx, 0, jobs, bad, nil); err == nil || !strings.Contains(err.Error(), "passes the chunk") {
		t.Fatalf("a run past its chunk's end: %v", err)
	}
	for i, j := range jobs {
		if !errors.Is(j.Err, codec.ErrUnsupported) {
			t.Fatalf("job %d after a run past its chunk: %v, want it left to the caller", i, j.Err)
		}
	}
}

// Chunks decode straight into a ring slot, equal to the CPU decoder's
// bytes, their Dst untouched; a zstd chunk that only its checksum verifies
// is left to the caller (ErrUnsupported), as is a job with no slot offset
// decoded into its Dst.
func TestRingDecodeIntoSlot(t *testing.T) {
	d, f, x := ringDecoder(t, Options{KernelsPTX: testPTX(t, false)}) // PTX from before xxh64_check
	r, err := d.NewRing(2, 4<<20, consumerEvents(0xbeef, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a, b := field(64, 128, 1), field(64, 128, 2)
	srcs := [][]byte{
		bloscCompress(a, 4, 0, codec.ByteShuffle, "lz4"),
		compress(codec.LZ4, b),
		zstdCompress(a, 3), // with a content checksum
		bloscCompress(b, 4, 0, codec.ByteShuffle, "lz4"),
	}
	names := []codec.Name{codec.Blosc, codec.LZ4, codec.Zstd, codec.Blosc}
	want := [][]byte{a, b, a, b}
	offs := []int64{0, int64(len(a)), 2 * int64(len(a)), -1}
	jobs := make([]codec.Job, len(srcs))
	for i := range jobs {
		dst := d.HostAllocWait(len(want[i]), 5*time.Second)
		defer d.HostFree(dst)
		for j := range dst {
			dst[j] = 0xaa
		}
		src := d.HostAllocWait(len(srcs[i]), 5*time.Second)
		defer d.HostFree(src)
		copy(src, srcs[i])
		jobs[i] = codec.Job{Codec: names[i], Src: src, Dst: dst}
	}
	if err := r.Decode(context.Background(), 1, jobs, offs, nil); err != nil {
		t.Fatal(err)
	}
	for i, j := range jobs {
		switch {
		case i == 2:
			if !errors.Is(j.Err, codec.ErrUnsupported) || !strings.Contains(j.Err.Error(), "checksum") {
				t.Fatalf("zstd with a checksum into the slot: %v", j.Err)
			}
		case j.Err != nil:
			t.Fatalf("job %d: %v", i, j.Err)
		case offs[i] < 0:
			if !bytes.Equal(j.Dst, want[i]) {
				t.Fatalf("job %d without a slot offset: its Dst differs from the CPU's bytes", i)
			}
		default:
			if got := f.devBytes("check", uint64(r.Addr(1, offs[i])), uint64(len(want[i]))); !bytes.Equal(got, want[i]) {
				t.Fatalf("job %d: slot bytes differ from the CPU's", i)
			}
			if bytes.Count(j.Dst, []byte{0xaa}) != len(j.Dst) {
				t.Fatalf("job %d: its Dst was written though it went to the slot", i)
			}
		}
	}
	if len(x.waits) != 0 {
		t.Fatalf("a round waited on the device for %v: the consumer event is waited for on the host", x.waits)
	}
	// The LZ4 streams of the chunks bound for the slot were walked on the
	// device, not on the host, whose CPU the device path saves.
	if f.walked == 0 {
		t.Fatal("no LZ4 block walked on the device for a ring's decode")
	}
}

// testPTX is PTX (Options.KernelsPTX) that defines xxh64_check, or PTX
// from before it, whatever the embedded PTX is; the fake driver runs the
// kernel as emuXXH64.
func testPTX(t *testing.T, hash bool) string {
	t.Helper()
	ptx, err := loadPTX()
	if err != nil {
		t.Fatal(err)
	}
	ptx = strings.ReplaceAll(ptx, ".entry xxh64_check(", ".entry xxh64_check_gone(")
	if hash {
		ptx += "\n.visible .entry xxh64_check(\n"
	}
	return ptx
}

// With xxh64_check in the PTX, zstd frames with a content checksum decode
// straight into the slot, held to their checksum on the device: one whose
// checksum does not match its decoded bytes is corrupt (as on the CPU),
// the others in the same round land right, and nothing comes back to the
// host to be hashed there.
func TestRingDecodeChecksummedZstd(t *testing.T) {
	d, f, _ := ringDecoder(t, Options{KernelsPTX: testPTX(t, true)})
	r, err := d.NewRing(1, 8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a, b, c := field(64, 128, 1), field(64, 128, 2), field(33, 17, 3)
	bad := zstdCompress(b, 3)
	bad[len(bad)-1] ^= 0x40 // the checksum, not the data: nvCOMP decodes it as before
	srcs := [][]byte{zstdCompress(a, 3), bad, zstdCompress(c, 3), zstdNoCRC(a)}
	want := [][]byte{a, b, c, a}
	jobs := make([]codec.Job, len(srcs))
	offs := make([]int64, len(srcs))
	var at int64
	for i := range jobs {
		src := d.HostAllocWait(len(srcs[i]), 5*time.Second)
		defer d.HostFree(src)
		copy(src, srcs[i])
		dst := d.HostAllocWait(len(want[i]), 5*time.Second)
		defer d.HostFree(dst)
		jobs[i] = codec.Job{Codec: codec.Zstd, Src: src, Dst: dst}
		offs[i] = at
		at += int64(len(want[i])) + 100 // odd offsets: the D2D copy does not care
	}
	if err := r.Decode(context.Background(), 0, jobs, offs, nil); err != nil {
		t.Fatal(err)
	}
	for i, j := range jobs {
		switch i {
		case 1:
			if !errors.Is(j.Err, codec.ErrCorrupt) || !strings.Contains(j.Err.Error(), "XXH64") {
				t.Fatalf("a frame whose checksum does not match: %v, want corrupt (XXH64)", j.Err)
			}
		case 3:
			if !errors.Is(j.Err, codec.ErrUnsupported) {
				t.Fatalf("a frame without a checksum (Unverified off): %v, want it left to the host", j.Err)
			}
		default:
			if j.Err != nil {
				t.Fatalf("job %d: %v", i, j.Err)
			}
			if got := f.devBytes("check", uint64(r.Addr(0, offs[i])), uint64(len(want[i]))); !bytes.Equal(got, want[i]) {
				t.Fatalf("job %d: slot bytes differ from the CPU's", i)
			}
		}
	}
	if f.hashed != 3 {
		t.Fatalf("the device hashed %d frames, want 3 (the checksummed ones)", f.hashed)
	}
	// Without the kernel, the same frames go back to the caller.
	d2, _, _ := ringDecoder(t, Options{KernelsPTX: testPTX(t, false)})
	r2, err := d2.NewRing(1, 8<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	for i := range jobs {
		jobs[i].Err = nil
	}
	if err := r2.Decode(context.Background(), 0, jobs[:1], offs[:1], nil); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(jobs[0].Err, codec.ErrUnsupported) || !strings.Contains(jobs[0].Err.Error(), "checksum") {
		t.Fatalf("a checksummed frame with PTX from before xxh64_check: %v, want it left to the host", jobs[0].Err)
	}
}

// BenchmarkRingDecodeHost measures what the host does for a ring's decode
// of one ERA5-like sample on the GPU path (framing, layout, queueing,
// copies queued, results settled), the device doing nothing: 16 blosc-lz4
// chunks of 4 levels and 5 of one, 87 MB decoded, read from pinned memory.
func BenchmarkRingDecodeHost(b *testing.B) {
	f := newFakeGPU()
	f.idle = true
	d, err := open(f.libs(), Options{HostBytes: 1 << 30, HostIdle: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	x := &fakeIPC{f: f}
	d.ipcCalls = x.lib()
	var jobs []codec.Job
	var offs []int64
	var at int64
	for c := range 21 {
		levels := 4
		if c >= 16 {
			levels = 1
		}
		data := bytes.Repeat(field(era5Y, era5X, uint64(c+1)), levels)
		enc := bloscCompress(data, 4, 256<<10, codec.ByteShuffle, "lz4")
		src := d.HostAllocWait(len(enc), 10*time.Second)
		copy(src, enc)
		jobs = append(jobs, codec.Job{Codec: codec.Blosc, Src: src, Dst: make([]byte, len(data))})
		offs = append(offs, at)
		at += int64(len(data))
	}
	r, err := d.NewRing(1, at, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	var times RingTimes
	b.SetBytes(at)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for i := range jobs {
			jobs[i].Err = nil
		}
		if err := r.Decode(context.Background(), 0, jobs, offs, &times); err != nil {
			b.Fatal(err)
		}
		for i, j := range jobs {
			if j.Err != nil {
				b.Fatalf("chunk %d: %v", i, j.Err)
			}
		}
	}
	n := time.Duration(b.N)
	b.Logf("a sample: checks %v, wait %v (device: h2d %v, decode %v, kernels %v, d2h %v)", times.Checks/n, times.Wait/n,
		times.Device.H2D/n, times.Device.Decode/n, times.Device.Kernels/n, times.Device.D2H/n)
}

// A ring that does not fit beside the buffers rounds past left behind,
// idle, is not refused: they are given back first; the rounds after it
// share what the ring leaves, and still decode on the device.
func TestRingTrimsIdleRounds(t *testing.T) {
	const budget = 96 << 20
	d, _, _ := ringDecoder(t, Options{DeviceBytes: budget, MaxBatchBytes: 128 << 20, Streams: 2, HostIdle: time.Hour})
	lz4Jobs := func(n, size int) []codec.Job {
		jobs := make([]codec.Job, n)
		for i := range jobs {
			raw := bytes.Repeat(field(64, 128, uint64(i+1)), size/(4*64*128))
			jobs[i] = codec.Job{Codec: codec.LZ4, Src: compress(codec.LZ4, raw), Dst: make([]byte, len(raw))}
		}
		return jobs
	}
	decode := func(jobs []codec.Job) {
		t.Helper()
		if err := d.DecodeBatch(context.Background(), jobs); err != nil {
			t.Fatal(err)
		}
		for i, j := range jobs {
			if j.Err != nil {
				t.Fatalf("chunk %d: %v", i, j.Err)
			}
		}
	}
	decode(lz4Jobs(16, 2<<20)) // 32 MiB decoded in one round
	idle, _, _ := d.MemoryHeld()
	const ring = 64 << 20
	if idle+ring <= budget {
		t.Fatalf("the rounds hold %d bytes: a ring of %d fits beside them, nothing to show", idle, ring)
	}
	r, err := d.NewRing(2, ring/2, nil)
	if err != nil {
		t.Fatalf("a ring refused while the rounds held %d idle bytes: %v", idle, err)
	}
	if held, _, _ := d.MemoryHeld(); held != ring {
		t.Fatalf("device memory held %d with the ring, want the ring's %d alone", held, ring)
	}
	before := d.Stats()
	decode(lz4Jobs(8, 2<<20))
	st := d.Stats()
	if held, _, _ := d.MemoryHeld(); held > budget || st.Chunks-before.Chunks != 8 || st.Refused != before.Refused {
		t.Fatalf("beside the ring: %d bytes held (budget %d), %d chunks on the device, %d refused", held, budget,
			st.Chunks-before.Chunks, st.Refused-before.Refused)
	}
	if lim := d.roundLimit(); lim > (budget-ring)/4 && lim > minRoundLimit {
		t.Fatalf("rounds may cost %d beside the ring, more than their part of what it leaves", lim)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if lim := d.roundLimit(); lim != d.opts.share() {
		t.Fatalf("rounds may cost %d once the ring is closed, want their share %d", lim, d.opts.share())
	}
}

// Fills of several slots that come while the device decodes share its
// next round: no more than ringRoundsAhead rounds of a ring's jobs are in
// flight, so the jobs queued behind them go to the device together, not a
// round each that would wait there for the one before.
func TestRingRoundsMerge(t *testing.T) {
	d, f, _ := ringDecoder(t, Options{Streams: 4, HostIdle: time.Hour})
	const slots = 5
	r, err := d.NewRing(slots, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a := field(32, 128, 1) // 16 KiB
	src := compress(codec.LZ4, a)
	gate := make(chan struct{})
	f.mu.Lock()
	f.gate = gate
	f.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, slots)
	times := make([]RingTimes, slots)
	fill := func(k int) {
		wg.Go(func() {
			jobs := make([]codec.Job, 4)
			offs := make([]int64, 4)
			for i := range jobs {
				jobs[i] = codec.Job{Codec: codec.LZ4, Src: src, Dst: make([]byte, len(a))}
				offs[i] = int64(i * len(a))
			}
			errs[k] = r.Decode(context.Background(), k, jobs, offs, &times[k])
			for _, j := range jobs {
				if errs[k] == nil {
					errs[k] = j.Err
				}
			}
		})
	}
	// waitUntil waits until got() reaches n, what it counts.
	waitUntil := func(n int, what string, got func() int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for got() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d %s, want %d", got(), what, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	queued := func(n int) {
		t.Helper()
		waitUntil(n, "fills waiting for the device", func() int { d.qmu.Lock(); defer d.qmu.Unlock(); return len(d.live) })
	}
	// started waits until n chunks went through nvCOMP: a round taken up
	// (the gate keeps the host from hearing it is done).
	started := func(n int) {
		t.Helper()
		waitUntil(n, "chunks on the device", func() int { f.mu.Lock(); defer f.mu.Unlock(); return f.pieces[algoLZ4] })
	}
	// Two fills take the device, each in a round of its own (the second
	// comes once the first's round is on the device: queued alone, it could
	// join the first's); three more come while it decodes them.
	fill(0)
	started(4)
	fill(1)
	started(8)
	for k := 2; k < slots; k++ {
		fill(k)
	}
	queued(slots)
	time.Sleep(20 * time.Millisecond) // the submitter takes up what it may
	if st := d.Stats(); st.Rounds != 0 {
		t.Fatalf("%d rounds done with the device held", st.Rounds)
	}
	close(gate)
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("fill %d: %v", k, err)
		}
	}
	for k := range slots {
		for i := range 4 {
			if got := f.devBytes("check", uint64(r.Addr(k, int64(i*len(a)))), uint64(len(a))); !bytes.Equal(got, a) {
				t.Fatalf("slot %d, chunk %d: differs from the CPU's bytes", k, i)
			}
		}
	}
	if st := d.Stats(); st.Rounds != 3 || st.Chunks != 4*slots {
		t.Fatalf("%d rounds for %d fills (%d chunks on the device), want 3: the two in flight and one for the fills queued behind them", st.Rounds, slots, st.Chunks)
	}
}
