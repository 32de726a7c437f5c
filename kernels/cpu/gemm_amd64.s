//go:build amd64 && !purego

#include "textflag.h"

// Micro-kernels of the packed fp32 GEMM; gemm32.go has the contract. Each
// keeps its C tile in registers and sums, for every element, the kc
// products in k order with one fused multiply-add each, starting from
// zero; the AVX-512 and AVX2 kernels therefore give the same bits for the
// same operands, whatever their tile shape.
//
// Two ways of walking A, so that most layouts need no packing of A:
//   - "unit" kernels: A(i, l) at a + i + l·csa, for packed panels
//     (csa = mr) and for a stored transposed (csa = lda);
//   - "rows" kernels: A(i, l) at a + i·lda + l, for a row-major a read in
//     place.
// B row l is at b + l·ldb: ldb = nr for a packed panel, the stored
// leading dimension when b is read in place.
//
// Registers: CX counts k; SI (and AX, BX, R13 for the row bases) walk A,
// DI walks B; R11 is A's variable stride and R12 B's, both in bytes; DX
// and R8 are C and its row stride. R14, R15 and BP are left alone.

// ZROW: one row of the 12×32 tile, the broadcast A value t times the B
// row in Z24:Z25, added into c0:c1.
#define ZROW(addr, t, c0, c1) \
	VBROADCASTSS addr, t; \
	VFMADD231PS  Z24, t, c0; \
	VFMADD231PS  Z25, t, c1

// ZLOADB loads row l of the B panel into Z24:Z25 and asks for row l+8:
// the panel streams from L2 (or memory, read in place) past the A panel,
// faster than the hardware prefetcher alone brings it (4–9 % on one core).
#define ZLOADB \
	VMOVUPS    (DI), Z24; \
	VMOVUPS    64(DI), Z25; \
	PREFETCHT0 (DI)(R12*8); \
	PREFETCHT0 64(DI)(R12*8); \
	ADDQ       R12, DI

// ZSTEP_UNIT: one k step, A values at SI+0 … SI+44.
#define ZSTEP_UNIT \
	ZLOADB; \
	ZROW((SI), Z26, Z0, Z1); \
	ZROW(4(SI), Z27, Z2, Z3); \
	ZROW(8(SI), Z28, Z4, Z5); \
	ZROW(12(SI), Z29, Z6, Z7); \
	ZROW(16(SI), Z26, Z8, Z9); \
	ZROW(20(SI), Z27, Z10, Z11); \
	ZROW(24(SI), Z28, Z12, Z13); \
	ZROW(28(SI), Z29, Z14, Z15); \
	ZROW(32(SI), Z26, Z16, Z17); \
	ZROW(36(SI), Z27, Z18, Z19); \
	ZROW(40(SI), Z28, Z20, Z21); \
	ZROW(44(SI), Z29, Z22, Z23); \
	ADDQ R11, SI

// ZSTEP_ROWS(d): one k step, A rows 0–2 at SI, 3–5 at AX, 6–8 at BX,
// 9–11 at R13, each base plus 0, 1 or 2 row strides, d bytes along.
#define ZSTEP_ROWS(d) \
	ZLOADB; \
	ZROW(d(SI), Z26, Z0, Z1); \
	ZROW(d(SI)(R11*1), Z27, Z2, Z3); \
	ZROW(d(SI)(R11*2), Z28, Z4, Z5); \
	ZROW(d(AX), Z29, Z6, Z7); \
	ZROW(d(AX)(R11*1), Z26, Z8, Z9); \
	ZROW(d(AX)(R11*2), Z27, Z10, Z11); \
	ZROW(d(BX), Z28, Z12, Z13); \
	ZROW(d(BX)(R11*1), Z29, Z14, Z15); \
	ZROW(d(BX)(R11*2), Z26, Z16, Z17); \
	ZROW(d(R13), Z27, Z18, Z19); \
	ZROW(d(R13)(R11*1), Z28, Z20, Z21); \
	ZROW(d(R13)(R11*2), Z29, Z22, Z23)

