// Page scores from the summaries on the CUDA cores (quest.cu): the generic
// kernel and the D = 128 fast paths. The tensor-core score kernels are in
// mma.cu, the fp8 ones in fp8.cuh.
#pragma once

#include "common.cuh"

// score: U[row][p] for every page of every sequence. Block (chunk, seq):
// the split queries w = [min(q,0); max(q,0)] of all query heads sit in
// shared memory; each warp takes (page, kv head) records in layout order and
// computes the G dot products of the record with its group's w vectors.
// Requires D % 8 == 0 and G <= 32.
#define SCORE_WARPS 8
template <typename T>
__device__ void score(const T* sum, const int* indptr, const int* pages, const float* q, float* out,
		      i64 qh, i64 kvh, i64 D, i64 per_head, i64 chunk) {
	extern __shared__ float w[];  // [qh][2D]
	const i64 seq = blockIdx.y;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const i64 lo = blockIdx.x * chunk;
	if (lo >= np) return;
	const i64 hi = min(lo + chunk, np);
	const i64 rec = 2 * D;
	const float* qs = q + seq * qh * D;
	for (i64 i = threadIdx.x; i < qh * D; i += blockDim.x) {
		const i64 h = i / D, j = i % D;
		const float x = qs[i];
		w[h * rec + j] = fminf(x, 0.f);
		w[h * rec + D + j] = fmaxf(x, 0.f);
	}
	__syncthreads();
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const i64 G = qh / kvh;
	const i64 rows = per_head ? qh : kvh;
	float* o = out + p0 * rows;
	for (i64 r = lo * kvh + warp; r < hi * kvh; r += SCORE_WARPS) {
		const i64 p = r / kvh, h = r % kvh;
		const T* rp = sum + ((i64)pages[p0 + p] * kvh + h) * rec;
		float acc[32];
#pragma unroll
		for (int g = 0; g < 32; g++) acc[g] = 0.f;
		for (i64 c = lane * 8; c < rec; c += 256) {
			float x[8];
			load8<T>(rp + c, x);
#pragma unroll
			for (int g = 0; g < 32; g++) {
				if (g < G) {
					const float* wg = w + (h * G + g) * rec + c;
#pragma unroll
					for (int e = 0; e < 8; e++) acc[g] = fmaf(wg[e], x[e], acc[g]);
				}
			}
		}
		float best = __int_as_float(0xff800000);
#pragma unroll
		for (int g = 0; g < 32; g++) {
			if (g < G) {
				const float u = warp_sum(acc[g]);
				if (per_head) {
					if (lane == 0) o[(h * G + g) * np + p] = u;
				} else {
					best = fmaxf(best, u);
				}
			}
		}
		if (!per_head && lane == 0) o[h * np + p] = best;
	}
}

// Fast paths for the common shapes. score_d128: D = 128 (a summary record of
// 256 elements is exactly 32 lanes x 8), G query heads per KV head known at
// compile time. Block (page chunk, KV head, sequence), 4 warps; each lane
// keeps its 8 elements of the G split queries in registers, and each warp
// loads 4 records before computing them (memory-level parallelism).
template <typename T, int G>
__device__ void score_d128(const T* sum, const int* indptr, const int* pages, const float* q, float* out,
			   i64 qh, i64 kvh, i64 per_head, i64 chunk) {
	const i64 D = 128;
	const i64 seq = blockIdx.z, h = blockIdx.y;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const i64 lo = blockIdx.x * chunk;
	if (lo >= np) return;
	const i64 hi = min(lo + chunk, np);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int dim0 = (lane & 15) * 8;
	const bool upper = lane >= 16;  // lanes 16..31 read the maxes
	float w[G][8];
	const float* qs = q + (seq * qh + h * G) * D;
#pragma unroll
	for (int g = 0; g < G; g++) {
#pragma unroll
		for (int e = 0; e < 8; e++) {
			const float x = qs[g * D + dim0 + e];
			w[g][e] = upper ? fmaxf(x, 0.f) : fminf(x, 0.f);
		}
	}
	const i64 rows = per_head ? qh : kvh;
	float* o = out + p0 * rows;
	const int* pt = pages + p0;
	for (i64 p = lo + warp; p < hi; p += 4 * nw) {
		float x[4][8];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const i64 pp = p + u * nw;
			if (pp < hi) load8<T>(sum + ((i64)pt[pp] * kvh + h) * 256 + lane * 8, x[u]);
		}
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const i64 pp = p + u * nw;
			if (pp >= hi) break;  // uniform across the warp
			float best = __int_as_float(0xff800000);
#pragma unroll
			for (int g = 0; g < G; g++) {
				float a = 0.f;
#pragma unroll
				for (int e = 0; e < 8; e++) a = fmaf(w[g][e], x[u][e], a);
				a = warp_sum(a);
				if (per_head) {
					if (lane == 0) o[(h * G + g) * np + pp] = a;
				} else {
					best = fmaxf(best, a);
				}
			}
			if (!per_head && lane == 0) o[h * np + pp] = best;
		}
	}
}

