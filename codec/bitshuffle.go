package codec

import (
	"encoding/binary"
	"fmt"
)

// BitUnshuffle undoes blosc's bit shuffle of one block (the bitshuffle
// library's layout, as c-blosc 1.x applies it): for n = len(src)/typesize
// elements, src holds 8*typesize rows of n/8 bytes, row 8*j+k holding bit k
// of byte j of every element, eight elements to a byte, least significant
// bit first. Blosc only bit-shuffles a block whose element count is a
// multiple of 8; any other block is stored as is and copied here unchanged,
// as are the trailing bytes that do not make a whole element. Like
// Unshuffle it works on one block (BloscFrame.Block) at a time. It returns an
// error when dst and src differ in length or typesize is not positive.
// It allocates nothing for typesizes up to 4096 and is safe to call
// concurrently on distinct buffers.
func BitUnshuffle(dst, src []byte, typesize int) error {
	if len(dst) != len(src) {
		return fmt.Errorf("codec: BitUnshuffle: dst is %d bytes, src %d", len(dst), len(src))
	}
	if typesize <= 0 {
		return fmt.Errorf("codec: BitUnshuffle: typesize %d", typesize)
	}
	n := len(src) / typesize
	if n%8 != 0 {
		copy(dst, src)
		return nil
	}
	rows := n / 8 // bytes in one bit row
	if typesize == 1 {
		bitUntrans(dst[:n], src, rows, rows)
	} else {
		bitUnshuffleChunked(dst, src, typesize, n)
	}
	rest := n * typesize
	copy(dst[rest:], src[rest:])
	return nil
}

// bitChunk is the scratch a bit unshuffle of typesize > 1 goes through: the
// block is undone a slice of elements at a time, first bit rows to byte
// planes (bitUntrans) into this scratch, then byte planes to elements
// (Unshuffle), so the intermediate stays in L1 and each pass runs its own
// vector kernel. 32 KiB rather than 16 KiB: each slice reads 8*typesize row
// segments of 4096/typesize bytes, and shorter segments are slower for
// typesize 4 and 8 (more row starts, fewer bytes per prefetched stream).
const bitChunk = 32 << 10

func bitUnshuffleChunked(dst, src []byte, typesize, n int) {
	rows := n / 8
	// Elements per slice: fill the scratch, in whole kernel steps
	// (bitChunkStep groups of 8 elements) when the typesize allows it.
	per := bitChunk / typesize
	if step := 8 * bitChunkStep; per >= step {
		per -= per % step
	} else {
		per -= per % 8
	}
	var stack [bitChunk]byte
	tmp := stack[:]
	if per == 0 { // typesize > bitChunk/8: never in blosc, whose typesize is a byte
		per = 8
		tmp = make([]byte, 8*typesize)
	}
	for e := 0; e < n; e += per {
		m := min(per, n-e) // a multiple of 8, as n and per are
		t := tmp[:m*typesize]
		for j := 0; j < typesize; j++ {
			bitUntrans(t[j*m:(j+1)*m], src[8*j*rows+e/8:], rows, m/8)
		}
		Unshuffle(dst[e*typesize:(e+m)*typesize], t, typesize)
	}
}

// bitKernel describes a vector bitUntrans (bitUntransVec) for whole steps
// of groups; bitKernels is indexed by bitLevel, which names the best one this
// CPU runs (0: none) and which tests lower to check every kernel against the
// reference. The kernels are called directly, not through a func value, so
// the scratch of bitUnshuffleChunked stays on the stack.
type bitKernel struct {
	name string
	step int // groups per iteration; groups passed are a multiple of it
	// minGroups is the fewest groups worth this kernel; shorter rows go to
	// the next lower one. The AVX2 kernel is slower than SSE2 on rows of
	// a few hundred bytes and faster on long ones (BenchmarkBitUnshuffle).
	minGroups int
}

// bitChunkStep is the largest kernel step: slices of a chunked unshuffle
// are whole multiples of it, so no kernel leaves groups to the portable code.
const bitChunkStep = 32

// bitUntrans turns eight bit rows into bytes: src[k*stride+g] holds bit k of
// the bytes 8g..8g+7 of dst (bit m for byte 8g+m), for g < groups. The
// vector kernel takes whole steps; the portable code below does the rest and
// everything on architectures without a kernel.
func bitUntrans(dst, src []byte, stride, groups int) {
	if groups <= 0 {
		return
	}
	_ = src[7*stride+groups-1]
	_ = dst[8*groups-1]
	g := 0
	lvl := bitLevel
	for lvl > 0 && groups < bitKernels[lvl].minGroups {
		lvl--
	}
	if step := bitKernels[lvl].step; step > 0 && groups >= step {
		g = groups - groups%step
		bitUntransVec(lvl, &dst[0], &src[0], stride, g)
	}
	for ; g+8 <= groups; g += 8 {
		bitUntrans8(dst[8*g:8*g+64], src[g:], stride)
	}
	for ; g < groups; g++ {
		x := uint64(src[g]) | uint64(src[stride+g])<<8 |
			uint64(src[2*stride+g])<<16 | uint64(src[3*stride+g])<<24 |
			uint64(src[4*stride+g])<<32 | uint64(src[5*stride+g])<<40 |
			uint64(src[6*stride+g])<<48 | uint64(src[7*stride+g])<<56
		binary.LittleEndian.PutUint64(dst[8*g:], transpose8x8(x))
	}
}

