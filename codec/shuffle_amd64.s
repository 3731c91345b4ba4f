#include "textflag.h"

// Byte unshuffle with SSE2 (baseline on amd64): interleave the byte planes
// of 16 elements at a time (8 for typesize 8) with unpack instructions, as
// c-blosc's SSE2 unshuffle does. The Go callers handle the elements left
// over. Each loop is written once, as a macro of its store instruction:
// the SSE2 functions store with MOVOU; the NT ones with MOVNTO
// (MOVNTDQ, non-temporal), for a block whose destination is large enough
// that it leaves the cache before it is read again (a chunk decoded into
// its place in a sample, written out only after the sample's other
// chunks): the stores skip the read-for-ownership of each destination
// line, half of the unshuffle's memory traffic. Their dst must be 16-byte
// aligned; they end with an SFENCE. Arguments of each:
// func(dst, src *byte, stride, groups int), the planes stride bytes apart.

// UNSHUFFLE2: 32 bytes (16 elements) per iteration from the 2 planes.
#define UNSHUFFLE2(ST) \
	MOVQ dst+0(FP), DI; \
	MOVQ src+8(FP), SI; \
	MOVQ stride+16(FP), DX; \
	MOVQ groups+24(FP), CX; \
	LEAQ (SI)(DX*1), R8; \
	TESTQ CX, CX; \
	JZ done2; \
	loop2: \
	MOVOU (SI), X0; \
	MOVOU (R8), X1; \
	MOVO X0, X2; \
	PUNPCKLBW X1, X0; \
	PUNPCKHBW X1, X2; \
	ST X0, 0(DI); \
	ST X2, 16(DI); \
	ADDQ $16, SI; \
	ADDQ $16, R8; \
	ADDQ $32, DI; \
	DECQ CX; \
	JNZ loop2; \
	done2:

// UNSHUFFLE4: 64 bytes (16 elements) per iteration from the 4 planes.
#define UNSHUFFLE4(ST) \
	MOVQ dst+0(FP), DI; \
	MOVQ src+8(FP), SI; \
	MOVQ stride+16(FP), DX; \
	MOVQ groups+24(FP), CX; \
	LEAQ (SI)(DX*1), R8; \
	LEAQ (R8)(DX*1), R9; \
	LEAQ (R9)(DX*1), R10; \
	TESTQ CX, CX; \
	JZ done4; \
	loop4: \
	MOVOU (SI), X0; \
	MOVOU (R8), X1; \
	MOVOU (R9), X2; \
	MOVOU (R10), X3; \
	MOVO X0, X4; \
	PUNPCKLBW X1, X0; \
	PUNPCKHBW X1, X4; \
	MOVO X2, X5; \
	PUNPCKLBW X3, X2; \
	PUNPCKHBW X3, X5; \
	MOVO X0, X6; \
	PUNPCKLWL X2, X0; \
	PUNPCKHWL X2, X6; \
	MOVO X4, X7; \
	PUNPCKLWL X5, X4; \
	PUNPCKHWL X5, X7; \
	ST X0, 0(DI); \
	ST X6, 16(DI); \
	ST X4, 32(DI); \
	ST X7, 48(DI); \
	ADDQ $16, SI; \
	ADDQ $16, R8; \
	ADDQ $16, R9; \
	ADDQ $16, R10; \
	ADDQ $64, DI; \
	DECQ CX; \
	JNZ loop4; \
	done4:

// UNSHUFFLE8: 64 bytes (8 elements) per iteration: 8 bytes from each of the 8 planes, interleaved
// in lanes of two bytes, then four, then whole elements.
#define UNSHUFFLE8(ST) \
	MOVQ dst+0(FP), DI; \
	MOVQ src+8(FP), SI; \
	MOVQ stride+16(FP), DX; \
	MOVQ groups+24(FP), CX; \
	LEAQ (SI)(DX*1), R8; \
	LEAQ (R8)(DX*1), R9; \
	LEAQ (R9)(DX*1), R10; \
	LEAQ (R10)(DX*1), R11; \
	LEAQ (R11)(DX*1), R12; \
	LEAQ (R12)(DX*1), R13; \
	LEAQ (R13)(DX*1), R14; \
	TESTQ CX, CX; \
	JZ done8; \
	loop8: \
	; \
	MOVQ (SI), X0; \
	MOVQ (R8), X1; \
	MOVQ (R9), X2; \
	MOVQ (R10), X3; \
	MOVQ (R11), X4; \
	MOVQ (R12), X5; \
	MOVQ (R13), X6; \
	MOVQ (R14), X7; \
	PUNPCKLBW X1, X0; \
	PUNPCKLBW X3, X2; \
	PUNPCKLBW X5, X4; \
	PUNPCKLBW X7, X6; \
	MOVO X0, X1; \
	PUNPCKLWL X2, X0; \
	PUNPCKHWL X2, X1; \
	MOVO X4, X5; \
	PUNPCKLWL X6, X4; \
	PUNPCKHWL X6, X5; \
	MOVO X0, X2; \
	PUNPCKLLQ X4, X0; \
	PUNPCKHLQ X4, X2; \
	MOVO X1, X3; \
	PUNPCKLLQ X5, X1; \
	PUNPCKHLQ X5, X3; \
	ST X0, 0(DI); \
	ST X2, 16(DI); \
	ST X1, 32(DI); \
	ST X3, 48(DI); \
	ADDQ $8, SI; \
	ADDQ $8, R8; \
	ADDQ $8, R9; \
	ADDQ $8, R10; \
	ADDQ $8, R11; \
	ADDQ $8, R12; \
	ADDQ $8, R13; \
	ADDQ $8, R14; \
	ADDQ $64, DI; \
	DECQ CX; \
	JNZ loop8; \
	done8:

TEXT ·unshuffle2SSE2(SB), NOSPLIT, $0-32
	UNSHUFFLE2(MOVOU)
	RET

TEXT ·unshuffle2NT(SB), NOSPLIT, $0-32
	UNSHUFFLE2(MOVNTO)
	SFENCE
	RET

TEXT ·unshuffle4SSE2(SB), NOSPLIT, $0-32
	UNSHUFFLE4(MOVOU)
	RET

TEXT ·unshuffle4NT(SB), NOSPLIT, $0-32
	UNSHUFFLE4(MOVNTO)
	SFENCE
	RET

TEXT ·unshuffle8SSE2(SB), NOSPLIT, $0-32
	UNSHUFFLE8(MOVOU)
	RET

TEXT ·unshuffle8NT(SB), NOSPLIT, $0-32
	UNSHUFFLE8(MOVNTO)
	SFENCE
	RET
