package gpu

import (
	"errors"
	"fmt"
	"sync"
)

// ErrNoGPU is wrapped by every error that means "this machine cannot decode
// on a GPU": no driver library, no device, no nvCOMP.
var ErrNoGPU = errors.New("gpu: no usable GPU")

// Info says what Probe found. It is meant for `zarrfs version` and logs.
type Info struct {
	// Available is true when a GPU, its driver and nvCOMP were all found.
	Available bool
	// Device is the GPU's name, for example "NVIDIA H200".
	Device string
	// DeviceCount is the number of CUDA devices the driver sees.
	DeviceCount int
	// Driver is the CUDA version the driver supports, for example "13.0".
	Driver string
	// Nvcomp is nvCOMP's version, for example "6.0.0", and NvcompPath the
	// library file or soname it was loaded from.
	Nvcomp, NvcompPath string
	// Reason says why Available is false.
	Reason string
}

// String gives one line such as "GPU: NVIDIA H200 (CUDA 13.0), nvCOMP 6.0.0"
// or "GPU: none (no CUDA driver: ...)".
func (i Info) String() string {
	if !i.Available {
		return "GPU: none (" + i.Reason + ")"
	}
	return fmt.Sprintf("GPU: %s (CUDA %s), nvCOMP %s", i.Device, i.Driver, i.Nvcomp)
}

// libs is the process-wide result of loading the libraries: dlopen and
// cuInit are process-global, so they happen once.
type libs struct {
	cu  *cudaLib
	nv  *nvcompLib
	err error // why cu or nv is unusable
	// driver version and device count, valid when cu is set and err is nil
	driver  int32
	devices int32
}

// Libraries says where to look for nvCOMP besides the dynamic loader's
// path: what the command's environment names (cmd/zarrfs reads it; this
// package reads no environment). The zero value searches the loader's
// path and the system's Python folders only.
type Libraries struct {
	// Nvcomp is nvCOMP's library file, or a folder holding it, tried
	// first (ZARRFS_NVCOMP_LIB).
	Nvcomp string
	// PythonPath is a list of folders (PYTHONPATH); VirtualEnv and
	// CondaPrefix are environments (VIRTUAL_ENV, CONDA_PREFIX), and Home
	// the user's home (HOME, for the user's site-packages): where the
	// nvidia-libnvcomp wheel is looked for.
	PythonPath, VirtualEnv, CondaPrefix, Home string
}

// LibrariesFrom reads Libraries from an environment (getenv: os.Getenv in
// a command, which owns the environment): ZARRFS_NVCOMP_LIB, PYTHONPATH,
// VIRTUAL_ENV, CONDA_PREFIX and HOME.
func LibrariesFrom(getenv func(string) string) Libraries {
	return Libraries{Nvcomp: getenv("ZARRFS_NVCOMP_LIB"), PythonPath: getenv("PYTHONPATH"),
		VirtualEnv: getenv("VIRTUAL_ENV"), CondaPrefix: getenv("CONDA_PREFIX"), Home: getenv("HOME")}
}

var (
	libsOnce   sync.Once
	loadedLibs libs
)

// getLibs loads the libraries once per process (dlopen and cuInit are
// process-global): the first Probe or New decides where nvCOMP is looked
// for, and later calls get what it found.
func getLibs(where Libraries) *libs {
	libsOnce.Do(func() { loadedLibs = loadLibs(where) })
	return &loadedLibs
}

func loadLibs(where Libraries) (l libs) {
	cu, err := loadCUDA()
	if err != nil {
		l.err = fmt.Errorf("%w: %v", ErrNoGPU, err)
		return l
	}
	l.cu = cu
	if err := cu.check("cuInit", cu.cuInit(0)); err != nil {
		l.err = fmt.Errorf("%w: no CUDA device or driver not initialised: %v", ErrNoGPU, err)
		return l
	}
	if err := cu.check("cuDriverGetVersion", cu.cuDriverGetVersion(&l.driver)); err != nil {
		l.err = fmt.Errorf("%w: %v", ErrNoGPU, err)
		return l
	}
	if err := cu.check("cuDeviceGetCount", cu.cuDeviceGetCount(&l.devices)); err != nil {
		l.err = fmt.Errorf("%w: %v", ErrNoGPU, err)
		return l
	}
	if l.devices == 0 {
		l.err = fmt.Errorf("%w: the CUDA driver sees no device", ErrNoGPU)
		return l
	}
	nv, err := loadNvcomp(where)
	if err != nil {
		l.err = fmt.Errorf("%w: %v", ErrNoGPU, err)
		return l
	}
	l.nv = nv
	return l
}

func (l *libs) deviceName(ordinal int) (string, error) {
	var dev int32
	if err := l.cu.check("cuDeviceGet", l.cu.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return "", err
	}
	var buf [256]byte
	if err := l.cu.check("cuDeviceGetName", l.cu.cuDeviceGetName(&buf[0], int32(len(buf)), dev)); err != nil {
		return "", err
	}
	return cString(&buf[0]), nil
}

// Probe looks for the CUDA driver, a device and nvCOMP (where says where,
// on the first call of the process), without creating a context. It never
// panics and is cheap after the first call.
func Probe(where Libraries) Info {
	return probe(getLibs(where), 0)
}

func probe(l *libs, ordinal int) Info {
	var info Info
	if l.cu != nil && l.driver > 0 {
		info.Driver = fmt.Sprintf("%d.%d", l.driver/1000, (l.driver%1000)/10)
		info.DeviceCount = int(l.devices)
	}
	if l.nv != nil {
		info.Nvcomp = l.nv.versionString()
		info.NvcompPath = l.nv.path
	}
	if l.err != nil {
		info.Reason = l.err.Error()
		return info
	}
	name, err := l.deviceName(ordinal)
	if err != nil {
		info.Reason = err.Error()
		return info
	}
	info.Device = name
	info.Available = true
	return info
}