// bitUntrans8 does eight groups (64 output bytes) with 64-bit words as
// eight byte lanes: a bit transpose across the eight row words, lane by
// lane, leaves in word m the bytes 8g+m; a byte transpose of the eight
// words then puts them in order. Each transpose is three rounds of block
// swaps (half, quarter, eighth), the 8x8 bit-matrix trick done on eight
// matrices at once.
func bitUntrans8(dst, src []byte, stride int) {
	_ = src[7*stride+7]
	x0 := binary.LittleEndian.Uint64(src[0:])
	x1 := binary.LittleEndian.Uint64(src[stride:])
	x2 := binary.LittleEndian.Uint64(src[2*stride:])
	x3 := binary.LittleEndian.Uint64(src[3*stride:])
	x4 := binary.LittleEndian.Uint64(src[4*stride:])
	x5 := binary.LittleEndian.Uint64(src[5*stride:])
	x6 := binary.LittleEndian.Uint64(src[6*stride:])
	x7 := binary.LittleEndian.Uint64(src[7*stride:])

	// Bits: word k bit m of each lane -> word m bit k.
	x0, x4 = swapBlocks(x0, x4, 4, 0x0f0f0f0f0f0f0f0f)
	x1, x5 = swapBlocks(x1, x5, 4, 0x0f0f0f0f0f0f0f0f)
	x2, x6 = swapBlocks(x2, x6, 4, 0x0f0f0f0f0f0f0f0f)
	x3, x7 = swapBlocks(x3, x7, 4, 0x0f0f0f0f0f0f0f0f)
	x0, x2 = swapBlocks(x0, x2, 2, 0x3333333333333333)
	x1, x3 = swapBlocks(x1, x3, 2, 0x3333333333333333)
	x4, x6 = swapBlocks(x4, x6, 2, 0x3333333333333333)
	x5, x7 = swapBlocks(x5, x7, 2, 0x3333333333333333)
	x0, x1 = swapBlocks(x0, x1, 1, 0x5555555555555555)
	x2, x3 = swapBlocks(x2, x3, 1, 0x5555555555555555)
	x4, x5 = swapBlocks(x4, x5, 1, 0x5555555555555555)
	x6, x7 = swapBlocks(x6, x7, 1, 0x5555555555555555)

	// Bytes: word m lane g -> word g lane m.
	x0, x4 = swapBlocks(x0, x4, 32, 0x00000000ffffffff)
	x1, x5 = swapBlocks(x1, x5, 32, 0x00000000ffffffff)
	x2, x6 = swapBlocks(x2, x6, 32, 0x00000000ffffffff)
	x3, x7 = swapBlocks(x3, x7, 32, 0x00000000ffffffff)
	x0, x2 = swapBlocks(x0, x2, 16, 0x0000ffff0000ffff)
	x1, x3 = swapBlocks(x1, x3, 16, 0x0000ffff0000ffff)
	x4, x6 = swapBlocks(x4, x6, 16, 0x0000ffff0000ffff)
	x5, x7 = swapBlocks(x5, x7, 16, 0x0000ffff0000ffff)
	x0, x1 = swapBlocks(x0, x1, 8, 0x00ff00ff00ff00ff)
	x2, x3 = swapBlocks(x2, x3, 8, 0x00ff00ff00ff00ff)
	x4, x5 = swapBlocks(x4, x5, 8, 0x00ff00ff00ff00ff)
	x6, x7 = swapBlocks(x6, x7, 8, 0x00ff00ff00ff00ff)

	d := dst[:64]
	binary.LittleEndian.PutUint64(d[0:], x0)
	binary.LittleEndian.PutUint64(d[8:], x1)
	binary.LittleEndian.PutUint64(d[16:], x2)
	binary.LittleEndian.PutUint64(d[24:], x3)
	binary.LittleEndian.PutUint64(d[32:], x4)
	binary.LittleEndian.PutUint64(d[40:], x5)
	binary.LittleEndian.PutUint64(d[48:], x6)
	binary.LittleEndian.PutUint64(d[56:], x7)
}

// swapBlocks exchanges the high s bits of every 2s-bit block of a with the
// low s bits of the same block of b (mask selects the low halves): one round
// of a transpose of the matrix whose rows are a and b.
func swapBlocks(a, b uint64, s uint, mask uint64) (uint64, uint64) {
	t := (a>>s ^ b) & mask
	return a ^ t<<s, b ^ t
}

// transpose8x8 transposes the 8x8 bit matrix whose row r is byte r of x.
func transpose8x8(x uint64) uint64 {
	t := (x ^ (x >> 7)) & 0x00aa00aa00aa00aa
	x = x ^ t ^ (t << 7)
	t = (x ^ (x >> 14)) & 0x0000cccc0000cccc
	x = x ^ t ^ (t << 14)
	t = (x ^ (x >> 28)) & 0x00000000f0f0f0f0
	x = x ^ t ^ (t << 28)
	return x
}
