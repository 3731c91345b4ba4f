package codec

import "golang.org/x/sys/cpu"

// Bit unshuffle kernels (bitshuffle_amd64.s). SSE2 is baseline on amd64;
// AVX2 does twice the groups per instruction where the CPU has it.
var bitKernels = []bitKernel{
	{name: "go"},
	{name: "sse2", step: 16},
	{name: "avx2", step: 32, minGroups: 2048},
}

func bitUntransVec(level int, dst, src *byte, stride, groups int) {
	if level == 2 {
		bitUntransAVX2(dst, src, stride, groups)
	} else {
		bitUntransSSE2(dst, src, stride, groups)
	}
}

var bitLevel = bitLevelFor(cpu.X86.HasAVX2)

func bitLevelFor(avx2 bool) int {
	if avx2 {
		return 2
	}
	return 1
}

// bitUntransSSE2 is bitUntrans for groups a multiple of 16; the caller
// guarantees 8 rows of groups readable bytes at stride and 8*groups bytes at
// dst.
//
//go:noescape
func bitUntransSSE2(dst, src *byte, stride, groups int)

// bitUntransAVX2 is bitUntrans for groups a multiple of 32, on CPUs with
// AVX2.
//
//go:noescape
func bitUntransAVX2(dst, src *byte, stride, groups int)
