package codec

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The reference LZ4 library (liblz4, which c-blosc, numcodecs, zarrs and
// tensorstore link) decodes the benchmark stores' blosc-lz4 blocks 1.2x
// faster than the Go decoder (pierrec/lz4) on one core
// (BenchmarkLZ4Decoders), and LZ4 is most of the CPU a blosc-lz4 fill
// spends. Where the system has it, LZ4 blocks (blosc's, and numcodecs'
// LZ4 chunks) of at least nativeLZ4Min bytes decode through its
// LZ4_decompress_safe, loaded at run time through purego (no cgo), the
// same way as libzstd (native.go). That function is the one meant for
// untrusted input: it never reads past the block or writes past the
// buffer, and refuses a malformed block with a negative result. Smaller
// blocks, blocks of 2 GiB or more, and machines without the library keep
// the Go decoder. Both decode exactly the caller's buffer, never past it
// (TestLibLZ4Agrees, FuzzLZ4Decoders).
//
// ZARRFS_LIBLZ4 selects it: unset, liblz4.so.1 from the loader's search
// path; "off", the Go decoder everywhere; anything else, the path of the
// library to load.

// nativeLZ4Min is the smallest decoded size handed to liblz4: below a few
// KiB the foreign call's fixed cost is a fair part of the work (blosc
// blocks are tens to hundreds of KiB).
const nativeLZ4Min = 4 << 10

// minLibLZ4 is the oldest liblz4 used (1.9.3, 2020: earlier ones had a
// memory-safety bug in the decoder, CVE-2021-3520); older ones are passed
// over for the Go decoder.
const minLibLZ4 = 10903

// libLZ4 is the bound library.
type libLZ4 struct {
	path       string
	version    uint32  // LZ4_versionNumber: major*10000 + minor*100 + patch
	decompress uintptr // LZ4_decompress_safe
}

// nativeLZ4 is the library, or nil where none is used, and why.
var nativeLZ4 = sync.OnceValues(func() (*libLZ4, error) {
	return loadLibLZ4(os.Getenv("ZARRFS_LIBLZ4"))
})

func loadLibLZ4(setting string) (*libLZ4, error) {
	l := &libLZ4{}
	var vn uintptr // LZ4_versionNumber
	h, name, err := loadNative("ZARRFS_LIBLZ4", "liblz4.so.1", setting, []nativeSym{
		{&l.decompress, "LZ4_decompress_safe"},
		{&vn, "LZ4_versionNumber"},
	})
	if err != nil {
		return nil, err
	}
	l.path = name
	v, _, _ := purego.SyscallN(vn)
	l.version = uint32(v) // an int
	if l.version < minLibLZ4 {
		purego.Dlclose(h)
		return nil, fmt.Errorf("%s is version %s, older than %s", name, nativeVersion(l.version), nativeVersion(minLibLZ4))
	}
	return l, nil
}

// LZ4Decoder says which decoder LZ4 blocks of at least 4 KiB go through,
// for `zarrfs version` and the logs: "liblz4 1.9.4 (liblz4.so.1)", or
// "Go (pierrec/lz4): " and why not liblz4.
func LZ4Decoder() string {
	l, err := nativeLZ4()
	if l == nil {
		return "Go (pierrec/lz4): " + err.Error()
	}
	return fmt.Sprintf("liblz4 %s (%s)", nativeVersion(l.version), l.path)
}

// lz4Native reports whether a block decoding to n bytes from m goes
// through liblz4, and the library.
func lz4Native(n, m int) *libLZ4 {
	if n < nativeLZ4Min || n > math.MaxInt32 || m > math.MaxInt32 {
		return nil
	}
	l, _ := nativeLZ4()
	return l
}

// decode decodes the LZ4 block src into exactly dst.
func (l *libLZ4) decode(dst, src []byte) error {
	// As for libzstd: the pointers are converted in the call's arguments
	// (SyscallN is go:uintptrescapes), so what they point at is on the heap
	// and alive through the call.
	r, _, _ := purego.SyscallN(l.decompress,
		uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(unsafe.Pointer(unsafe.SliceData(dst))),
		uintptr(len(src)), uintptr(len(dst)))
	runtime.KeepAlive(dst)
	runtime.KeepAlive(src)
	// The result is an int: only the register's low 32 bits are its value.
	if n := int32(r); n < 0 {
		return fmt.Errorf("lz4: %w: malformed block (liblz4)", ErrCorrupt)
	} else if int(n) != len(dst) {
		return fmt.Errorf("lz4: block decodes to %d bytes, want %d: %w", n, len(dst), ErrCorrupt)
	}
	return nil
}
