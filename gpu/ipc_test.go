package gpu

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
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
	if _, err := d.NewRing(4, 32<<20, ""); !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "--gpu-memory") {
		t.Fatalf("a ring over the device budget: %v", err)
	}
	before, _, _ := d.MemoryHeld()
	consumer := ipcHandle{w: [8]uint64{0xc0ffee}}.hex()
	r, err := d.NewRing(3, 1<<20, consumer)
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
	if err := r.Write(1, 8192, src); err != nil {
		t.Fatal(err)
	}
	if err := r.Copy(2, 0, r.Addr(1, 8192), 4096); err != nil {
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
	if len(x.waits) != 1 || x.waits[0] != 0xc0ffee {
		t.Fatalf("the slot's writes waited for %v, want the consumer event once", x.waits)
	}
	if err := r.Write(0, 1<<20-10, src[:11]); err == nil {
		t.Fatal("a write past its slot was accepted")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if held, _, _ := d.MemoryHeld(); held != before {
		t.Fatalf("device memory held %d after Close, want %d", held, before)
	}
	if err := r.Write(1, 0, src); !errors.Is(err, ErrRingClosed) {
		t.Fatalf("write after Close: %v", err)
	}
}
