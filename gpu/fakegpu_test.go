package gpu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zarrfs/zarrfs/codec"
)

// fakeGPU is a CUDA driver and an nvCOMP written in Go over host memory,
// bound into a Decoder in place of the real libraries (open), so that the
// whole GPU path runs on a machine without a GPU: the layout, the memory
// budgets, pinned memory lent and registered, the direct copies from and
// into callers' memory, the submitter and the completer. The emulation of
// emulate_test.go checks the layout alone; this checks what the Decoder
// does with it.
//
// Device memory is mappings of its own, kept apart from host memory: a
// host address handed to the device (or a device address outside every
// allocation) fails the call and is recorded, as are asynchronous copies
// from or into memory that is neither staging nor registered, and nvCOMP
// inputs or outputs that miss its alignment. Work runs at once on the
// calling goroutine, so every event is done when it is recorded. nvCOMP's
// decoders are the Go decoders of each format (cpuAlgo) and the kernels
// the Go ports of emulate_test.go.
type fakeGPU struct {
	aligns [numAlgos]nvAlign

	mu         sync.Mutex
	dev        map[uintptr][]byte // cuMemAlloc'd, by start
	host       map[uintptr][]byte // cuMemAllocHost'd, by start
	registered map[uintptr]int    // cuMemHostRegister'd ranges: start -> length
	fns        map[uintptr]string
	next       uintptr // handles for contexts, streams, events, functions
	// faults are the calls the fake refused or found wrong, in order.
	faults []string
	// pieces counts the nvCOMP pieces decoded, by algorithm.
	pieces [numAlgos]int
	// hold, when set, keeps every nvCOMP call waiting until it is closed:
	// the call that never returns behind a kernel that loops.
	hold chan struct{}
	// emptyBlock is the module's lz4_empty_block: device memory that no
	// allocation owns.
	emptyBlock []byte
	// idle, when set, makes the device do no work at all (nvCOMP and the
	// kernels return at once, reporting success): benchmarks of the
	// host's part.
	idle bool
	// gate, when set, keeps every event not done until it is closed: the
	// rounds started stay on the device (their work ran, but the host is
	// not told) while the test queues more.
	gate chan struct{}
	// walked counts the LZ4 blocks lz4_check walked, and rejected;
	// hashed the chunks xxh64_check hashed.
	walked, rejected, hashed int
	// busy are events not done (cuEventQuery: not ready) while set: a
	// reader's consumer event behind its kernels.
	busy map[uintptr]bool
	// poisoned is a context a device fault broke: allocations fail with
	// the fault's sticky error until a reset.
	poisoned bool
	// resetHold, when set, keeps a context reset waiting until it is
	// closed: a driver that does not answer.
	resetHold chan struct{}
}

// setBusy marks event ev not done (or done again).
func (f *fakeGPU) setBusy(ev uintptr, busy bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.busy == nil {
		f.busy = map[uintptr]bool{}
	}
	f.busy[ev] = busy
}

func newFakeGPU() *fakeGPU {
	f := &fakeGPU{dev: map[uintptr][]byte{}, host: map[uintptr][]byte{}, registered: map[uintptr]int{},
		fns: map[uintptr]string{}, next: 1, emptyBlock: make([]byte, 16)}
	// nvCOMP 6's alignments on an H200: inputs and outputs of 8 (zstd),
	// 4 (LZ4, snappy) or 1 (deflate) bytes.
	for a, n := range [numAlgos]uint64{8, 4, 1, 4} {
		f.aligns[a] = nvAlign{Input: n, Output: n, Temp: 8}
	}
	return f
}

const (
	cuErrInvalidValue  cuResult = 1
	nvCannotDecompress          = nvStatus(12)
	nvAlignment                 = nvStatus(17)
)

// gated returns the gate, if any.
func (f *fakeGPU) gated() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gate
}

func (f *fakeGPU) fault(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, fmt.Sprintf(format, args...))
}

// Faults returns what the fake refused or found wrong so far.
func (f *fakeGPU) Faults() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.faults...)
}

func (f *fakeGPU) handle() uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	return f.next
}

