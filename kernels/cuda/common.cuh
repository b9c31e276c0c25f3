// Common device helpers of the Quest kernels (quest.cu): the 64-bit integer
// parameter type, conversions between the storage types and float, warp
// reductions and vectorized loads.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

typedef long long i64;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
	return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
	return x;
}

// Loads 8 consecutive elements of type T at p (16-byte aligned for 2-byte
// types, 32 bytes for float) as floats.
template <typename T> __device__ __forceinline__ void load8(const T* p, float* out);
template <> __device__ __forceinline__ void load8<float>(const float* p, float* out) {
	float4 a = *reinterpret_cast<const float4*>(p);
	float4 b = *reinterpret_cast<const float4*>(p + 4);
	out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
	out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
template <> __device__ __forceinline__ void load8<__half>(const __half* p, float* out) {
	uint4 u = *reinterpret_cast<const uint4*>(p);
	const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 f = __half22float2(h[i]);
		out[2 * i] = f.x; out[2 * i + 1] = f.y;
	}
}
template <> __device__ __forceinline__ void load8<__nv_bfloat16>(const __nv_bfloat16* p, float* out) {
	uint4 u = *reinterpret_cast<const uint4*>(p);
	const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 f = __bfloat1622float2(h[i]);
		out[2 * i] = f.x; out[2 * i + 1] = f.y;
	}
}
