// Split-K sparse paged attention on the CUDA cores (quest.cu): the generic
// kernel and the pipelined ones for D 64 and 128 (attendp: S <= 32,
// attends16: S <= 16). Each work item writes a partial state; merge.cuh
// reduces them. The tensor-core attention kernels are in mma.cu.
#pragma once

#include "common.cuh"
#include "cpasync.cuh"

// attend: split-K sparse paged attention. One block per work item (sequence,
// row, chunk of the row's page list); one warp per query head of the row
// (G warps for group_max, 1 for per_head). Each page's K and V tile is loaded
// once into shared memory for all the heads of the block, then each warp
// runs online softmax over the page's valid tokens. Output: a partial state
// per (item, head): o normalized, lse natural log (empty: 0, -inf).
// Requires D % 8 == 0, D <= 256, S <= 64 and S * D <= 4096 elements.
#define ATT_MAX_TILE 4096
template <typename T>
__device__ void attend(const T* K, const T* V, const int* indptr, const int* pages, const int* last_len,
		       const float* q, const int* item_seq, const int* item_row, const int* item_lo,
		       const int* item_hi, const int* lists, float* part_o, float* part_lse,
		       i64 qh, i64 kvh, i64 D, i64 S, i64 per_head) {
	__shared__ __align__(16) T ks[ATT_MAX_TILE];
	__shared__ __align__(16) T vs[ATT_MAX_TILE];
	__shared__ float logits[32][64];
	const i64 it = blockIdx.x;
	const i64 seq = item_seq[it], row = item_row[it];
	const i64 G = qh / kvh;
	const i64 heads = per_head ? 1 : G;
	const i64 kv = per_head ? row / G : row;
	const i64 h0 = per_head ? row : row * G;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const bool active = warp < heads;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const float scale = rsqrtf((float)D);
	// Each lane owns dims lane, lane+32, ... (at most 8 for D <= 256).
	float qv[8], acc[8];
#pragma unroll
	for (int e = 0; e < 8; e++) {
		const i64 j = lane + 32 * e;
		qv[e] = (active && j < D) ? q[(seq * qh + h0 + warp) * D + j] * scale : 0.f;
		acc[e] = 0.f;
	}
	float m = __int_as_float(0xff800000), l = 0.f;
	const i64 tile = S * D;
	for (i64 li = item_lo[it]; li < item_hi[it]; li++) {
		const i64 lp = lists[li];
		const i64 valid = (lp == np - 1) ? last_len[seq] : S;
		const i64 base = ((i64)pages[p0 + lp] * kvh + kv) * tile;
		__syncthreads();
		for (i64 c = threadIdx.x * 8; c < valid * D; c += blockDim.x * 8) {
			*reinterpret_cast<uint4*>(&ks[c]) = *reinterpret_cast<const uint4*>(&K[base + c]);
			if (sizeof(T) == 4) *reinterpret_cast<uint4*>(&ks[c + 4]) = *reinterpret_cast<const uint4*>(&K[base + c + 4]);
			*reinterpret_cast<uint4*>(&vs[c]) = *reinterpret_cast<const uint4*>(&V[base + c]);
			if (sizeof(T) == 4) *reinterpret_cast<uint4*>(&vs[c + 4]) = *reinterpret_cast<const uint4*>(&V[base + c + 4]);
		}
		__syncthreads();
		if (!active) continue;
		float pm = __int_as_float(0xff800000);
		for (i64 t = 0; t < valid; t++) {
			float x = 0.f;
#pragma unroll
			for (int e = 0; e < 8; e++) {
				const i64 j = lane + 32 * e;
				if (j < D) x = fmaf(qv[e], to_f(ks[t * D + j]), x);
			}
			x = warp_sum(x);
			if (lane == 0) logits[warp][t] = x;
			pm = fmaxf(pm, x);
		}
		__syncwarp();
		const float mn = fmaxf(m, pm);
		const float alpha = __expf(m - mn);  // m = -inf: alpha = 0
		l *= alpha;
#pragma unroll
		for (int e = 0; e < 8; e++) acc[e] *= alpha;
		for (i64 t = 0; t < valid; t++) {
			const float p = __expf(logits[warp][t] - mn);
			l += p;
#pragma unroll
			for (int e = 0; e < 8; e++) {
				const i64 j = lane + 32 * e;
				if (j < D) acc[e] = fmaf(p, to_f(vs[t * D + j]), acc[e]);
			}
		}
		m = mn;
		__syncwarp();
	}
	if (!active) return;
	float* po = part_o + (it * heads + warp) * D;
	const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
	for (int e = 0; e < 8; e++) {
		const i64 j = lane + 32 * e;
		if (j < D) po[j] = acc[e] * inv;
	}
	if (lane == 0) part_lse[it * heads + warp] = l > 0.f ? m + __logf(l) : __int_as_float(0xff800000);
}

