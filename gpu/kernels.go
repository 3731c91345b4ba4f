package gpu

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// kernelsPTX is gpu/kernels/kernels.cu compiled to PTX (the command is in
// that file). PTX rather than a cubin so that the driver compiles it for
// whatever GPU the node has, Turing or newer.
//
//go:embed kernels/kernels.ptx
var kernelsPTX string

// ptxOverride, when set (by tests, from a flag), replaces the embedded PTX
// with a file, so freshly compiled kernels can be tried before they are
// checked in.
var ptxOverride string

func loadPTX() (string, error) {
	if ptxOverride != "" {
		b, err := os.ReadFile(ptxOverride)
		if err != nil {
			return "", fmt.Errorf("gpu: reading PTX: %w", err)
		}
		return string(b), nil
	}
	if len(kernelsPTX) == 0 {
		return "", errors.New("gpu: kernels.ptx is empty: it was not generated from kernels.cu")
	}
	return kernelsPTX, nil
}

// ptxHas reports whether the PTX defines kernel name: a kernel added to
// kernels.cu is used only once the PTX compiled from it is checked in
// (until then, what it would do stays on the host).
func ptxHas(ptx, name string) bool {
	return strings.Contains(ptx, ".entry "+name+"(")
}

// copyDesc mirrors CopyDesc in kernels.cu.
type copyDesc struct {
	Src, Dst, Len uint64
}

// shuffleDesc mirrors ShuffleDesc in kernels.cu.
type shuffleDesc struct {
	Src, Dst, NBytes                    uint64
	BlockSize, TypeSize, Mode, BitRound uint32
}

// hashDesc mirrors HashDesc in kernels.cu: the decoded bytes xxh64_check
// hashes.
type hashDesc struct {
	Src, Len uint64
}

const (
	copyDescSize    = int(unsafe.Sizeof(copyDesc{}))
	shuffleDescSize = int(unsafe.Sizeof(shuffleDesc{}))
	hashDescSize    = int(unsafe.Sizeof(hashDesc{}))
)

// Shuffle modes of shuffleDesc.Mode.
const (
	modeByteShuffle = 1
	modeBitShuffle  = 2
)
