// Offload kernels: a pool whose K/V live in fewer device slots than the pool
// has pages (summaries stay indexed by physical page, K/V by device slot),
// and the moves of page payloads between those slots and a host tier in
// pinned memory the device maps (zero-copy: the kernels read and write the
// tier over PCIe directly, one launch for any number of pages). Tokens
// are appended to a slot pool by quest.cu's append (page.cuh) given the
// pages' slots.
//
// Tier payload layout (pagestore/tier): layer-major, K then V, each one
// slot's [KVHeads][PageSize][HeadDim] block in the pool's storage type.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

typedef long long i64;

__device__ __forceinline__ float sl_to_f(float x) { return x; }
__device__ __forceinline__ float sl_to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float sl_to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T sl_from_f(float x);
template <> __device__ __forceinline__ float sl_from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half sl_from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 sl_from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// quest_slots_move copies page payloads between the mapped host tier and
// the slot pools. Grid (moves, 2 * layers): block (m, w) copies block w
// (layer w / 2, K when w is even, V when odd) of move m; moves[2m] is the
// tier page, moves[2m + 1] the slot. kv[w] is the device address of the
// pool array of block w (K0, V0, K1, V1, ...). blk is the bytes of one
// slot's K (or V) block, a multiple of 16, as is payload. save != 0 copies
// slot to tier, else tier to slot.
extern "C" __global__ void quest_slots_move(const long long* kv, unsigned char* tier, const int* moves, i64 blk,
					    i64 payload, i64 save) {
	const i64 m = blockIdx.x, w = blockIdx.y;
	const i64 page = moves[2 * m], slot = moves[2 * m + 1];
	uint4* dev = reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(kv[w]) + slot * blk);
	uint4* host = reinterpret_cast<uint4*>(tier + page * payload + w * blk);
	const i64 n = blk / 16;
	if (save) {
		for (i64 i = threadIdx.x; i < n; i += blockDim.x) host[i] = dev[i];
	} else {
		for (i64 i = threadIdx.x; i < n; i += blockDim.x) dev[i] = host[i];
	}
}

// rescan_slots recomputes the summary of page pages[i] from the first
// valid keys of slot slots[i]. Grid (pages, KV heads).
template <typename T>
__device__ void rescan_slots(const T* K, T* sum, const int* pages, const int* slots, i64 kvh, i64 D, i64 S,
			     i64 valid) {
	const i64 p = pages[blockIdx.x], sl = slots[blockIdx.x], h = blockIdx.y;
	const T* blk = K + (sl * kvh + h) * S * D;
	T* rec = sum + (p * kvh + h) * 2 * D;
	for (i64 j = threadIdx.x; j < D; j += blockDim.x) {
		float lo = __int_as_float(0x7f800000), hi = __int_as_float(0xff800000);
		for (i64 t = 0; t < valid; t++) {
			const float x = sl_to_f(blk[t * D + j]);
			lo = fminf(lo, x);
			hi = fmaxf(hi, x);
		}
		rec[j] = sl_from_f<T>(lo);
		rec[D + j] = sl_from_f<T>(hi);
	}
}

#define SLOTS_INSTANTIATE(SUF, T)                                                                                  \
	extern "C" __global__ void quest_rescan_slots_##SUF(const T* K, T* sum, const int* pages, const int* slots,   \
							    i64 kvh, i64 D, i64 S, i64 valid) {                        \
		rescan_slots<T>(K, sum, pages, slots, kvh, D, S, valid);                                         \
	}

SLOTS_INSTANTIATE(f32, float)
SLOTS_INSTANTIATE(f16, __half)
SLOTS_INSTANTIATE(bf16, __nv_bfloat16)
