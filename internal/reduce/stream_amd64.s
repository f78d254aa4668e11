//go:build !purego

#include "textflag.h"

// func streamCopyAsm(dst, src unsafe.Pointer, n int)
// Hand-written (not generated): unaligned 32-byte loads, VMOVNTDQ stores to the cache-line-aligned
// dst, 128 bytes per iteration, SFENCE at the end.
TEXT ·streamCopyAsm(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	TESTQ CX, CX
	JLE  done

loop:
	VMOVDQU  0(SI), Y0
	VMOVDQU  32(SI), Y1
	VMOVDQU  64(SI), Y2
	VMOVDQU  96(SI), Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ     $128, SI
	ADDQ     $128, DI
	SUBQ     $128, CX
	JNZ      loop

done:
	SFENCE
	VZEROUPPER
	RET