// Loads N consecutive elements of T at p as floats (N*sizeof(T) bytes,
// aligned to that size).
template <typename T, int N> __device__ __forceinline__ void loadn(const T* p, float* out) {
#pragma unroll
	for (int i = 0; i < N; i++) out[i] = to_f(p[i]);
}
template <> __device__ __forceinline__ void loadn<__nv_bfloat16, 4>(const __nv_bfloat16* p, float* out) {
	uint2 u = *reinterpret_cast<const uint2*>(p);
	const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
	float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
	out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}
template <> __device__ __forceinline__ void loadn<__half, 4>(const __half* p, float* out) {
	uint2 u = *reinterpret_cast<const uint2*>(p);
	const __half2* h = reinterpret_cast<const __half2*>(&u);
	float2 a = __half22float2(h[0]), b = __half22float2(h[1]);
	out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}
template <> __device__ __forceinline__ void loadn<float, 4>(const float* p, float* out) {
	float4 a = *reinterpret_cast<const float4*>(p);
	out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
}

// attend_pipe: attend for D = 32*DPL and S <= 32. Page tiles are copied
// into shared memory with cp.async, two stages deep, so the next page's K/V
// is in flight while this one is computed. Lane l owns the DPL contiguous
// dims [l*DPL, (l+1)*DPL) and, for the softmax, token l of the page.
// Dynamic shared memory: 2*STAGES tiles of S*D elements of T (K and V).
template <typename T, int DPL, int STAGES>
__device__ void attend_pipe(const T* K, const T* V, const int* indptr, const int* pages, const int* last_len,
			    const float* q, const int* item_seq, const int* item_row, const int* item_lo,
			    const int* item_hi, const int* lists, float* part_o, float* part_lse,
			    i64 qh, i64 kvh, i64 S, i64 per_head) {
	constexpr int D = 32 * DPL;
	extern __shared__ __align__(16) unsigned char smem[];
	__shared__ i64 s_base[64];
	__shared__ int s_valid[64];
	const i64 tile = S * D;
	T* kb = reinterpret_cast<T*>(smem);
	T* vb = kb + STAGES * tile;
	const i64 it = blockIdx.x;
	const i64 seq = item_seq[it], row = item_row[it];
	const i64 G = qh / kvh;
	const i64 heads = per_head ? 1 : G;
	const i64 kv = per_head ? row / G : row;
	const i64 h0 = per_head ? row : row * G;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const bool active = warp < heads;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const float scale = rsqrtf((float)D);
	float qv[DPL], acc[DPL];
#pragma unroll
	for (int e = 0; e < DPL; e++) {
		qv[e] = active ? q[(seq * qh + h0 + warp) * D + lane * DPL + e] * scale : 0.f;
		acc[e] = 0.f;
	}
	float m = __int_as_float(0xff800000), l = 0.f;
	const i64 lo = item_lo[it], hi = item_hi[it];  // hi - lo <= 64
	// Page addresses and valid lengths once, up front: the pipeline below
	// issues copies without dependent global loads.
	for (i64 k = threadIdx.x; k < hi - lo; k += blockDim.x) {
		const i64 lp = lists[lo + k];
		s_base[k] = ((i64)pages[p0 + lp] * kvh + kv) * tile;
		s_valid[k] = lp == np - 1 ? last_len[seq] : (int)S;
	}
	__syncthreads();
	auto valid_of = [&](i64 li) -> i64 { return s_valid[li - lo]; };
	auto issue = [&](int stage, i64 li) {
		const i64 base = s_base[li - lo];
		const i64 bytes = valid_of(li) * D * (i64)sizeof(T);
		const char* ks = reinterpret_cast<const char*>(K + base);
		const char* vs = reinterpret_cast<const char*>(V + base);
		char* kd = reinterpret_cast<char*>(kb + stage * tile);
		char* vd = reinterpret_cast<char*>(vb + stage * tile);
		for (i64 off = threadIdx.x * 16; off < bytes; off += blockDim.x * 16) {
			cp_async16(kd + off, ks + off);
			cp_async16(vd + off, vs + off);
		}
	};
#pragma unroll
	for (int st = 0; st < STAGES - 1; st++) {
		if (lo + st < hi) issue(st, lo + st);
		cp_async_commit();
	}
	for (i64 li = lo; li < hi; li++) {
		const int stage = (int)((li - lo) % STAGES);
		cp_async_wait<STAGES - 2>();
		__syncthreads();
		if (active) {
			const i64 valid = valid_of(li);
			const T* kt = kb + stage * tile + lane * DPL;
			const T* vt = vb + stage * tile + lane * DPL;
			float my = __int_as_float(0xff800000), pm = __int_as_float(0xff800000);
			for (i64 t = 0; t < valid; t++) {
				float kx[DPL];
				loadn<T, DPL>(kt + t * D, kx);
				float x = 0.f;
#pragma unroll
				for (int e = 0; e < DPL; e++) x = fmaf(qv[e], kx[e], x);
				x = warp_sum(x);
				if (lane == t) my = x;
				pm = fmaxf(pm, x);
			}
			const float mn = fmaxf(m, pm);
			const float alpha = __expf(m - mn);
			const float myp = lane < valid ? __expf(my - mn) : 0.f;
			l = l * alpha + warp_sum(myp);
#pragma unroll
			for (int e = 0; e < DPL; e++) acc[e] *= alpha;
			for (i64 t = 0; t < valid; t++) {
				const float p = __shfl_sync(0xffffffffu, myp, (int)t);
				float vx[DPL];
				loadn<T, DPL>(vt + t * D, vx);
#pragma unroll
				for (int e = 0; e < DPL; e++) acc[e] = fmaf(p, vx[e], acc[e]);
			}
			m = mn;
		}
		__syncthreads();
		// Refill the stage computed one iteration ago with the page
		// STAGES-1 ahead.
		if (li + STAGES - 1 < hi) issue((int)((li - lo + STAGES - 1) % STAGES), li + STAGES - 1);
		cp_async_commit();
	}
	if (!active) return;
	float* po = part_o + (it * heads + warp) * D + lane * DPL;
	const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
	for (int e = 0; e < DPL; e++) po[e] = acc[e] * inv;
	if (lane == 0) part_lse[it * heads + warp] = l > 0.f ? m + __logf(l) : __int_as_float(0xff800000);
}

