#include "textflag.h"

// Bit unshuffle kernels: eight bit rows in, bytes out (see bitUntrans).
// Row k lane g holds bit m of output byte 8g+m at bit m. A transpose of the
// 8x8 bit matrices across the eight row registers, done lane-wise with
// shift/xor/mask block swaps, leaves in register m lane g output byte
// 8g+m; byte unpacks then interleave the eight registers into output order.

// BITSWAP exchanges the high s bits of every 2s-bit block of a with the low
// s bits of b; m holds the low-half mask. X8 is scratch.
#define BITSWAP(a, b, s, m) \
	MOVO  a, X8     \
	PSRLQ $s, X8    \
	PXOR  b, X8     \
	PAND  m, X8     \
	PXOR  X8, b     \
	PSLLQ $s, X8    \
	PXOR  X8, a

#define BITSWAP8(a, b, s, m) \
	VPSRLQ $s, a, Y8   \
	VPXOR  b, Y8, Y8   \
	VPAND  m, Y8, Y8   \
	VPXOR  Y8, b, b    \
	VPSLLQ $s, Y8, Y8  \
	VPXOR  Y8, a, a

// func bitUntransSSE2(dst, src *byte, stride, groups int)
TEXT ·bitUntransSSE2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ stride+16(FP), DX
	MOVQ groups+24(FP), CX
	SHRQ $4, CX
	JZ   sse2done
	LEAQ (DX)(DX*2), R8 // 3*stride
	LEAQ (SI)(DX*4), R9 // row 4
	MOVQ $0x0f0f0f0f0f0f0f0f, AX
	MOVQ AX, X13
	PUNPCKLQDQ X13, X13
	MOVQ $0x3333333333333333, AX
	MOVQ AX, X14
	PUNPCKLQDQ X14, X14
	MOVQ $0x5555555555555555, AX
	MOVQ AX, X15
	PUNPCKLQDQ X15, X15

sse2loop:
	MOVOU (SI), X0
	MOVOU (SI)(DX*1), X1
	MOVOU (SI)(DX*2), X2
	MOVOU (SI)(R8*1), X3
	MOVOU (R9), X4
	MOVOU (R9)(DX*1), X5
	MOVOU (R9)(DX*2), X6
	MOVOU (R9)(R8*1), X7

	BITSWAP(X0, X4, 4, X13)
	BITSWAP(X1, X5, 4, X13)
	BITSWAP(X2, X6, 4, X13)
	BITSWAP(X3, X7, 4, X13)
	BITSWAP(X0, X2, 2, X14)
	BITSWAP(X1, X3, 2, X14)
	BITSWAP(X4, X6, 2, X14)
	BITSWAP(X5, X7, 2, X14)
	BITSWAP(X0, X1, 1, X15)
	BITSWAP(X2, X3, 1, X15)
	BITSWAP(X4, X5, 1, X15)
	BITSWAP(X6, X7, 1, X15)

	// Register m lane g is output byte 8g+m: interleave bytes, words, dwords.
	MOVO      X0, X8
	PUNPCKLBW X1, X0 // bytes 0,1 of groups 0-7
	PUNPCKHBW X1, X8 // groups 8-15
	MOVO      X2, X9
	PUNPCKLBW X3, X2
	PUNPCKHBW X3, X9
	MOVO      X4, X10
	PUNPCKLBW X5, X4
	PUNPCKHBW X5, X10
	MOVO      X6, X11
	PUNPCKLBW X7, X6
	PUNPCKHBW X7, X11

	MOVO      X0, X1
	PUNPCKLWL X2, X0 // bytes 0-3 of groups 0-3
	PUNPCKHWL X2, X1 // groups 4-7
	MOVO      X4, X3
	PUNPCKLWL X6, X4 // bytes 4-7 of groups 0-3
	PUNPCKHWL X6, X3 // groups 4-7
	MOVO      X0, X5
	PUNPCKLLQ X4, X0 // groups 0,1
	PUNPCKHLQ X4, X5 // groups 2,3
	MOVO      X1, X7
	PUNPCKLLQ X3, X1 // groups 4,5
	PUNPCKHLQ X3, X7 // groups 6,7
	MOVOU     X0, 0(DI)
	MOVOU     X5, 16(DI)
	MOVOU     X1, 32(DI)
	MOVOU     X7, 48(DI)

	MOVO      X8, X1
	PUNPCKLWL X9, X8  // bytes 0-3 of groups 8-11
	PUNPCKHWL X9, X1  // groups 12-15
	MOVO      X10, X3
	PUNPCKLWL X11, X10 // bytes 4-7 of groups 8-11
	PUNPCKHWL X11, X3  // groups 12-15
	MOVO      X8, X5
	PUNPCKLLQ X10, X8 // groups 8,9
	PUNPCKHLQ X10, X5 // groups 10,11
	MOVO      X1, X7
	PUNPCKLLQ X3, X1 // groups 12,13
	PUNPCKHLQ X3, X7 // groups 14,15
	MOVOU     X8, 64(DI)
	MOVOU     X5, 80(DI)
	MOVOU     X1, 96(DI)
	MOVOU     X7, 112(DI)

	ADDQ $16, SI
	ADDQ $16, R9
	ADDQ $128, DI
	DECQ CX
	JNZ  sse2loop

