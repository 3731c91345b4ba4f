package gpu

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// cuResult is the CUDA driver's CUresult.
type cuResult int32

const (
	cuSuccess     cuResult = 0
	cuErrNoDevice cuResult = 100
	cuErrNotReady cuResult = 600 // CUDA_ERROR_NOT_READY: cuEventQuery of work not done
)

// Driver errors that leave the context unusable ("sticky" errors): after one
// of these every later call on the context fails, so the decoder must drop
// the context and retain a fresh one.
var stickyResults = map[cuResult]bool{
	700: true, // CUDA_ERROR_ILLEGAL_ADDRESS
	701: true, // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
	702: true, // CUDA_ERROR_LAUNCH_TIMEOUT
	714: true, // CUDA_ERROR_HARDWARE_STACK_ERROR
	715: true, // CUDA_ERROR_ILLEGAL_INSTRUCTION
	716: true, // CUDA_ERROR_MISALIGNED_ADDRESS
	717: true, // CUDA_ERROR_INVALID_ADDRESS_SPACE
	718: true, // CUDA_ERROR_INVALID_PC
	719: true, // CUDA_ERROR_LAUNCH_FAILED
}

// cudaLib holds the CUDA driver entry points, bound with purego so that the
// binary needs no cgo and starts on machines without libcuda.
type cudaLib struct {
	handle uintptr

	cuInit                    func(flags uint32) cuResult
	cuDriverGetVersion        func(v *int32) cuResult
	cuDeviceGetCount          func(n *int32) cuResult
	cuDeviceGet               func(dev *int32, ordinal int32) cuResult
	cuDeviceGetName           func(name *byte, n int32, dev int32) cuResult
	cuDeviceTotalMem          func(bytes *uint64, dev int32) cuResult
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) cuResult
	cuDevicePrimaryCtxRelease func(dev int32) cuResult
	cuDevicePrimaryCtxReset   func(dev int32) cuResult
	cuCtxSetCurrent           func(ctx uintptr) cuResult
	cuStreamCreate            func(s *uintptr, flags uint32) cuResult
	cuStreamDestroy           func(s uintptr) cuResult
	cuStreamSynchronize       func(s uintptr) cuResult
	cuMemAlloc                func(p *uintptr, size uint64) cuResult
	cuMemFree                 func(p uintptr) cuResult
	cuMemAllocHost            func(p *unsafe.Pointer, size uint64) cuResult
	cuMemFreeHost             func(p unsafe.Pointer) cuResult
	cuMemHostRegister         func(p unsafe.Pointer, size uint64, flags uint32) cuResult
	cuMemHostUnregister       func(p unsafe.Pointer) cuResult
	cuMemcpyHtoDAsync         func(dst uintptr, src unsafe.Pointer, n uint64, s uintptr) cuResult
	cuMemsetD32Async          func(dst uintptr, v uint32, n uint64, s uintptr) cuResult
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uintptr, n uint64, s uintptr) cuResult
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) cuResult
	cuModuleUnload            func(m uintptr) cuResult
	cuModuleGetFunction       func(f *uintptr, m uintptr, name *byte) cuResult
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shmem uint32, s uintptr, params unsafe.Pointer, extra unsafe.Pointer) cuResult
	cuGetErrorString          func(e cuResult, s **byte) cuResult
	cuEventCreate             func(e *uintptr, flags uint32) cuResult
	cuEventRecord             func(e uintptr, s uintptr) cuResult
	cuEventSynchronize        func(e uintptr) cuResult
	cuEventQuery              func(e uintptr) cuResult
	cuEventDestroy            func(e uintptr) cuResult
	cuEventElapsedTime        func(ms *float32, start, end uintptr) cuResult
	cuGetErrorName            func(e cuResult, s **byte) cuResult
}

// cudaLibNames are tried in order; the versioned name comes first because
// only the driver package installs it (the unversioned one comes with the
// toolkit's stubs on some machines, and a stub fails at cuInit).
var cudaLibNames = []string{"libcuda.so.1", "libcuda.so"}

func loadCUDA() (*cudaLib, error) {
	var lastErr error
	for _, name := range cudaLibNames {
		h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			lastErr = err
			continue
		}
		l := &cudaLib{handle: h}
		if err := l.bind(); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return l, nil
	}
	return nil, fmt.Errorf("CUDA driver library libcuda.so.1 not found (%v)", lastErr)
}