// attend_s16: attention for D = 32*DPL, S <= 16, the page tile staged by
// cp.async (STAGES deep) with its 16-byte chunks XOR-swizzled by row so
// that QK's per-token reads are free of bank conflicts. QK: lane l takes
// token l & 15 and half l >> 4 of the dims; AV: lane l owns DPL
// contiguous dims.
template <typename T, int DPL, int STAGES>
__device__ void attend_s16(const T* K, const T* V, const int* indptr, const int* pages, const int* last_len,
			   const float* q, const int* item_seq, const int* item_row, const int* item_lo,
			   const int* item_hi, const int* lists, float* part_o, float* part_lse,
			   i64 qh, i64 kvh, i64 S, i64 per_head) {
	static_assert(sizeof(T) == 2, "16-bit storage only");
	constexpr int D = 32 * DPL;
	constexpr int ROWB = D * (int)sizeof(T);  // bytes per token row
	constexpr int HALF = D / 2;
	constexpr int CH = HALF * (int)sizeof(T) / 16;  // 16-byte chunks per half row
	// Dynamic shared memory: K stages, V stages, then the block's
	// pre-scaled queries (heads x D floats).
	extern __shared__ __align__(16) unsigned char smem[];
	__shared__ i64 s_base[64];
	__shared__ int s_valid[64];
	const int tile = (int)S * ROWB;  // bytes
	unsigned char* kb = smem;
	unsigned char* vb = smem + STAGES * tile;
	float* qsm = reinterpret_cast<float*>(smem + 2 * STAGES * tile);
	const i64 it = blockIdx.x;
	const i64 seq = item_seq[it], row = item_row[it];
	const i64 G = qh / kvh;
	const int heads = per_head ? 1 : (int)G;
	const i64 kv = per_head ? row / G : row;
	const i64 h0 = per_head ? row : row * G;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const bool active = warp < heads;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const float scale = rsqrtf((float)D);
	const i64 lo = item_lo[it], hi = item_hi[it];
	for (int k = threadIdx.x; k < hi - lo; k += blockDim.x) {
		const i64 lp = lists[lo + k];
		s_base[k] = ((i64)pages[p0 + lp] * kvh + kv) * (i64)tile;
		s_valid[k] = lp == np - 1 ? last_len[seq] : (int)S;
	}
	for (int k = threadIdx.x; k < heads * D; k += blockDim.x) qsm[k] = q[(seq * qh + h0) * D + k] * scale;
	__syncthreads();
	auto issue = [&](int stage, i64 li) {
		const unsigned char* ks = reinterpret_cast<const unsigned char*>(K) + s_base[li - lo];
		const unsigned char* vs = reinterpret_cast<const unsigned char*>(V) + s_base[li - lo];
		unsigned char* kd = kb + stage * tile;
		unsigned char* vd = vb + stage * tile;
		const int bytes = s_valid[li - lo] * ROWB;
		for (int off = threadIdx.x * 16; off < bytes; off += blockDim.x * 16) {
			const int t = off / ROWB, c = (off % ROWB) / 16;
			const int dst = t * ROWB + ((c ^ (t & 7)) * 16);
			cp_async16(kd + dst, ks + off);
			cp_async16(vd + dst, vs + off);
		}
	};
	const int tok = lane & 15, hf = lane >> 4;
	float acc[DPL];
#pragma unroll
	for (int e = 0; e < DPL; e++) acc[e] = 0.f;
	float m = __int_as_float(0xff800000), l = 0.f;
#pragma unroll
	for (int st = 0; st < STAGES - 1; st++) {
		if (lo + st < hi) issue(st, lo + st);
		cp_async_commit();
	}
	for (i64 li = lo; li < hi; li++) {
		const int stage = (int)((li - lo) % STAGES);
		cp_async_wait<STAGES - 2>();
		__syncthreads();
		if (active) {
			const int valid = s_valid[li - lo];
			// Lanes past the page's valid tokens read row 0 (in bounds of
			// the tile whatever S is) and are masked below.
			const int trow = tok < valid ? tok : 0;
			const unsigned char* kt = kb + stage * tile + trow * ROWB;
			// QK: partial dot over this lane's half of the dims.
			float x = 0.f;
			const float* qh_ = qsm + warp * D + hf * HALF;
#pragma unroll
			for (int c = 0; c < CH; c++) {
				const int lc = hf * CH + c;  // logical chunk of the row
				float kx[8];
				load8<T>(reinterpret_cast<const T*>(kt + ((lc ^ (trow & 7)) * 16)), kx);
				const float4 qa = *reinterpret_cast<const float4*>(qh_ + c * 8);
				const float4 qb = *reinterpret_cast<const float4*>(qh_ + c * 8 + 4);
				x = fmaf(qa.x, kx[0], x); x = fmaf(qa.y, kx[1], x); x = fmaf(qa.z, kx[2], x); x = fmaf(qa.w, kx[3], x);
				x = fmaf(qb.x, kx[4], x); x = fmaf(qb.y, kx[5], x); x = fmaf(qb.z, kx[6], x); x = fmaf(qb.w, kx[7], x);
			}
			x += __shfl_xor_sync(0xffffffffu, x, 16);
			if (tok >= valid) x = __int_as_float(0xff800000);
			float pm = x;
#pragma unroll
			for (int o = 8; o > 0; o >>= 1) pm = fmaxf(pm, __shfl_xor_sync(0xffffffffu, pm, o));
			const float mn = fmaxf(m, pm);
			const float alpha = __expf(m - mn);
			const float p = tok < valid ? __expf(x - mn) : 0.f;
			float ps = p;
#pragma unroll
			for (int o = 8; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
			l = l * alpha + ps;
#pragma unroll
			for (int e = 0; e < DPL; e++) acc[e] *= alpha;
			const unsigned char* vt = vb + stage * tile;
			const int lb = lane * DPL * (int)sizeof(T);  // this lane's byte offset in a row
			for (int t = 0; t < valid; t++) {
				const float pt_ = __shfl_sync(0xffffffffu, p, t);
				const int off = t * ROWB + (((lb / 16) ^ (t & 7)) * 16) + lb % 16;
				float vx[DPL];
				loadn<T, DPL>(reinterpret_cast<const T*>(vt + off), vx);
#pragma unroll
				for (int e = 0; e < DPL; e++) acc[e] = fmaf(pt_, vx[e], acc[e]);
			}
			m = mn;
		}
		__syncthreads();
		if (li + STAGES - 1 < hi) issue((int)((li - lo + STAGES - 1) % STAGES), li + STAGES - 1);
		cp_async_commit();
	}
	if (!active) return;
	float* po = part_o + (it * heads + warp) * D + lane * DPL;
	const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
	for (int e = 0; e < DPL; e++) po[e] = acc[e] * inv;
	if (lane == 0) part_lse[it * heads + warp] = l > 0.f ? m + __logf(l) : __int_as_float(0xff800000);
}

#define ATTEND_ENTRIES(SUF, T)                                                                                     \
	extern "C" __global__ void __launch_bounds__(1024) quest_attend_##SUF(                                      \
	    const T* K, const T* V, const int* indptr, const int* pages, const int* last_len, const float* q,      \
	    const int* item_seq, const int* item_row, const int* item_lo, const int* item_hi, const int* lists,    \
	    float* part_o, float* part_lse, i64 qh, i64 kvh, i64 D, i64 S, i64 per_head) {                         \
		attend<T>(K, V, indptr, pages, last_len, q, item_seq, item_row, item_lo, item_hi, lists, part_o,  \
			  part_lse, qh, kvh, D, S, per_head);                                                     \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(1024) quest_attendp_##SUF##_d64(                               \
	    const T* K, const T* V, const int* indptr, const int* pages, const int* last_len, const float* q,      \
	    const int* item_seq, const int* item_row, const int* item_lo, const int* item_hi, const int* lists,    \
	    float* part_o, float* part_lse, i64 qh, i64 kvh, i64 S, i64 per_head) {                                \
		attend_pipe<T, 2, (sizeof(T) == 4 ? 2 : 3)>(K, V, indptr, pages, last_len, q, item_seq, item_row, item_lo, item_hi, lists,  \
				  part_o, part_lse, qh, kvh, S, per_head);                                         \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(1024) quest_attendp_##SUF##_d128(                              \
	    const T* K, const T* V, const int* indptr, const int* pages, const int* last_len, const float* q,      \
	    const int* item_seq, const int* item_row, const int* item_lo, const int* item_hi, const int* lists,    \
	    float* part_o, float* part_lse, i64 qh, i64 kvh, i64 S, i64 per_head) {                                \
		attend_pipe<T, 4, (sizeof(T) == 4 ? 2 : 3)>(K, V, indptr, pages, last_len, q, item_seq, item_row, item_lo, item_hi, lists,  \
				  part_o, part_lse, qh, kvh, S, per_head);                                         \
	}

