// Offload kernels: a pool whose K/V live in fewer device slots than the pool
// has pages (summaries stay indexed by physical page, K/V by device slot),
// and the moves of page payloads between those slots and a host tier in
// pinned memory the device maps (zero-copy: the kernels read and write the
// tier over PCIe directly, one launch for any number of pages). Tokens
// are appended to a slot pool by quest.cu's append (page.cuh; fp8 records:
// kvfp8.cuh) given the pages' slots, and fp8 slots are rescanned there too
// (quest_rescan_slots_fp8).
//
// Tier payload layout (pagestore/tier): layer-major, each layer a run of
// segments, one slot's part of each of the layer's slot arrays: K then V,
// each [KVHeads][PageSize][HeadDim] in the pool's storage type; for fp8
// records K codes, K scales, V codes, V scales (pagestore's packFP8).

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
// the slot pools. A payload is a run of segments; segs holds three 64-bit
// values per segment w: the device address of the slot array it comes
// from (K0, V0, K1, ... or, for fp8 records, K0 codes, K0 scales, V0
// codes, ...), its bytes (one slot's part of that array, also the array's
// stride per slot, a multiple of 4) and its offset in the payload. Grid
// (moves, segments): block (m, w) copies segment w of move m; moves[2m] is
// the tier page, moves[2m + 1] the slot. save != 0 copies slot to tier,
// else tier to slot. A segment whose two ends and size are 16-byte aligned
// moves in 16-byte words, another in 4-byte words.
template <typename W>
__device__ __forceinline__ void move_words(void* dst, const void* src, i64 bytes) {
	W* d = reinterpret_cast<W*>(dst);
	const W* s = reinterpret_cast<const W*>(src);
	const i64 n = bytes / (i64)sizeof(W);
	for (i64 i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

extern "C" __global__ void quest_slots_move(const long long* segs, unsigned char* tier, const int* moves, i64 payload,
					    i64 save) {
	const i64 m = blockIdx.x, w = blockIdx.y;
	const i64 page = moves[2 * m], slot = moves[2 * m + 1];
	const i64 size = segs[3 * w + 1];
	unsigned char* dev = reinterpret_cast<unsigned char*>(segs[3 * w]) + slot * size;
	unsigned char* host = tier + page * payload + segs[3 * w + 2];
	unsigned char* dst = save ? host : dev;
	const unsigned char* src = save ? dev : host;
	if (((reinterpret_cast<unsigned long long>(dev) | reinterpret_cast<unsigned long long>(host) | (unsigned long long)size) & 15) == 0) {
		move_words<uint4>(dst, src, size);
	} else {
		move_words<unsigned>(dst, src, size);
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

// The page -> slot table of a slot pool (slottable.go): slot[page] is the
// page's device slot (-1: not resident), use[page] the tick of the last
// fused step that attended the page through the table.

// quest_slot_table_write sets slot[ps[i]] = ps[n + i] for i < n (the
// pages, then their slots, in one array). One thread per entry.
extern "C" __global__ void quest_slot_table_write(int* slot, const int* ps, i64 n) {
	const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) slot[ps[i]] = ps[n + i];
}

// quest_slot_resolve readdresses the pages a step attends by slot and
// stamps their uses: attention work item w covers list positions
// [lo[w], hi[w]) of sequence seq[w], whose physical pages start at
// ind[seq] in pages; lists holds logical pages (the iota for lists of
// every page). For each listed page p at batch position i it writes
// out[i] = slot[p] (slot 0 for a page without one: only resident pages
// are attended this way) and, when use is set, use[p] = tick. out holds
// valid entries only at listed positions, the only ones attention reads.
// Launched as a programmatic dependent of the top-K that writes the
// lists (griddepcontrol.wait first); the attention is its dependent in
// turn. Grid (items).
extern "C" __global__ void quest_slot_resolve(const int* ind, const int* pages, const int* seq, const int* lo,
					      const int* hi, const int* lists, const int* slot, unsigned long long* use,
					      int* out, i64 tick) {
	asm volatile("griddepcontrol.wait;\n" ::: "memory");
	const i64 w = blockIdx.x;
	const i64 base = ind[seq[w]];
	for (i64 j = lo[w] + threadIdx.x; j < hi[w]; j += blockDim.x) {
		const int lp = lists[j];
		if (lp < 0) continue;
		const i64 i = base + lp;
		const int p = pages[i];
		out[i] = max(slot[p], 0);
		if (use) use[p] = (unsigned long long)tick;
	}
}