// ZPROLOGUE loads B, C and k, touches the C tile so its lines are on the
// way while the products are summed, and clears the accumulators.
#define ZPROLOGUE \
	MOVQ kc+0(FP), CX; \
	MOVQ b+24(FP), DI; \
	MOVQ ldb+32(FP), R12; \
	SHLQ $2, R12; \
	MOVQ c+40(FP), DX; \
	MOVQ ldc+48(FP), R8; \
	SHLQ $2, R8; \
	MOVQ DX, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 64(R10); \
	ADDQ R8, R10; \
	VPXORD Z0, Z0, Z0; \
	VPXORD Z1, Z1, Z1; \
	VPXORD Z2, Z2, Z2; \
	VPXORD Z3, Z3, Z3; \
	VPXORD Z4, Z4, Z4; \
	VPXORD Z5, Z5, Z5; \
	VPXORD Z6, Z6, Z6; \
	VPXORD Z7, Z7, Z7; \
	VPXORD Z8, Z8, Z8; \
	VPXORD Z9, Z9, Z9; \
	VPXORD Z10, Z10, Z10; \
	VPXORD Z11, Z11, Z11; \
	VPXORD Z12, Z12, Z12; \
	VPXORD Z13, Z13, Z13; \
	VPXORD Z14, Z14, Z14; \
	VPXORD Z15, Z15, Z15; \
	VPXORD Z16, Z16, Z16; \
	VPXORD Z17, Z17, Z17; \
	VPXORD Z18, Z18, Z18; \
	VPXORD Z19, Z19, Z19; \
	VPXORD Z20, Z20, Z20; \
	VPXORD Z21, Z21, Z21; \
	VPXORD Z22, Z22, Z22; \
	VPXORD Z23, Z23, Z23

// ZROWOUT writes row r of the tile to DX (and moves DX on a row), adding
// what C held first when add is set.
#define ZROWOUT_ADD(c0, c1) \
	VADDPS  (DX), c0, c0; \
	VADDPS  64(DX), c1, c1; \
	VMOVUPS c0, (DX); \
	VMOVUPS c1, 64(DX); \
	ADDQ    R8, DX

#define ZROWOUT(c0, c1) \
	VMOVUPS c0, (DX); \
	VMOVUPS c1, 64(DX); \
	ADDQ    R8, DX

#define ZEPILOGUE(lbl) \
	MOVBLZX add+56(FP), R9; \
	TESTQ   R9, R9; \
	JZ      lbl; \
	ZROWOUT_ADD(Z0, Z1); \
	ZROWOUT_ADD(Z2, Z3); \
	ZROWOUT_ADD(Z4, Z5); \
	ZROWOUT_ADD(Z6, Z7); \
	ZROWOUT_ADD(Z8, Z9); \
	ZROWOUT_ADD(Z10, Z11); \
	ZROWOUT_ADD(Z12, Z13); \
	ZROWOUT_ADD(Z14, Z15); \
	ZROWOUT_ADD(Z16, Z17); \
	ZROWOUT_ADD(Z18, Z19); \
	ZROWOUT_ADD(Z20, Z21); \
	ZROWOUT_ADD(Z22, Z23); \
	VZEROUPPER; \
	RET; \
lbl: \
	ZROWOUT(Z0, Z1); \
	ZROWOUT(Z2, Z3); \
	ZROWOUT(Z4, Z5); \
	ZROWOUT(Z6, Z7); \
	ZROWOUT(Z8, Z9); \
	ZROWOUT(Z10, Z11); \
	ZROWOUT(Z12, Z13); \
	ZROWOUT(Z14, Z15); \
	ZROWOUT(Z16, Z17); \
	ZROWOUT(Z18, Z19); \
	ZROWOUT(Z20, Z21); \
	ZROWOUT(Z22, Z23); \
	VZEROUPPER; \
	RET