// score_d128_g4: D = 128, G = 4 (Llama-3-8B's 32/8 heads). Half a warp per
// record: lane l reads 16 elements (sub = l & 15) of record l >> 4, so one
// loop iteration of a warp covers 8 records (4 pairs, 8 loads in flight per
// lane), and the four heads' partial sums are reduced over the 16 lanes
// with a transposed butterfly (4 shuffles instead of 16).
template <typename T, int U>
__device__ void score_d128_g4(const T* sum, const int* indptr, const int* pages, const float* q, float* out,
			      i64 qh, i64 kvh, i64 per_head, i64 chunk) {
	const int D = 128;
	const i64 seq = blockIdx.z, h = blockIdx.y;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const i64 lo = blockIdx.x * chunk;
	if (lo >= np) return;
	const i64 hi = min(lo + chunk, np);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int sub = lane & 15, half = lane >> 4;
	const bool upper = sub >= 8;
	const int dim0 = (sub & 7) * 16;
	float w[4][16];
	const float* qs = q + (seq * qh + h * 4) * D;
#pragma unroll
	for (int g = 0; g < 4; g++) {
#pragma unroll
		for (int e = 0; e < 16; e++) {
			const float x = qs[g * D + dim0 + e];
			w[g][e] = upper ? fmaxf(x, 0.f) : fminf(x, 0.f);
		}
	}
	const i64 rows = per_head ? qh : kvh;
	float* o = out + p0 * rows;
	const int* pt = pages + p0;
	const bool b3 = sub & 8, b2 = sub & 4;
	// The loop variable is warp-uniform (both half-warps run every
	// iteration, so the full-mask shuffles below always have all lanes);
	// each half guards its own record.
	for (i64 p0 = lo + 2 * warp; p0 < hi; p0 += 2 * U * nw) {
		const i64 p = p0 + half;
		float x[U][16];
#pragma unroll
		for (int u = 0; u < U; u++) {
			const i64 pp = p + u * 2 * nw;
			if (pp < hi) {
				const T* r = sum + ((i64)pt[pp] * kvh + h) * 256 + sub * 16;
				load8<T>(r, x[u]);
				load8<T>(r + 8, x[u] + 8);
			} else {
#pragma unroll
				for (int e = 0; e < 16; e++) x[u][e] = 0.f;
			}
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			const i64 pp = p + u * 2 * nw;
			float a[4];
#pragma unroll
			for (int g = 0; g < 4; g++) {
				a[g] = 0.f;
#pragma unroll
				for (int e = 0; e < 16; e++) a[g] = fmaf(w[g][e], x[u][e], a[g]);
			}
			// Transposed butterfly over the 16 lanes of this record.
			const float kx = b3 ? a[2] : a[0], ky = b3 ? a[3] : a[1];
			const float sx = b3 ? a[0] : a[2], sy = b3 ? a[1] : a[3];
			const float vx = kx + __shfl_xor_sync(0xffffffffu, sx, 8);
			const float vy = ky + __shfl_xor_sync(0xffffffffu, sy, 8);
			float v = (b2 ? vy : vx) + __shfl_xor_sync(0xffffffffu, b2 ? vx : vy, 4);
			v += __shfl_xor_sync(0xffffffffu, v, 2);
			v += __shfl_xor_sync(0xffffffffu, v, 1);
			// Lane sub = 4*g' holds head g' = 2*b3 + b2.
			if (per_head) {
				if (pp < hi && (sub & 3) == 0) o[(h * 4 + (sub >> 2)) * np + pp] = v;
			} else {
				float m = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
				m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
				if (pp < hi && sub == 0) o[h * np + pp] = m;
			}
		}
	}
}

#define SCORE_ENTRIES(SUF, T)                                                                                      \
	extern "C" __global__ void quest_score_##SUF(const T* sum, const int* indptr, const int* pages,             \
						     const float* q, float* out, i64 qh, i64 kvh, i64 D,              \
						     i64 per_head, i64 chunk) {                                       \
		score<T>(sum, indptr, pages, q, out, qh, kvh, D, per_head, chunk);                               \
	}                                                                                                          \
	extern "C" __global__ void quest_score128_##SUF##_g1(const T* s, const int* a, const int* b, const float* q, \
							    float* o, i64 qh, i64 kvh, i64 ph, i64 c) {        \
		score_d128<T, 1>(s, a, b, q, o, qh, kvh, ph, c);                                                   \
	}                                                                                                          \
	extern "C" __global__ void quest_score128_##SUF##_g2(const T* s, const int* a, const int* b, const float* q, \
							    float* o, i64 qh, i64 kvh, i64 ph, i64 c) {        \
		score_d128<T, 2>(s, a, b, q, o, qh, kvh, ph, c);                                                   \
	}                                                                                                          \
	extern "C" __global__ void quest_score128_##SUF##_g4(const T* s, const int* a, const int* b, const float* q, \
							    float* o, i64 qh, i64 kvh, i64 ph, i64 c) {        \
		score_d128<T, 4>(s, a, b, q, o, qh, kvh, ph, c);                                                   \
	}                                                                                                          \
	extern "C" __global__ void quest_score128_##SUF##_g8(const T* s, const int* a, const int* b, const float* q, \
							    float* o, i64 qh, i64 kvh, i64 ph, i64 c) {        \
		score_d128<T, 8>(s, a, b, q, o, qh, kvh, ph, c);                                                   \
	}

SCORE_ENTRIES(f32, float)
SCORE_ENTRIES(f16, __half)
SCORE_ENTRIES(bf16, __nv_bfloat16)

#define SCORE128G4_ENTRIES(SUF, T)                                                                                 \
	extern "C" __global__ void quest_score128g4_##SUF(const T* s, const int* a, const int* b, const float* q,     \
							 float* o, i64 qh, i64 kvh, i64 ph, i64 c) {           \
		score_d128_g4<T, 2>(s, a, b, q, o, qh, kvh, ph, c);                                                \
	}

SCORE128G4_ENTRIES(f16, __half)
SCORE128G4_ENTRIES(bf16, __nv_bfloat16)
