package codec

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The reference zstd library (libzstd, the decoder numcodecs, zarrs and
// tensorstore link) decodes a large chunk faster than the Go decoder
// (klauspost/compress) on one core (BenchmarkZstdDecoders; BENCHMARKS.md).
// Where the system has it, zstd chunks and blosc's zstd
// blocks of at least nativeZstdMin bytes decode through it, loaded at run
// time through purego (no cgo), when they are zstd and skippable frames
// end to end (walkZstd: a legacy frame, which a damaged magic number can
// make of a checksummed frame, or trailing bytes, go to the Go decoder,
// which refuses them). Smaller chunks, a partial chunk's stream
// (partial.go; its whole-decode fallback does use libzstd), and every
// machine without the library keep the Go decoder. Both verify frame
// checksums and decode into exactly the caller's buffer, never past it
// (TestLibZstdAgrees, FuzzZstdDecoders). One difference: libzstd decodes
// frames whose window exceeds the Go decoder's limit (zstd --long=30),
// since it decodes into the whole buffer and needs no window.
//
// UseLibZstd selects it (the command line passes ZARRFS_LIBZSTD): "",
// libzstd.so.1 from the loader's search path; "off", the Go decoder
// everywhere; anything else, the path of the library to load.

// nativeZstdMin is the smallest decoded size handed to libzstd: its fixed
// cost (the foreign call, a context reset) loses to the Go decoder on tiny
// chunks, breaks even at hundreds of bytes and gains clearly from a few
// KiB (BenchmarkZstdDecoders).
const nativeZstdMin = 4 << 10

// minLibZstd is the oldest libzstd used (1.4.0, 2019); older ones are
// passed over for the Go decoder.
const minLibZstd = 10400

// libZstd is the bound library: the address of each function used.
type libZstd struct {
	path       string
	version    uint32 // ZSTD_versionNumber: major*10000 + minor*100 + patch
	createDCtx uintptr
	freeDCtx   uintptr
	decompress uintptr // ZSTD_decompressDCtx
	isError    uintptr
	errorName  func(code uintptr) string // ZSTD_getErrorName: a static string
}

// zstdChoice is the setting UseLibZstd gave, final once the library is
// loaded (the first zstd decode of the process).
var zstdChoice struct {
	sync.Mutex
	setting string
	final   bool
}

// UseLibZstd chooses the libzstd zstd decodes go through: "" (the
// default) libzstd.so.1 from the loader's search path, "off" none (the Go
// decoder), else the path of a library. It takes effect when called
// before the process's first zstd decode, and reports whether it did.
func UseLibZstd(setting string) bool {
	zstdChoice.Lock()
	defer zstdChoice.Unlock()
	if zstdChoice.final {
		return false
	}
	zstdChoice.setting = setting
	return true
}

// nativeZstd is the library, or nil where none is used, and why.
var nativeZstd = sync.OnceValues(func() (*libZstd, error) {
	zstdChoice.Lock()
	zstdChoice.final = true
	setting := zstdChoice.setting
	zstdChoice.Unlock()
	return loadLibZstd(setting)
})

func loadLibZstd(setting string) (*libZstd, error) {
	name := "libzstd.so.1"
	switch setting {
	case "off":
		return nil, fmt.Errorf("libzstd off")
	case "":
	default:
		name = setting
	}
	h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("%s not loaded: %v", name, err)
	}
	l := &libZstd{path: name}
	var en, vn uintptr // ZSTD_getErrorName, ZSTD_versionNumber
	for _, s := range []struct {
		addr *uintptr
		name string
	}{
		{&l.createDCtx, "ZSTD_createDCtx"},
		{&l.freeDCtx, "ZSTD_freeDCtx"},
		{&l.decompress, "ZSTD_decompressDCtx"},
		{&l.isError, "ZSTD_isError"},
		{&en, "ZSTD_getErrorName"},
		{&vn, "ZSTD_versionNumber"},
	} {
		if *s.addr, err = purego.Dlsym(h, s.name); err != nil || *s.addr == 0 {
			purego.Dlclose(h)
			return nil, fmt.Errorf("%s: symbol %s missing: %v", name, s.name, err)
		}
	}
	purego.RegisterFunc(&l.errorName, en)
	v, _, _ := purego.SyscallN(vn)
	l.version = uint32(v)
	if l.version < minLibZstd {
		purego.Dlclose(h)
		return nil, fmt.Errorf("%s is version %s, older than %s", name, zstdVersion(l.version), zstdVersion(minLibZstd))
	}
	return l, nil
}

func zstdVersion(v uint32) string { return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100) }

// ZstdDecoder says which decoder zstd chunks of at least 4 KiB go
// through, for `zarrfs version` and the logs: "libzstd 1.5.5
// (libzstd.so.1)", or "Go (klauspost/compress): " and why not libzstd.
func ZstdDecoder() string {
	l, err := nativeZstd()
	if l == nil {
		return "Go (klauspost/compress): " + err.Error()
	}
	return fmt.Sprintf("libzstd %s (%s)", zstdVersion(l.version), l.path)
}

// zstdCtx is one libzstd decompression context, owned by one decoder
// and freed when it is collected (its decode keeps it alive through the
// call).
type zstdCtx struct {
	lib *libZstd
	ctx uintptr
}

// newZstdCtx returns a context, or nil where the library is not used or
// cannot allocate one.
func newZstdCtx() *zstdCtx {
	l, _ := nativeZstd()
	if l == nil {
		return nil
	}
	c, _, _ := purego.SyscallN(l.createDCtx)
	if c == 0 {
		return nil
	}
	z := &zstdCtx{lib: l, ctx: c}
	runtime.AddCleanup(z, func(c uintptr) { purego.SyscallN(l.freeDCtx, c) }, c)
	return z
}

// decode decodes every frame of src (zstd and skippable frames, nothing
// after the last) into exactly dst, verifying the checksums frames carry.
// The caller has walked src (walkZstd): libzstd also decodes legacy
// frames, which this package does not take.
func (z *zstdCtx) decode(dst, src []byte) error {
	// The pointers are converted in the call's arguments: SyscallN is
	// go:uintptrescapes, which moves what they point at to the heap (a
	// buffer on a goroutine's stack could move with the stack during the
	// call) and keeps it alive through it.
	n, _, _ := purego.SyscallN(z.lib.decompress, z.ctx,
		uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(len(dst)),
		uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src)))
	runtime.KeepAlive(dst)
	runtime.KeepAlive(src)
	runtime.KeepAlive(z) // its cleanup frees the context
	// ZSTD_isError returns an unsigned int: only the register's low 32
	// bits are its value.
	if e, _, _ := purego.SyscallN(z.lib.isError, n); uint32(e) != 0 {
		return fmt.Errorf("zstd: %w: %s", ErrCorrupt, z.lib.errorName(n))
	}
	if int(n) != len(dst) {
		return fmt.Errorf("zstd: decodes to %d bytes, want %d: %w", n, len(dst), ErrCorrupt)
	}
	return nil
}