// func sgemm12x32UnitAVX512(kc int, a *float32, csa int, b *float32, ldb int, c *float32, ldc int, add bool)
TEXT ·sgemm12x32UnitAVX512(SB), NOSPLIT, $0-57
	ZPROLOGUE
	MOVQ a+8(FP), SI
	MOVQ csa+16(FP), R11
	SHLQ $2, R11
	CMPQ CX, $4
	JLT  tail

loop4:
	ZSTEP_UNIT
	ZSTEP_UNIT
	ZSTEP_UNIT
	ZSTEP_UNIT
	SUBQ $4, CX
	CMPQ CX, $4
	JGE  loop4

tail:
	TESTQ CX, CX
	JZ    done

loop1:
	ZSTEP_UNIT
	DECQ CX
	JNZ  loop1

done:
	ZEPILOGUE(store)

// func sgemm12x32RowsAVX512(kc int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)
TEXT ·sgemm12x32RowsAVX512(SB), NOSPLIT, $0-57
	ZPROLOGUE
	MOVQ a+8(FP), SI
	MOVQ lda+16(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*2), AX
	ADDQ R11, AX
	LEAQ (AX)(R11*2), BX
	ADDQ R11, BX
	LEAQ (BX)(R11*2), R13
	ADDQ R11, R13
	CMPQ CX, $4
	JLT  tail

loop4:
	ZSTEP_ROWS(0)
	ZSTEP_ROWS(4)
	ZSTEP_ROWS(8)
	ZSTEP_ROWS(12)
	ADDQ $16, SI
	ADDQ $16, AX
	ADDQ $16, BX
	ADDQ $16, R13
	SUBQ $4, CX
	CMPQ CX, $4
	JGE  loop4

tail:
	TESTQ CX, CX
	JZ    done

loop1:
	ZSTEP_ROWS(0)
	ADDQ $4, SI
	ADDQ $4, AX
	ADDQ $4, BX
	ADDQ $4, R13
	DECQ CX
	JNZ  loop1

done:
	ZEPILOGUE(store)

// The 6×16 AVX2 kernels: Y0–Y11 the tile (row i in Y2i, Y2i+1), Y12:Y13
// the B row, Y14–Y15 the broadcasts.
#define YROW(addr, t, c0, c1) \
	VBROADCASTSS addr, t; \
	VFMADD231PS  Y12, t, c0; \
	VFMADD231PS  Y13, t, c1

#define YLOADB \
	VMOVUPS    (DI), Y12; \
	VMOVUPS    32(DI), Y13; \
	PREFETCHT0 (DI)(R12*8); \
	ADDQ       R12, DI

#define YSTEP_UNIT \
	YLOADB; \
	YROW((SI), Y14, Y0, Y1); \
	YROW(4(SI), Y15, Y2, Y3); \
	YROW(8(SI), Y14, Y4, Y5); \
	YROW(12(SI), Y15, Y6, Y7); \
	YROW(16(SI), Y14, Y8, Y9); \
	YROW(20(SI), Y15, Y10, Y11); \
	ADDQ R11, SI

// YSTEP_ROWS(d): A rows 0–2 at SI, 3–5 at AX.
#define YSTEP_ROWS(d) \
	YLOADB; \
	YROW(d(SI), Y14, Y0, Y1); \
	YROW(d(SI)(R11*1), Y15, Y2, Y3); \
	YROW(d(SI)(R11*2), Y14, Y4, Y5); \
	YROW(d(AX), Y15, Y6, Y7); \
	YROW(d(AX)(R11*1), Y14, Y8, Y9); \
	YROW(d(AX)(R11*2), Y15, Y10, Y11)

