// Storage-type conversion of uploaded float32 arrays and benchmark data
// generated on the device (quest.cu).
#pragma once

#include "common.cuh"

// convert: dst[i] = T(src[i]) (uploading float32 pools into T storage).
template <typename T>
__device__ void convert(const float* src, T* dst, i64 n) {
	for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
		dst[i] = from_f<T>(src[i]);
}

// fill_random: dst[i] = T(uniform[-1, 1)) from a splitmix64 hash of
// (seed, i): benchmark data generated on the device.
template <typename T>
__device__ void fill_random(T* dst, i64 n, i64 seed) {
	for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
		unsigned long long z = (unsigned long long)seed * 0x9e3779b97f4a7c15ull + (unsigned long long)i;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		dst[i] = from_f<T>((float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f);
	}
}

#define CONVERT_ENTRIES(SUF, T)                                                                                  \
	extern "C" __global__ void quest_convert_##SUF(const float* src, T* dst, i64 n) { convert<T>(src, dst, n); } \
	extern "C" __global__ void quest_fill_##SUF(T* dst, i64 n, i64 seed) { fill_random<T>(dst, n, seed); }

CONVERT_ENTRIES(f32, float)
CONVERT_ENTRIES(f16, __half)
CONVERT_ENTRIES(bf16, __nv_bfloat16)
