// Tensor-core helpers shared by mma.cu (Quest's score and attention) and
// model.cu (the GEMV of the device executor): 16-bit pairs, the hi + lo
// split of a float operand, one m16n8k16 mma with fp32 accumulation, and
// the streaming 16-byte load and ex2.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

template <typename T> struct pack2;
template <> struct pack2<__half> {
	static __device__ __forceinline__ uint32_t from(float a, float b) {
		__half2 h = __floats2half2_rn(a, b);
		return *reinterpret_cast<uint32_t*>(&h);
	}
	static __device__ __forceinline__ float2 to(uint32_t u) {
		return __half22float2(*reinterpret_cast<__half2*>(&u));
	}
};
template <> struct pack2<__nv_bfloat16> {
	static __device__ __forceinline__ uint32_t from(float a, float b) {
		__nv_bfloat162 h = __floats2bfloat162_rn(a, b);
		return *reinterpret_cast<uint32_t*>(&h);
	}
	static __device__ __forceinline__ float2 to(uint32_t u) {
		return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u));
	}
};

// split packs (a, b) into hi and the rounding remainder lo, both as T pairs.
template <typename T> __device__ __forceinline__ void split(float a, float b, uint32_t& hi, uint32_t& lo) {
	hi = pack2<T>::from(a, b);
	const float2 h = pack2<T>::to(hi);
	lo = pack2<T>::from(a - h.x, b - h.y);
}

template <typename T> __device__ __forceinline__ void mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma<__nv_bfloat16>(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma<__half>(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldg_nc(const void* p) {
	uint4 r;
	asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
		     : "l"(p));
	return r;
}

// ex2 is 2^x with subnormal results flushed to zero (one MUFU.EX2, no
// fix-up around it as exp2f needs): softmax weights below 2^-126 are zero.
__device__ __forceinline__ float ex2(float x) {
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
}