ATTEND_ENTRIES(f32, float)
ATTEND_ENTRIES(f16, __half)
ATTEND_ENTRIES(bf16, __nv_bfloat16)

#define ATTENDS16_ENTRIES(SUF, T)                                                                                  \
	extern "C" __global__ void __launch_bounds__(1024) quest_attends16_##SUF##_d64(                             \
	    const T* K, const T* V, const int* indptr, const int* pages, const int* last_len, const float* q,      \
	    const int* item_seq, const int* item_row, const int* item_lo, const int* item_hi, const int* lists,    \
	    float* part_o, float* part_lse, i64 qh, i64 kvh, i64 S, i64 per_head) {                                \
		attend_s16<T, 2, 3>(K, V, indptr, pages, last_len, q, item_seq, item_row, item_lo, item_hi, lists, \
				    part_o, part_lse, qh, kvh, S, per_head);                                       \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(1024) quest_attends16_##SUF##_d128(                            \
	    const T* K, const T* V, const int* indptr, const int* pages, const int* last_len, const float* q,      \
	    const int* item_seq, const int* item_row, const int* item_lo, const int* item_hi, const int* lists,    \
	    float* part_o, float* part_lse, i64 qh, i64 kvh, i64 S, i64 per_head) {                                \
		attend_s16<T, 4, 3>(K, V, indptr, pages, last_len, q, item_seq, item_row, item_lo, item_hi, lists, \
				    part_o, part_lse, qh, kvh, S, per_head);                                       \
	}

ATTENDS16_ENTRIES(f16, __half)
ATTENDS16_ENTRIES(bf16, __nv_bfloat16)