#define YPROLOGUE \
	MOVQ kc+0(FP), CX; \
	MOVQ b+24(FP), DI; \
	MOVQ ldb+32(FP), R12; \
	SHLQ $2, R12; \
	MOVQ c+40(FP), DX; \
	MOVQ ldc+48(FP), R8; \
	SHLQ $2, R8; \
	MOVQ DX, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 32(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 32(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 32(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 32(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 32(R10); \
	ADDQ R8, R10; \
	PREFETCHT0 (R10); \
	PREFETCHT0 32(R10); \
	ADDQ R8, R10; \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7; \
	VXORPS Y8, Y8, Y8; \
	VXORPS Y9, Y9, Y9; \
	VXORPS Y10, Y10, Y10; \
	VXORPS Y11, Y11, Y11

#define YROWOUT_ADD(c0, c1) \
	VADDPS  (DX), c0, c0; \
	VADDPS  32(DX), c1, c1; \
	VMOVUPS c0, (DX); \
	VMOVUPS c1, 32(DX); \
	ADDQ    R8, DX

#define YROWOUT(c0, c1) \
	VMOVUPS c0, (DX); \
	VMOVUPS c1, 32(DX); \
	ADDQ    R8, DX

#define YEPILOGUE(lbl) \
	MOVBLZX add+56(FP), R9; \
	TESTQ   R9, R9; \
	JZ      lbl; \
	YROWOUT_ADD(Y0, Y1); \
	YROWOUT_ADD(Y2, Y3); \
	YROWOUT_ADD(Y4, Y5); \
	YROWOUT_ADD(Y6, Y7); \
	YROWOUT_ADD(Y8, Y9); \
	YROWOUT_ADD(Y10, Y11); \
	VZEROUPPER; \
	RET; \
lbl: \
	YROWOUT(Y0, Y1); \
	YROWOUT(Y2, Y3); \
	YROWOUT(Y4, Y5); \
	YROWOUT(Y6, Y7); \
	YROWOUT(Y8, Y9); \
	YROWOUT(Y10, Y11); \
	VZEROUPPER; \
	RET

// func sgemm6x16UnitAVX2(kc int, a *float32, csa int, b *float32, ldb int, c *float32, ldc int, add bool)
TEXT ·sgemm6x16UnitAVX2(SB), NOSPLIT, $0-57
	YPROLOGUE
	MOVQ a+8(FP), SI
	MOVQ csa+16(FP), R11
	SHLQ $2, R11
	CMPQ CX, $4
	JLT  tail

loop4:
	YSTEP_UNIT
	YSTEP_UNIT
	YSTEP_UNIT
	YSTEP_UNIT
	SUBQ $4, CX
	CMPQ CX, $4
	JGE  loop4

tail:
	TESTQ CX, CX
	JZ    done

loop1:
	YSTEP_UNIT
	DECQ CX
	JNZ  loop1

done:
	YEPILOGUE(store)

// func sgemm6x16RowsAVX2(kc int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)
TEXT ·sgemm6x16RowsAVX2(SB), NOSPLIT, $0-57
	YPROLOGUE
	MOVQ a+8(FP), SI
	MOVQ lda+16(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*2), AX
	ADDQ R11, AX
	CMPQ CX, $4
	JLT  tail

loop4:
	YSTEP_ROWS(0)
	YSTEP_ROWS(4)
	YSTEP_ROWS(8)
	YSTEP_ROWS(12)
	ADDQ $16, SI
	ADDQ $16, AX
	SUBQ $4, CX
	CMPQ CX, $4
	JGE  loop4

tail:
	TESTQ CX, CX
	JZ    done

loop1:
	YSTEP_ROWS(0)
	ADDQ $4, SI
	ADDQ $4, AX
	DECQ CX
	JNZ  loop1

done:
	YEPILOGUE(store)

// func sgemmPackT4x8(dst, src *float32, lds, ldd, r4, n8 int)
//
// Transposes an (4·r4)×(8·n8) block for gather packing: row r starts at
// src + r·lds floats, and its value in column l goes to dst + l·ldd + r.
// Each step is a 4×8 transpose within the 128-bit lanes (two unpacks and
// a shuffle per column pair); the low lanes then hold columns 0–3 and the
// high lanes columns 4–7.
TEXT ·sgemmPackT4x8(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DX
	MOVQ src+8(FP), BX
	MOVQ lds+16(FP), R8
	SHLQ $2, R8
	MOVQ ldd+24(FP), R9
	SHLQ $2, R9
	MOVQ r4+32(FP), AX
	LEAQ (R8)(R8*2), R10
	LEAQ (R9)(R9*2), R11
	LEAQ (R9*4), R12
	LEAQ (R8*4), R13

rows:
	MOVQ DX, DI
	MOVQ BX, SI
	MOVQ n8+40(FP), CX

cols:
	VMOVUPS      (SI), Y0
	VMOVUPS      (SI)(R8*1), Y1
	VMOVUPS      (SI)(R8*2), Y2
	VMOVUPS      (SI)(R10*1), Y3
	VUNPCKLPS    Y1, Y0, Y4
	VUNPCKHPS    Y1, Y0, Y5
	VUNPCKLPS    Y3, Y2, Y6
	VUNPCKHPS    Y3, Y2, Y7
	VSHUFPS      $0x44, Y6, Y4, Y0
	VSHUFPS      $0xEE, Y6, Y4, Y1
	VSHUFPS      $0x44, Y7, Y5, Y2
	VSHUFPS      $0xEE, Y7, Y5, Y3
	VMOVUPS      X0, (DI)
	VMOVUPS      X1, (DI)(R9*1)
	VMOVUPS      X2, (DI)(R9*2)
	VMOVUPS      X3, (DI)(R11*1)
	ADDQ         R12, DI
	VEXTRACTF128 $1, Y0, (DI)
	VEXTRACTF128 $1, Y1, (DI)(R9*1)
	VEXTRACTF128 $1, Y2, (DI)(R9*2)
	VEXTRACTF128 $1, Y3, (DI)(R11*1)
	ADDQ         R12, DI
	ADDQ         $32, SI
	DECQ         CX
	JNZ          cols
	ADDQ         $16, DX
	ADDQ         R13, BX
	DECQ         AX
	JNZ          rows
	VZEROUPPER
	RET

// func fmaPeakAVX512(n int)
//
// n iterations of twelve independent zmm FMA chains: enough chains to cover
// the FMA latency on both FMA ports, so the loop runs at the core's fp32
// FMA throughput (384 flops per iteration).
TEXT ·fmaPeakAVX512(SB), NOSPLIT, $0-8
	MOVQ   n+0(FP), CX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13

zpeak:
	VFMADD231PS Z12, Z13, Z0
	VFMADD231PS Z12, Z13, Z1
	VFMADD231PS Z12, Z13, Z2
	VFMADD231PS Z12, Z13, Z3
	VFMADD231PS Z12, Z13, Z4
	VFMADD231PS Z12, Z13, Z5
	VFMADD231PS Z12, Z13, Z6
	VFMADD231PS Z12, Z13, Z7
	VFMADD231PS Z12, Z13, Z8
	VFMADD231PS Z12, Z13, Z9
	VFMADD231PS Z12, Z13, Z10
	VFMADD231PS Z12, Z13, Z11
	DECQ        CX
	JNZ         zpeak
	VZEROUPPER
	RET

// func fmaPeakAVX2(n int)
//
// The ymm version of fmaPeakAVX512: 192 flops per iteration.
TEXT ·fmaPeakAVX2(SB), NOSPLIT, $0-8
	MOVQ   n+0(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13

ypeak:
	VFMADD231PS Y12, Y13, Y0
	VFMADD231PS Y12, Y13, Y1
	VFMADD231PS Y12, Y13, Y2
	VFMADD231PS Y12, Y13, Y3
	VFMADD231PS Y12, Y13, Y4
	VFMADD231PS Y12, Y13, Y5
	VFMADD231PS Y12, Y13, Y6
	VFMADD231PS Y12, Y13, Y7
	VFMADD231PS Y12, Y13, Y8
	VFMADD231PS Y12, Y13, Y9
	VFMADD231PS Y12, Y13, Y10
	VFMADD231PS Y12, Y13, Y11
	DECQ        CX
	JNZ         ypeak
	VZEROUPPER
	RET

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv() (eax, edx uint32)
//
// XCR0: which register state the OS saves and restores on a context switch.
TEXT ·xgetbv(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET
