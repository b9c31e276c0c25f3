//go:build amd64 && !purego

#include "textflag.h"

// func dotAVX2(a, b *float32, n int) float32
TEXT ·dotAVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

dot32:
	CMPQ CX, $32
	JL   dot8
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	VFMADD231PS 64(DI), Y6, Y2
	VFMADD231PS 96(DI), Y7, Y3
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  dot32

dot8:
	CMPQ CX, $8
	JL   dotreduce
	VMOVUPS (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  dot8

dotreduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0

dottail:
	TESTQ CX, CX
	JE    dotdone
	VMOVSS (SI), X1
	VFMADD231SS (DI), X1, X0
	ADDQ $4, SI
	ADDQ $4, DI
	DECQ CX
	JMP  dottail

dotdone:
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func axpyAVX2(alpha float32, x, y *float32, n int)
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	VBROADCASTSS alpha+0(FP), Y0
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DI
	MOVQ n+24(FP), CX

axpy32:
	CMPQ CX, $32
	JL   axpy8
	VMOVUPS (DI), Y1
	VMOVUPS 32(DI), Y2
	VMOVUPS 64(DI), Y3
	VMOVUPS 96(DI), Y4
	VFMADD231PS (SI), Y0, Y1
	VFMADD231PS 32(SI), Y0, Y2
	VFMADD231PS 64(SI), Y0, Y3
	VFMADD231PS 96(SI), Y0, Y4
	VMOVUPS Y1, (DI)
	VMOVUPS Y2, 32(DI)
	VMOVUPS Y3, 64(DI)
	VMOVUPS Y4, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  axpy32

axpy8:
	CMPQ CX, $8
	JL   axpytail
	VMOVUPS (DI), Y1
	VFMADD231PS (SI), Y0, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  axpy8

axpytail:
	TESTQ CX, CX
	JE    axpydone
	VMOVSS (DI), X1
	VFMADD231SS (SI), X0, X1
	VMOVSS X1, (DI)
	ADDQ $4, SI
	ADDQ $4, DI
	DECQ CX
	JMP  axpytail

axpydone:
	VZEROUPPER
	RET

// func dot4AVX2(q *float32, k *float32, d int, out *float32)
// out[i] = dot(q[i*d:(i+1)*d], k[:d]) for i < 4; d % 8 == 0.
TEXT ·dot4AVX2(SB), NOSPLIT, $0-32
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), DI
	MOVQ d+16(FP), CX
	MOVQ out+24(FP), DX
	MOVQ CX, BX
	SHLQ $2, BX
	LEAQ (SI)(BX*1), R8
	LEAQ (R8)(BX*1), R9
	LEAQ (R9)(BX*1), R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

d4loop16:
	CMPQ CX, $16
	JL   d4loop8
	VMOVUPS (DI), Y8
	VMOVUPS 32(DI), Y9
	VFMADD231PS (SI), Y8, Y0
	VFMADD231PS 32(SI), Y9, Y4
	VFMADD231PS (R8), Y8, Y1
	VFMADD231PS 32(R8), Y9, Y5
	VFMADD231PS (R9), Y8, Y2
	VFMADD231PS 32(R9), Y9, Y6
	VFMADD231PS (R10), Y8, Y3
	VFMADD231PS 32(R10), Y9, Y7
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $64, R9
	ADDQ $64, R10
	SUBQ $16, CX
	JMP  d4loop16

d4loop8:
	CMPQ CX, $8
	JL   d4reduce
	VMOVUPS (DI), Y8
	VFMADD231PS (SI), Y8, Y0
	VFMADD231PS (R8), Y8, Y1
	VFMADD231PS (R9), Y8, Y2
	VFMADD231PS (R10), Y8, Y3
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, R9
	ADDQ $32, R10
	SUBQ $8, CX
	JMP  d4loop8

d4reduce:
	VADDPS Y4, Y0, Y0
	VADDPS Y5, Y1, Y1
	VADDPS Y6, Y2, Y2
	VADDPS Y7, Y3, Y3
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMOVUPS X0, (DX)
	VZEROUPPER
	RET

// func gemvTAVX2(p *float32, n int, v *float32, d int, acc *float32)
// acc[j] += sum_{t<n} p[t]*v[t*d+j] for j < d; d % 8 == 0.
TEXT ·gemvTAVX2(SB), NOSPLIT, $0-40
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), R11
	MOVQ v+16(FP), DI
	MOVQ d+24(FP), CX
	MOVQ acc+32(FP), DX
	MOVQ CX, BX
	SHLQ $2, BX

gblk32:
	CMPQ CX, $32
	JL   gblk8
	VMOVUPS (DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS 64(DX), Y2
	VMOVUPS 96(DX), Y3
	MOVQ SI, R8
	MOVQ DI, R9
	MOVQ R11, R10

gt32:
	TESTQ R10, R10
	JE    gt32done
	VBROADCASTSS (R8), Y4
	VFMADD231PS (R9), Y4, Y0
	VFMADD231PS 32(R9), Y4, Y1
	VFMADD231PS 64(R9), Y4, Y2
	VFMADD231PS 96(R9), Y4, Y3
	ADDQ $4, R8
	ADDQ BX, R9
	DECQ R10
	JMP  gt32

gt32done:
	VMOVUPS Y0, (DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	ADDQ $128, DX
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  gblk32

gblk8:
	CMPQ CX, $8
	JL   gdone
	VMOVUPS (DX), Y0
	MOVQ SI, R8
	MOVQ DI, R9
	MOVQ R11, R10

gt8:
	TESTQ R10, R10
	JE    gt8done
	VBROADCASTSS (R8), Y4
	VFMADD231PS (R9), Y4, Y0
	ADDQ $4, R8
	ADDQ BX, R9
	DECQ R10
	JMP  gt8

gt8done:
	VMOVUPS Y0, (DX)
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  gblk8

gdone:
	VZEROUPPER
	RET

// func scoresAVX2(q, k *float32, d, n, stride int, scale float32, out *float32) float32
// out[t] = scale * (q . k[t*stride : t*stride+d]) for t < n, d % 8 == 0,
// stride in floats; returns max_t out[t] (-inf for n == 0). Keys go four
// at a time: q is loaded once per four keys, four independent FMA chains.
TEXT ·scoresAVX2(SB), NOSPLIT, $0-60
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), DI
	MOVQ d+16(FP), CX
	SHLQ $2, CX                   // row bytes
	MOVQ n+24(FP), DX
	MOVQ stride+32(FP), R8
	SHLQ $2, R8                   // stride in bytes
	VBROADCASTSS scale+40(FP), X15
	MOVQ out+48(FP), R9
	MOVL $0xff800000, AX          // -inf
	MOVQ AX, X14
	VBROADCASTSS X14, X14
	LEAQ (R8)(R8*2), R10          // 3*stride bytes

s8:
	CMPQ DX, $8
	JL   s4
	MOVQ DI, R12                  // keys 0..3: (R12), +stride, +2, +3
	LEAQ (DI)(R8*4), R13          // keys 4..7
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ BX, BX

s8j:
	VMOVUPS (SI)(BX*1), Y8
	VFMADD231PS (R12), Y8, Y0
	VFMADD231PS (R12)(R8*1), Y8, Y1
	VFMADD231PS (R12)(R8*2), Y8, Y2
	VFMADD231PS (R12)(R10*1), Y8, Y3
	VFMADD231PS (R13), Y8, Y4
	VFMADD231PS (R13)(R8*1), Y8, Y5
	VFMADD231PS (R13)(R8*2), Y8, Y6
	VFMADD231PS (R13)(R10*1), Y8, Y7
	ADDQ $32, R12
	ADDQ $32, R13
	ADDQ $32, BX
	CMPQ BX, CX
	JL   s8j

	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMULPS X15, X0, X0
	VMAXPS X0, X14, X14
	VMOVUPS X0, (R9)
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	VMULPS X15, X4, X4
	VMAXPS X4, X14, X14
	VMOVUPS X4, 16(R9)
	ADDQ $32, R9
	LEAQ (DI)(R8*8), DI
	SUBQ $8, DX
	JMP  s8

s4:
	CMPQ DX, $4
	JL   s1
	MOVQ DI, R10                  // k0
	LEAQ (DI)(R8*1), R11          // k1
	LEAQ (R11)(R8*1), R12         // k2
	LEAQ (R12)(R8*1), R13         // k3
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ BX, BX                   // byte offset in the row

s4j:
	VMOVUPS (SI)(BX*1), Y4
	VFMADD231PS (R10)(BX*1), Y4, Y0
	VFMADD231PS (R11)(BX*1), Y4, Y1
	VFMADD231PS (R12)(BX*1), Y4, Y2
	VFMADD231PS (R13)(BX*1), Y4, Y3
	ADDQ $32, BX
	CMPQ BX, CX
	JL   s4j

	// Horizontal sums: X0 = [sum Y0, sum Y1, sum Y2, sum Y3].
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMULPS X15, X0, X0
	VMAXPS X0, X14, X14
	VMOVUPS X0, (R9)
	ADDQ $16, R9
	LEAQ (R13)(R8*1), DI
	SUBQ $4, DX
	JMP  s4

s1:
	TESTQ DX, DX
	JE   sdone
	VXORPS Y0, Y0, Y0
	XORQ BX, BX

s1j:
	VMOVUPS (SI)(BX*1), Y4
	VFMADD231PS (DI)(BX*1), Y4, Y0
	ADDQ $32, BX
	CMPQ BX, CX
	JL   s1j

	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMULSS X15, X0, X0
	VMAXSS X0, X14, X14           // lane 0 of X14 = max(lane 0, score)
	VMOVSS X0, (R9)
	ADDQ $4, R9
	ADDQ R8, DI
	DECQ DX
	JMP  s1

sdone:
	// max over the four lanes of X14.
	VPERMILPS $0x4e, X14, X1
	VMAXPS X1, X14, X14
	VPERMILPS $0xb1, X14, X1
	VMAXPS X1, X14, X14
	VZEROUPPER
	MOVSS X14, ret+56(FP)
	RET

// Constants of expSumAVX2.
DATA expc<>+0(SB)/4, $0xc2a00000  // -80.0: the smallest argument
DATA expc<>+4(SB)/4, $0x3fb8aa3b  // log2(e)
DATA expc<>+8(SB)/4, $0x3f000000  // 0.5
DATA expc<>+12(SB)/4, $0x3f318000 // ln2 hi 0.693359375
DATA expc<>+16(SB)/4, $0xb95e8083 // ln2 lo -2.12194440e-4
DATA expc<>+20(SB)/4, $0x3f800000 // 1.0
DATA expc<>+24(SB)/4, $0x39506967 // 1.9875691500e-4
DATA expc<>+28(SB)/4, $0x3ab743ce // 1.3981999507e-3
DATA expc<>+32(SB)/4, $0x3c088908 // 8.3334519073e-3
DATA expc<>+36(SB)/4, $0x3d2aa9c1 // 4.1665795894e-2
DATA expc<>+40(SB)/4, $0x3e2aaaaa // 1.6666665459e-1
DATA expc<>+44(SB)/4, $0x3f000000 // 5.0000001201e-1
GLOBL expc<>(SB), RODATA|NOPTR, $48

// func expSumAVX2(s *float32, n int, m float32) float32
// s[i] = exp(s[i] - m) for i < n, n % 8 == 0, s[i] <= m; returns the sum.
// Cephes expf: x = k ln2 + r, |r| <= ln2/2, e^r by a polynomial, 2^k
// through the exponent bits. Arguments below -80 are clamped (e^-80 =
// 1.8e-35 is negligible next to the sum, which is at least 1, and stays
// a normal number: denormals would take the slow path in accumAVX2).
TEXT ·expSumAVX2(SB), NOSPLIT, $0-28
	MOVQ s+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS m+16(FP), Y15
	VXORPS Y14, Y14, Y14          // sum
	VBROADCASTSS expc<>+0(SB), Y13
	VBROADCASTSS expc<>+4(SB), Y12
	VBROADCASTSS expc<>+8(SB), Y11
	VBROADCASTSS expc<>+12(SB), Y10
	VBROADCASTSS expc<>+16(SB), Y9
	VBROADCASTSS expc<>+20(SB), Y8
	VBROADCASTSS expc<>+24(SB), Y7
	VBROADCASTSS expc<>+28(SB), Y6
	VBROADCASTSS expc<>+32(SB), Y5

eloop:
	CMPQ CX, $8
	JL   edone
	VMOVUPS (SI), Y0
	VSUBPS Y15, Y0, Y0            // x = s - m
	VMAXPS Y13, Y0, Y0            // x = max(x, -80)
	VMOVAPS Y11, Y1
	VFMADD231PS Y12, Y0, Y1       // t = x*log2e + 0.5
	VROUNDPS $1, Y1, Y1           // k = floor(t)
	VFNMADD231PS Y10, Y1, Y0      // r = x - k*ln2hi
	VFNMADD231PS Y9, Y1, Y0       // r -= k*ln2lo
	VMOVAPS Y7, Y2
	VFMADD213PS Y6, Y0, Y2        // p = p*r + c
	VFMADD213PS Y5, Y0, Y2
	VBROADCASTSS expc<>+36(SB), Y3
	VFMADD213PS Y3, Y0, Y2
	VBROADCASTSS expc<>+40(SB), Y3
	VFMADD213PS Y3, Y0, Y2
	VBROADCASTSS expc<>+44(SB), Y3
	VFMADD213PS Y3, Y0, Y2
	VMULPS Y0, Y0, Y3             // r*r
	VFMADD213PS Y0, Y3, Y2        // e = p*r*r + r
	VADDPS Y8, Y2, Y2             // e += 1
	VCVTPS2DQ Y1, Y1              // k as int32 (exact: k is integral)
	VPSLLD $23, Y1, Y1
	VPADDD Y8, Y1, Y1             // bits of 2^k = (k+127) << 23
	VMULPS Y1, Y2, Y2
	VMOVUPS Y2, (SI)
	VADDPS Y2, Y14, Y14
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  eloop

edone:
	VEXTRACTF128 $1, Y14, X1
	VADDPS X1, X14, X14
	VHADDPS X14, X14, X14
	VHADDPS X14, X14, X14
	VZEROUPPER
	MOVSS X14, ret+24(FP)
	RET

// func accumAVX2(p *float32, n int, v *float32, stride, d int, acc *float32)
// acc[j] += sum_{t<n} p[t]*v[t*stride+j] for j < d, d % 8 == 0, stride
// in floats. Columns go 32 at a time with two sets of four accumulators
// (even and odd t), then 8 at a time.
TEXT ·accumAVX2(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), R11
	MOVQ v+16(FP), DI
	MOVQ stride+24(FP), BX
	SHLQ $2, BX
	MOVQ d+32(FP), CX
	MOVQ acc+40(FP), DX

ablk32:
	CMPQ CX, $32
	JL   ablk8
	VMOVUPS (DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS 64(DX), Y2
	VMOVUPS 96(DX), Y3
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	MOVQ SI, R8
	MOVQ DI, R9
	MOVQ R11, R10

at2:
	CMPQ R10, $2
	JL   at1
	VBROADCASTSS (R8), Y4
	VBROADCASTSS 4(R8), Y9
	LEAQ (R9)(BX*1), R12
	VFMADD231PS (R9), Y4, Y0
	VFMADD231PS 32(R9), Y4, Y1
	VFMADD231PS 64(R9), Y4, Y2
	VFMADD231PS 96(R9), Y4, Y3
	VFMADD231PS (R12), Y9, Y5
	VFMADD231PS 32(R12), Y9, Y6
	VFMADD231PS 64(R12), Y9, Y7
	VFMADD231PS 96(R12), Y9, Y8
	ADDQ $8, R8
	LEAQ (R12)(BX*1), R9
	SUBQ $2, R10
	JMP  at2

at1:
	TESTQ R10, R10
	JE    at32done
	VBROADCASTSS (R8), Y4
	VFMADD231PS (R9), Y4, Y0
	VFMADD231PS 32(R9), Y4, Y1
	VFMADD231PS 64(R9), Y4, Y2
	VFMADD231PS 96(R9), Y4, Y3

at32done:
	VADDPS Y5, Y0, Y0
	VADDPS Y6, Y1, Y1
	VADDPS Y7, Y2, Y2
	VADDPS Y8, Y3, Y3
	VMOVUPS Y0, (DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	ADDQ $128, DX
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  ablk32

ablk8:
	CMPQ CX, $8
	JL   adone
	VMOVUPS (DX), Y0
	MOVQ SI, R8
	MOVQ DI, R9
	MOVQ R11, R10

at8:
	TESTQ R10, R10
	JE    at8done
	VBROADCASTSS (R8), Y4
	VFMADD231PS (R9), Y4, Y0
	ADDQ $4, R8
	ADDQ BX, R9
	DECQ R10
	JMP  at8

at8done:
	VMOVUPS Y0, (DX)
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  ablk8

adone:
	VZEROUPPER
	RET