sse2done:
	RET

// func bitUntransAVX2(dst, src *byte, stride, groups int)
// Lane 0 of each register does groups 0-15, lane 1 groups 16-31; the
// unpacks stay within lanes, so a final lane permute puts them in order.
TEXT ·bitUntransAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ stride+16(FP), DX
	MOVQ groups+24(FP), CX
	SHRQ $5, CX
	JZ   avx2done
	LEAQ (DX)(DX*2), R8 // 3*stride
	LEAQ (SI)(DX*4), R9 // row 4
	MOVQ $0x0f0f0f0f0f0f0f0f, AX
	MOVQ AX, X13
	VPBROADCASTQ X13, Y13
	MOVQ $0x3333333333333333, AX
	MOVQ AX, X14
	VPBROADCASTQ X14, Y14
	MOVQ $0x5555555555555555, AX
	MOVQ AX, X15
	VPBROADCASTQ X15, Y15

avx2loop:
	VMOVDQU (SI), Y0
	VMOVDQU (SI)(DX*1), Y1
	VMOVDQU (SI)(DX*2), Y2
	VMOVDQU (SI)(R8*1), Y3
	VMOVDQU (R9), Y4
	VMOVDQU (R9)(DX*1), Y5
	VMOVDQU (R9)(DX*2), Y6
	VMOVDQU (R9)(R8*1), Y7

	BITSWAP8(Y0, Y4, 4, Y13)
	BITSWAP8(Y1, Y5, 4, Y13)
	BITSWAP8(Y2, Y6, 4, Y13)
	BITSWAP8(Y3, Y7, 4, Y13)
	BITSWAP8(Y0, Y2, 2, Y14)
	BITSWAP8(Y1, Y3, 2, Y14)
	BITSWAP8(Y4, Y6, 2, Y14)
	BITSWAP8(Y5, Y7, 2, Y14)
	BITSWAP8(Y0, Y1, 1, Y15)
	BITSWAP8(Y2, Y3, 1, Y15)
	BITSWAP8(Y4, Y5, 1, Y15)
	BITSWAP8(Y6, Y7, 1, Y15)

	VPUNPCKLBW Y1, Y0, Y8  // bytes 0,1 of groups 0-7 | 16-23
	VPUNPCKHBW Y1, Y0, Y9  // groups 8-15 | 24-31
	VPUNPCKLBW Y3, Y2, Y10
	VPUNPCKHBW Y3, Y2, Y11
	VPUNPCKLBW Y5, Y4, Y0
	VPUNPCKHBW Y5, Y4, Y1
	VPUNPCKLBW Y7, Y6, Y2
	VPUNPCKHBW Y7, Y6, Y3

	VPUNPCKLWD Y10, Y8, Y4 // bytes 0-3 of groups 0-3 | 16-19
	VPUNPCKHWD Y10, Y8, Y5 // groups 4-7 | 20-23
	VPUNPCKLWD Y2, Y0, Y6  // bytes 4-7 of groups 0-3 | 16-19
	VPUNPCKHWD Y2, Y0, Y7  // groups 4-7 | 20-23
	VPUNPCKLDQ Y6, Y4, Y8  // groups 0,1 | 16,17
	VPUNPCKHDQ Y6, Y4, Y10 // groups 2,3 | 18,19
	VPUNPCKLDQ Y7, Y5, Y0  // groups 4,5 | 20,21
	VPUNPCKHDQ Y7, Y5, Y2  // groups 6,7 | 22,23
	VPERM2I128 $0x20, Y10, Y8, Y4
	VPERM2I128 $0x20, Y2, Y0, Y5
	VPERM2I128 $0x31, Y10, Y8, Y6
	VPERM2I128 $0x31, Y2, Y0, Y7
	VMOVDQU    Y4, 0(DI)
	VMOVDQU    Y5, 32(DI)
	VMOVDQU    Y6, 128(DI)
	VMOVDQU    Y7, 160(DI)

	VPUNPCKLWD Y11, Y9, Y4 // bytes 0-3 of groups 8-11 | 24-27
	VPUNPCKHWD Y11, Y9, Y5
	VPUNPCKLWD Y3, Y1, Y6
	VPUNPCKHWD Y3, Y1, Y7
	VPUNPCKLDQ Y6, Y4, Y8  // groups 8,9 | 24,25
	VPUNPCKHDQ Y6, Y4, Y10 // groups 10,11 | 26,27
	VPUNPCKLDQ Y7, Y5, Y0  // groups 12,13 | 28,29
	VPUNPCKHDQ Y7, Y5, Y2  // groups 14,15 | 30,31
	VPERM2I128 $0x20, Y10, Y8, Y4
	VPERM2I128 $0x20, Y2, Y0, Y5
	VPERM2I128 $0x31, Y10, Y8, Y6
	VPERM2I128 $0x31, Y2, Y0, Y7
	VMOVDQU    Y4, 64(DI)
	VMOVDQU    Y5, 96(DI)
	VMOVDQU    Y6, 192(DI)
	VMOVDQU    Y7, 224(DI)

	ADDQ $32, SI
	ADDQ $32, R9
	ADDQ $256, DI
	DECQ CX
	JNZ  avx2loop
	VZEROUPPER

avx2done:
	RET