func (l *cudaLib) bind() error {
	syms := []struct {
		fn   any
		name string
	}{
		{&l.cuInit, "cuInit"},
		{&l.cuDriverGetVersion, "cuDriverGetVersion"},
		{&l.cuDeviceGetCount, "cuDeviceGetCount"},
		{&l.cuDeviceGet, "cuDeviceGet"},
		{&l.cuDeviceGetName, "cuDeviceGetName"},
		{&l.cuDeviceTotalMem, "cuDeviceTotalMem_v2"},
		{&l.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
		{&l.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&l.cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2"},
		{&l.cuCtxSetCurrent, "cuCtxSetCurrent"},
		{&l.cuStreamCreate, "cuStreamCreate"},
		{&l.cuStreamDestroy, "cuStreamDestroy_v2"},
		{&l.cuStreamSynchronize, "cuStreamSynchronize"},
		{&l.cuMemAlloc, "cuMemAlloc_v2"},
		{&l.cuMemFree, "cuMemFree_v2"},
		{&l.cuMemAllocHost, "cuMemAllocHost_v2"},
		{&l.cuMemFreeHost, "cuMemFreeHost"},
		{&l.cuMemHostRegister, "cuMemHostRegister_v2"},
		{&l.cuMemHostUnregister, "cuMemHostUnregister"},
		{&l.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
		{&l.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
		{&l.cuMemsetD32Async, "cuMemsetD32Async"},
		{&l.cuModuleLoadData, "cuModuleLoadData"},
		{&l.cuModuleUnload, "cuModuleUnload"},
		{&l.cuModuleGetFunction, "cuModuleGetFunction"},
		{&l.cuLaunchKernel, "cuLaunchKernel"},
		{&l.cuGetErrorString, "cuGetErrorString"},
		{&l.cuGetErrorName, "cuGetErrorName"},
		{&l.cuEventCreate, "cuEventCreate"},
		{&l.cuEventRecord, "cuEventRecord"},
		{&l.cuEventSynchronize, "cuEventSynchronize"},
		{&l.cuEventQuery, "cuEventQuery"},
		{&l.cuEventDestroy, "cuEventDestroy_v2"},
	}
	for _, s := range syms {
		if err := register(s.fn, l.handle, s.name); err != nil {
			return err
		}
	}
	// CUDA 12.8 added a _v2 of the elapsed-time call; either serves.
	if register(&l.cuEventElapsedTime, l.handle, "cuEventElapsedTime_v2") != nil {
		if err := register(&l.cuEventElapsedTime, l.handle, "cuEventElapsedTime"); err != nil {
			return err
		}
	}
	return nil
}

// register binds one symbol, turning a missing symbol into an error rather
// than purego's panic.
func register(fptr any, handle uintptr, name string) error {
	sym, err := purego.Dlsym(handle, name)
	if err != nil || sym == 0 {
		return fmt.Errorf("symbol %s missing: %v", name, err)
	}
	purego.RegisterFunc(fptr, sym)
	return nil
}

// CUDAError is a failed CUDA driver call.
type CUDAError struct {
	Op   string
	Code int
	Name string // CUDA_ERROR_...
	Msg  string
}

func (e *CUDAError) Error() string {
	return fmt.Sprintf("gpu: %s: %s (%d): %s", e.Op, e.Name, e.Code, e.Msg)
}

// Sticky reports whether the error leaves the CUDA context unusable.
func (e *CUDAError) Sticky() bool { return stickyResults[cuResult(e.Code)] }

func (l *cudaLib) check(op string, r cuResult) error {
	if r == cuSuccess {
		return nil
	}
	e := &CUDAError{Op: op, Code: int(r), Name: "CUDA_ERROR_UNKNOWN", Msg: "unknown error"}
	var p *byte
	if l.cuGetErrorName(r, &p) == cuSuccess && p != nil {
		e.Name = cString(p)
	}
	p = nil
	if l.cuGetErrorString(r, &p) == cuSuccess && p != nil {
		e.Msg = cString(p)
	}
	return e
}

// cString copies a NUL-terminated C string.
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// cStr returns a NUL-terminated copy of s for C calls that keep no
// reference to it.
func cStr(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}
