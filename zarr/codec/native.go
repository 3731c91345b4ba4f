package codec

import (
	"fmt"

	"github.com/ebitengine/purego"
)

// A native library is one of the reference C decoders the system has,
// loaded at run time through purego (no cgo): libzstd (libzstd.go) and
// liblz4 (liblz4.go). Each has its setting, ZARRFS_LIBZSTD or
// ZARRFS_LIBLZ4: unset, the library's usual name on the loader's search
// path; "off", the Go decoder; anything else, the path of the library.

// nativeSym names one function to bind and where its address goes.
type nativeSym struct {
	addr *uintptr
	name string
}

// loadNative opens the library that setting names (name when unset) and
// binds syms. It returns the handle and the name opened, or why not: the
// setting is off, the library does not load, or a symbol is missing (the
// library is closed again).
func loadNative(env, name, setting string, syms []nativeSym) (uintptr, string, error) {
	switch setting {
	case "off":
		return 0, "", fmt.Errorf("%s=off", env)
	case "":
	default:
		name = setting
	}
	h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return 0, "", fmt.Errorf("%s not loaded: %v", name, err)
	}
	for _, s := range syms {
		if *s.addr, err = purego.Dlsym(h, s.name); err != nil || *s.addr == 0 {
			purego.Dlclose(h)
			return 0, "", fmt.Errorf("%s: symbol %s missing: %v", name, s.name, err)
		}
	}
	return h, name, nil
}

// nativeVersion writes a version number as both libraries give it
// (major*10000 + minor*100 + patch).
func nativeVersion(v uint32) string { return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100) }
