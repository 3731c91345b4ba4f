//go:build !amd64

package codec

// Only the portable bit unshuffle exists off amd64.
var bitKernels = []bitKernel{{name: "go"}}

var bitLevel = 0

func bitUntransVec(level int, dst, src *byte, stride, groups int) { panic("unreachable") }