func mapMem(n uint64) ([]byte, error) {
	return unix.Mmap(-1, 0, int(max(n, 1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
}

// find returns the n bytes at address a of the allocation in m that holds
// them whole.
func find(m map[uintptr][]byte, a, n uint64) []byte {
	for base, b := range m {
		if uint64(base) <= a && a+n <= uint64(base)+uint64(len(b)) {
			off := a - uint64(base)
			return b[off : off+n]
		}
	}
	return nil
}

// devBytes returns device memory at a, or records a fault.
func (f *fakeGPU) devBytes(op string, a, n uint64) []byte {
	f.mu.Lock()
	b := find(f.dev, a, n)
	if e := uint64(uintptr(unsafe.Pointer(&f.emptyBlock[0]))); b == nil && e <= a && a+n <= e+uint64(len(f.emptyBlock)) {
		b = f.emptyBlock[a-e : a-e+n]
	}
	f.mu.Unlock()
	if b == nil {
		f.fault("%s: [%#x, +%d) is not device memory", op, a, n)
	}
	return b
}

// hostPinned reports whether host memory [p, p+n) is staging or
// registered: what an asynchronous copy needs to be asynchronous at all.
func (f *fakeGPU) hostPinned(p unsafe.Pointer, n uint64) bool {
	a := uint64(uintptr(p))
	f.mu.Lock()
	defer f.mu.Unlock()
	if find(f.host, a, n) != nil {
		return true
	}
	for base, l := range f.registered {
		if uint64(base) <= a && a+n <= uint64(base)+uint64(l) {
			return true
		}
	}
	return false
}

// arg reads a kernel parameter: the launch passes an array of pointers to
// the values, which live in the argument block (staging).
func (f *fakeGPU) arg(params unsafe.Pointer, i int, size uint64) uint64 {
	ptrs := unsafe.Slice((*uint64)(params), i+1)
	f.mu.Lock()
	b := find(f.host, ptrs[i], size)
	f.mu.Unlock()
	if b == nil {
		f.fault("kernel parameter %d at %#x is not in staging memory", i, ptrs[i])
		return 0
	}
	if size == 4 {
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

func (f *fakeGPU) launch(fn uintptr, gy uint32, params unsafe.Pointer) cuResult {
	if f.idle {
		return cuSuccess
	}
	f.mu.Lock()
	name := f.fns[fn]
	f.mu.Unlock()
	le := binary.LittleEndian
	switch name {
	case "scatter_copy":
		descs, n := f.arg(params, 0, 8), f.arg(params, 1, 4)
		for i := range n {
			d := f.devBytes("scatter_copy descriptor", descs+i*uint64(copyDescSize), uint64(copyDescSize))
			if d == nil {
				return cuErrInvalidValue
			}
			src, dst, l := le.Uint64(d), le.Uint64(d[8:]), le.Uint64(d[16:])
			from, to := f.devBytes("scatter_copy source", src, l), f.devBytes("scatter_copy target", dst, l)
			if from == nil || to == nil {
				return cuErrInvalidValue
			}
			copy(to, from)
		}
	case "unshuffle":
		descs := f.arg(params, 0, 8)
		for y := range uint64(gy) {
			d := f.devBytes("unshuffle descriptor", descs+y*uint64(shuffleDescSize), uint64(shuffleDescSize))
			if d == nil {
				return cuErrInvalidValue
			}
			sd := shuffleDesc{Src: le.Uint64(d), Dst: le.Uint64(d[8:]), NBytes: le.Uint64(d[16:]),
				BlockSize: le.Uint32(d[24:]), TypeSize: le.Uint32(d[28:]), Mode: le.Uint32(d[32:]), BitRound: le.Uint32(d[36:])}
			from, to := f.devBytes("unshuffle source", sd.Src, sd.NBytes), f.devBytes("unshuffle target", sd.Dst, sd.NBytes)
			if from == nil || to == nil {
				return cuErrInvalidValue
			}
			// emuUnshuffle works on one buffer with offsets into it.
			tmp := make([]byte, 2*sd.NBytes)
			copy(tmp, from)
			emuUnshuffle(tmp, shuffleDesc{Src: 0, Dst: sd.NBytes, NBytes: sd.NBytes, BlockSize: sd.BlockSize,
				TypeSize: sd.TypeSize, Mode: sd.Mode, BitRound: sd.BitRound})
			copy(to, tmp[sd.NBytes:])
		}
	case "lz4_check":
		// kernels.cu's lz4_walk is lz4Check rule for rule.
		arrs, n, verdict := f.arg(params, 0, 8), f.arg(params, 1, 4), f.arg(params, 2, 8)
		a, v := f.devBytes("lz4_check arrays", arrs, 3*8*n), f.devBytes("lz4_check verdicts", verdict, 4*n)
		if a == nil || v == nil {
			return cuErrInvalidValue
		}
		for i := range n {
			src := f.devBytes("lz4_check block", le.Uint64(a[8*i:]), le.Uint64(a[8*(n+i):]))
			if src == nil {
				return cuErrInvalidValue
			}
			ok := lz4Check(src, int64(le.Uint64(a[8*(2*n+i):]))) == nil
			f.mu.Lock()
			f.walked++
			le.PutUint32(v[4*i:], 0)
			if !ok {
				f.rejected++
				le.PutUint32(v[4*i:], 1)
				le.PutUint64(a[8*i:], uint64(uintptr(unsafe.Pointer(&f.emptyBlock[0]))))
				le.PutUint64(a[8*(n+i):], 1)
			}
			f.mu.Unlock()
		}
	case "xxh64_check":
		descs, n, sums := f.arg(params, 0, 8), f.arg(params, 1, 4), f.arg(params, 2, 8)
		out := f.devBytes("xxh64_check sums", sums, 4*n)
		if out == nil {
			return cuErrInvalidValue
		}
		for i := range n {
			d := f.devBytes("xxh64_check descriptor", descs+i*uint64(hashDescSize), uint64(hashDescSize))
			if d == nil {
				return cuErrInvalidValue
			}
			b := f.devBytes("xxh64_check chunk", le.Uint64(d), le.Uint64(d[8:]))
			if b == nil {
				return cuErrInvalidValue
			}
			le.PutUint32(out[4*i:], uint32(emuXXH64(b)))
			f.mu.Lock()
			f.hashed++
			f.mu.Unlock()
		}
	case "byteswap":
		p, nelem, size := f.arg(params, 0, 8), f.arg(params, 1, 8), f.arg(params, 2, 4)
		b := f.devBytes("byteswap", p, nelem*size)
		if b == nil {
			return cuErrInvalidValue
		}
		swapInPlace(b, int(size))
	default:
		f.fault("launch of unknown function %d", fn)
		return cuErrInvalidValue
	}
	return cuSuccess
}

// decomp is nvCOMP's batched decompression of algorithm a.
func (f *fakeGPU) decomp(a int, inPtrs, inBytes, outCaps, outActual uintptr, n uint64, outPtrs, statuses uintptr) nvStatus {
	if f.hold != nil {
		<-f.hold
	}
	le := binary.LittleEndian
	arr := func(p uintptr, size uint64) []byte {
		return f.devBytes("nvCOMP "+algoSymbols[a]+" array", uint64(p), n*size)
	}
	ins, lens, caps, outs, sts, acts := arr(inPtrs, 8), arr(inBytes, 8), arr(outCaps, 8), arr(outPtrs, 8), arr(statuses, 4), arr(outActual, 8)
	if ins == nil || lens == nil || caps == nil || outs == nil || sts == nil || acts == nil {
		return nvStatus(10)
	}
	if f.idle {
		for i := range n {
			le.PutUint32(sts[4*i:], uint32(nvSuccess))
			le.PutUint64(acts[8*i:], le.Uint64(caps[8*i:]))
		}
		return nvSuccess
	}
	for i := range n {
		in, inLen, out, c := le.Uint64(ins[8*i:]), le.Uint64(lens[8*i:]), le.Uint64(outs[8*i:]), le.Uint64(caps[8*i:])
		st, got := nvSuccess, uint64(0)
		switch {
		case in%f.aligns[a].Input != 0 || out%f.aligns[a].Output != 0:
			f.fault("nvCOMP %s piece %d: input %#x or output %#x misaligned", algoSymbols[a], i, in, out)
			st = nvAlignment
		default:
			src, dst := f.devBytes("nvCOMP input", in, inLen), f.devBytes("nvCOMP output", out, c)
			if src == nil || dst == nil {
				st = nvStatus(10)
				break
			}
			if err := cpuAlgo(a, dst, src); err != nil {
				st = nvCannotDecompress
				break
			}
			got = c
			f.mu.Lock()
			f.pieces[a]++
			f.mu.Unlock()
		}
		le.PutUint32(sts[4*i:], uint32(st))
		le.PutUint64(acts[8*i:], got)
	}
	return nvSuccess
}

// libs returns the fake as the Decoder's libraries.
func (f *fakeGPU) libs() *libs {
	ok := func() cuResult { return cuSuccess }
	cu := &cudaLib{
		cuInit:             func(uint32) cuResult { return ok() },
		cuDriverGetVersion: func(v *int32) cuResult { *v = 13000; return ok() },
		cuDeviceGetCount:   func(n *int32) cuResult { *n = 1; return ok() },
		cuDeviceGet:        func(dev *int32, ordinal int32) cuResult { *dev = ordinal; return ok() },
		cuDeviceGetName: func(name *byte, n int32, dev int32) cuResult {
			copy(unsafe.Slice(name, n), "fake GPU\x00")
			return ok()
		},
		cuDeviceTotalMem:          func(b *uint64, dev int32) cuResult { *b = 1 << 34; return ok() },
		cuDevicePrimaryCtxRetain:  func(ctx *uintptr, dev int32) cuResult { *ctx = f.handle(); return ok() },
		cuDevicePrimaryCtxRelease: func(int32) cuResult { return ok() },
		// A reset frees the context's device memory, as the driver's does
		// (its rings' among it).
		cuDevicePrimaryCtxReset: func(int32) cuResult {
			f.mu.Lock()
			hold := f.resetHold
			f.mu.Unlock()
			if hold != nil {
				<-hold
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for p, b := range f.dev {
				unix.Munmap(b)
				delete(f.dev, p)
			}
			f.poisoned = false
			return ok()
		},
		cuCtxSetCurrent:     func(uintptr) cuResult { return ok() },
		cuStreamCreate:      func(s *uintptr, flags uint32) cuResult { *s = f.handle(); return ok() },
		cuStreamDestroy:     func(uintptr) cuResult { return ok() },
		cuStreamSynchronize: func(uintptr) cuResult { return ok() },
		cuMemAlloc: func(p *uintptr, size uint64) cuResult {
			f.mu.Lock()
			poisoned := f.poisoned
			f.mu.Unlock()
			if poisoned {
				return cuResult(700) // CUDA_ERROR_ILLEGAL_ADDRESS
			}
			b, err := mapMem(size)
			if err != nil {
				return cuResult(2) // CUDA_ERROR_OUT_OF_MEMORY
			}
			*p = uintptr(unsafe.Pointer(&b[0]))
			f.mu.Lock()
			f.dev[*p] = b
			f.mu.Unlock()
			return ok()
		},
		cuMemFree: func(p uintptr) cuResult {
			f.mu.Lock()
			b := f.dev[p]
			delete(f.dev, p)
			f.mu.Unlock()
			if b == nil {
				f.fault("cuMemFree of %#x, not allocated", p)
				return cuErrInvalidValue
			}
			unix.Munmap(b)
			return ok()
		},
		cuMemAllocHost: func(p *unsafe.Pointer, size uint64) cuResult {
			b, err := mapMem(size)
			if err != nil {
				return cuResult(2)
			}
			*p = unsafe.Pointer(&b[0])
			f.mu.Lock()
			f.host[uintptr(*p)] = b
			f.mu.Unlock()
			return ok()
		},
		cuMemFreeHost: func(p unsafe.Pointer) cuResult {
			f.mu.Lock()
			b := f.host[uintptr(p)]
			delete(f.host, uintptr(p))
			f.mu.Unlock()
			if b == nil {
				f.fault("cuMemFreeHost of %p, not allocated", p)
				return cuErrInvalidValue
			}
			unix.Munmap(b)
			return ok()
		},
		cuMemHostRegister: func(p unsafe.Pointer, size uint64, flags uint32) cuResult {
			f.mu.Lock()
			f.registered[uintptr(p)] = int(size)
			f.mu.Unlock()
			return ok()
		},
		cuMemHostUnregister: func(p unsafe.Pointer) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			if _, ok := f.registered[uintptr(p)]; !ok {
				f.faults = append(f.faults, fmt.Sprintf("cuMemHostUnregister of %p, not registered", p))
				return cuErrInvalidValue
			}
			delete(f.registered, uintptr(p))
			return cuSuccess
		},
		cuMemcpyHtoDAsync: func(dst uintptr, src unsafe.Pointer, n uint64, s uintptr) cuResult {
			if !f.hostPinned(src, n) {
				f.fault("cuMemcpyHtoDAsync from pageable memory %p (%d bytes)", src, n)
			}
			to := f.devBytes("cuMemcpyHtoDAsync", uint64(dst), n)
			if to == nil {
				return cuErrInvalidValue
			}
			copy(to, unsafe.Slice((*byte)(src), n))
			return ok()
		},
		cuMemcpyDtoHAsync: func(dst unsafe.Pointer, src uintptr, n uint64, s uintptr) cuResult {
			if !f.hostPinned(dst, n) {
				f.fault("cuMemcpyDtoHAsync into pageable memory %p (%d bytes)", dst, n)
			}
			from := f.devBytes("cuMemcpyDtoHAsync", uint64(src), n)
			if from == nil {
				return cuErrInvalidValue
			}
			copy(unsafe.Slice((*byte)(dst), n), from)
			return ok()
		},
		cuMemsetD32Async: func(dst uintptr, v uint32, n uint64, s uintptr) cuResult {
			b := f.devBytes("cuMemsetD32Async", uint64(dst), 4*n)
			if b == nil {
				return cuErrInvalidValue
			}
			for i := uint64(0); i < n; i++ {
				binary.LittleEndian.PutUint32(b[4*i:], v)
			}
			return ok()
		},
		cuModuleLoadData: func(m *uintptr, image unsafe.Pointer) cuResult { *m = f.handle(); return ok() },
		cuModuleUnload:   func(uintptr) cuResult { return ok() },
		cuModuleGetFunction: func(fn *uintptr, m uintptr, name *byte) cuResult {
			*fn = f.handle()
			f.mu.Lock()
			f.fns[*fn] = cString(name)
			f.mu.Unlock()
			return ok()
		},
		cuLaunchKernel: func(fn uintptr, gx, gy, gz, bx, by, bz, shmem uint32, s uintptr, params, extra unsafe.Pointer) cuResult {
			return f.launch(fn, gy, params)
		},
		cuGetErrorString: func(cuResult, **byte) cuResult { return cuErrInvalidValue },
		cuGetErrorName:   func(cuResult, **byte) cuResult { return cuErrInvalidValue },
		cuEventCreate:    func(e *uintptr, flags uint32) cuResult { *e = f.handle(); return ok() },
		cuEventRecord:    func(e, s uintptr) cuResult { return ok() },
		cuEventSynchronize: func(uintptr) cuResult {
			if g := f.gated(); g != nil {
				<-g
			}
			return ok()
		},
		cuEventQuery: func(ev uintptr) cuResult {
			f.mu.Lock()
			busy := f.busy[ev]
			f.mu.Unlock()
			if busy {
				return cuErrNotReady
			}
			if g := f.gated(); g != nil {
				select {
				case <-g:
				default:
					return cuErrNotReady
				}
			}
			return ok()
		},
		cuEventDestroy:     func(uintptr) cuResult { return ok() },
		cuEventElapsedTime: func(ms *float32, a, b uintptr) cuResult { *ms = 0; return ok() },
	}
	nv := &nvcompLib{path: "fake", version: 6000}
	for a := range numAlgos {
		nv.algos[a] = nvAlgo{
			name:  algoSymbols[a],
			align: f.aligns[a],
			getTmp: func(numChunks, maxChunk uint64, opts nvOpts, temp *uint64, maxTotal uint64, stream uintptr) nvStatus {
				*temp = 1 << 20
				return nvSuccess
			},
			getAln: func(opts nvOpts, al *nvAlign) nvStatus { *al = f.aligns[a]; return nvSuccess },
			decomp: func(inPtrs, inBytes, outCaps, outActual uintptr, n uint64, temp uintptr, tempBytes uint64,
				outPtrs uintptr, opts nvOpts, statuses uintptr, stream uintptr) nvStatus {
				return f.decomp(a, inPtrs, inBytes, outCaps, outActual, n, outPtrs, statuses)
			},
		}
	}
	return &libs{cu: cu, nv: nv, driver: 13000, devices: 1}
}

// decoder opens a Decoder on the fake; the test's cleanup closes it and
// fails the test on any fault the fake recorded.
func (f *fakeGPU) decoder(t *testing.T, opts Options) *Decoder {
	t.Helper()
	d, err := open(f.libs(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		for _, s := range f.Faults() {
			t.Error("fake GPU: " + s)
		}
		// Close frees what the Decoder took from the driver, unless the
		// device hung: then it frees nothing the device may still use.
		f.mu.Lock()
		defer f.mu.Unlock()
		if d.Retired() == nil && len(f.dev)+len(f.host)+len(f.registered) > 0 {
			t.Errorf("after Close: %d device and %d staging allocations, %d registrations left", len(f.dev), len(f.host), len(f.registered))
		}
	})
	return d
}

// pipelineOptions are the Options package decode gives a GPU at its
// defaults (1 GiB of device memory, 2 GiB pinned).
func pipelineOptions() Options {
	const batch = 256 << 20
	return Options{DeviceBytes: 512 << 20, MaxBatchBytes: batch, Streams: 2, StagingBytes: batch + batch/8,
		HostBytes: 2<<30 - (batch + batch/8)}
}

// TestFakeGPUDstInsideSample decodes the chunks of one ERA5-like sample
// straight into the sample's buffer, as zarr does when a chunk lands in it
// whole: four-level blosc-lz4 chunks (4 x 721 x 1440 float32, 16.6 MB,
// byte shuffle, typesize 4) whose Dst spans four adjacent channel slots,
// and single-level ones, with the sample in pinned memory the Decoder lent
// and in ordinary memory, and half in each. Every chunk must decode on the
// GPU. Chunks decoded straight into pinned memory take no room in the
// staging their round's results come back through.
func TestFakeGPUDstInsideSample(t *testing.T) {
	const ny, nx = 721, 1440
	per := 4 * ny * nx
	level := func(v, l int) []byte { return field(ny, nx, uint64(100*v+l)) }
	var chunks [][]byte // the decoded chunks, channel slots in order
	var srcs [][]byte
	var slots []int // the first channel slot of each chunk
	slot := 0
	for v := range 2 {
		var data []byte
		for l := range 4 {
			data = append(data, level(v, l)...)
		}
		chunks, slots = append(chunks, data), append(slots, slot)
		srcs = append(srcs, bloscCompress(data, 4, 512<<10, codec.ByteShuffle, "lz4"))
		slot += 4
	}
	for v := range 2 {
		data := level(10+v, 0)
		chunks, slots = append(chunks, data), append(slots, slot)
		srcs = append(srcs, bloscCompress(data, 4, 512<<10, codec.ByteShuffle, "lz4"))
		slot++
	}
	f := newFakeGPU()
	d := f.decoder(t, pipelineOptions())
	for _, pinned := range []string{"all", "none", "half"} {
		t.Run("pinned="+pinned, func(t *testing.T) {
			n := slot * per
			sample, other := make([]byte, n), make([]byte, n)
			if pinned != "none" {
				sample = d.HostAllocWait(n, 10*time.Second)
				defer d.HostFree(sample)
				if !d.pinned(sample) {
					t.Fatal("the sample buffer is not pinned")
				}
			}
			jobs := make([]codec.Job, len(chunks))
			for i, c := range chunks {
				buf := sample
				if pinned == "half" && i%2 == 1 {
					buf = other // chunks 1 and 3 come back through the staging
				}
				jobs[i] = codec.Job{Codec: codec.Blosc, Src: srcs[i], Dst: buf[slots[i]*per : slots[i]*per+len(c)]}
			}
			before := d.Stats()
			if err := d.DecodeBatch(context.Background(), jobs); err != nil {
				t.Fatal(err)
			}
			for i, j := range jobs {
				if j.Err != nil {
					t.Errorf("chunk %d (%d bytes): %v", i, len(j.Dst), j.Err)
				} else if !bytes.Equal(j.Dst, chunks[i]) {
					t.Errorf("chunk %d (%d bytes): wrong bytes", i, len(j.Dst))
				}
			}
			if got := d.Stats().Chunks - before.Chunks; got != int64(len(jobs)) {
				t.Errorf("%d of %d chunks decoded on the GPU", got, len(jobs))
			}
			if f.pieces[algoLZ4] == 0 {
				t.Error("no LZ4 stream reached the fake nvCOMP")
			}
			if pinned == "all" {
				for i := range d.sets {
					if got := d.sets[i].hOut.size; got > 1<<20 {
						t.Errorf("buffer set %d stages %d bytes of results for chunks decoded into pinned memory", i, got)
					}
				}
			}
		})
	}
}

// With Options.WalkOnDevice, LZ4 blocks are walked on the device
// (lz4_check) before nvCOMP reads them, not on the host: a damaged block is swapped for an empty one and
// its chunk left to the CPU (ErrUnsupported, counted in WalkRejected),
// which calls it corrupt; the good chunks of the batch decode.
func TestFakeGPUWalksLZ4OnDevice(t *testing.T) {
	var jobs []codec.Job
	var want [][]byte
	for k := range 3 {
		data := field(96, 128, uint64(k+1))
		jobs = append(jobs, codec.Job{Codec: codec.Blosc, Src: bloscCompress(data, 4, 8<<10, codec.ByteShuffle, "lz4"), Dst: make([]byte, len(data))})
		want = append(want, data)
	}
	data := field(96, 128, 9)
	good := compress(codec.LZ4, data)
	damaged := good[:len(good)-7] // the block ends early
	if codec.Decode(codec.LZ4, make([]byte, len(data)), damaged) == nil {
		t.Fatal("the CPU decodes the damaged block: the test damages nothing")
	}
	jobs = append(jobs, codec.Job{Codec: codec.LZ4, Src: damaged, Dst: make([]byte, len(data))})
	// Off (the default), the host walks the blocks and calls the damaged
	// one corrupt itself; the device walks none.
	f := newFakeGPU()
	host := slices.Clone(jobs)
	if err := f.decoder(t, pipelineOptions()).DecodeBatch(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	if f.walked != 0 || !errors.Is(host[len(host)-1].Err, codec.ErrCorrupt) {
		t.Fatalf("Options.WalkOnDevice off: the device walked %d blocks, the damaged chunk: %v; want the host's walk to call it corrupt", f.walked, host[len(host)-1].Err)
	}
	opts := pipelineOptions()
	opts.WalkOnDevice = true
	f = newFakeGPU()
	d := f.decoder(t, opts)
	if err := d.DecodeBatch(context.Background(), jobs); err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		if jobs[i].Err != nil || !bytes.Equal(jobs[i].Dst, w) {
			t.Fatalf("good chunk %d: %v (bytes equal: %v)", i, jobs[i].Err, bytes.Equal(jobs[i].Dst, w))
		}
	}
	dj := jobs[len(jobs)-1]
	if !errors.Is(dj.Err, codec.ErrUnsupported) || !strings.Contains(fmt.Sprint(dj.Err), "device's walk") {
		t.Fatalf("damaged chunk: %v, want it left to the CPU by the device's walk", dj.Err)
	}
	if s := d.Stats(); s.WalkRejected != 1 || s.Disagreed != 0 || s.Chunks != 3 {
		t.Fatalf("stats %+v: want 3 chunks, 1 rejected by the walk, none disagreed", s)
	}
	f.mu.Lock()
	walked, rejected := f.walked, f.rejected
	f.mu.Unlock()
	if rejected != 1 || walked < 4 {
		t.Fatalf("the device walked %d blocks and rejected %d: want every LZ4 block walked, one rejected", walked, rejected)
	}
}
