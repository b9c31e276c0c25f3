// fp8 summaries (quest.cu): encoding of the summary records into E4M3fn
// codes with a scale, and scoring from them on the CUDA cores.
#pragma once

#include "common.cuh"

// fp8 summaries (package kernels/fp8 documents the encoding; these kernels
// produce and read exactly its codes). Per layer, next to the 16- or 32-bit
// summary records (the master copy that append, rescan and copies keep):
//   codes   [pages][kv_heads][2][D]  E4M3fn bytes, minima rounded toward
//                                    -inf, maxima toward +inf
//   scales  [pages][kv_heads]        float32, a power of two 2^e,
//                                    e in [-126, 120]; +inf for the empty
//                                    box (codes +448 / -448) and for
//                                    records with a non-finite value
//                                    (codes -448 / +448: all space)
// The score of a record is scale * (w . code values) in fp32.

// Code of the representable magnitude next to a (0 <= a <= 448, exact):
// the largest <= a, or with up the smallest >= a.
__device__ __forceinline__ unsigned fp8_round_mag(double a, bool up) {
	if (a == 0.0) return 0u;
	int ex;
	frexp(a, &ex);                        // a = f * 2^ex, f in [0.5, 1)
	const int e = max(ex - 1, -6);        // binade; subnormal quantum below 2^-6
	double n = ldexp(a, 3 - e);           // a / quantum, exact
	n = up ? ceil(n) : floor(n);
	return (unsigned)((e + 6) * 8 + (int)n);  // n = 16 carries into the next binade
}
__device__ __forceinline__ unsigned fp8_down(double x) { return x < 0 ? 0x80u | fp8_round_mag(-x, true) : fp8_round_mag(x, false); }
__device__ __forceinline__ unsigned fp8_up(double x) { return x < 0 ? 0x80u | fp8_round_mag(-x, false) : fp8_round_mag(x, true); }

// Value of an E4M3fn code (never a NaN code here).
__device__ __forceinline__ float fp8_value(unsigned c) {
	const unsigned m = c & 0x7fu;
	const float v = m < 8u ? (float)m * 0.001953125f  // subnormal: m * 2^-9
			       : __int_as_float((int)((m << 20) + (120u << 23)));
	return (c & 0x80u) ? -v : v;
}

// encode8: one block (128 threads) per record: pages[first + blockIdx.x]
// (first + blockIdx.x when pages is null), KV head blockIdx.y.
template <typename T>
__device__ void encode8(const T* sum, unsigned char* codes, float* scales, const int* pages, i64 first, i64 kvh, i64 D) {
	__shared__ float red[32];
	const i64 phys = pages ? (i64)pages[first + blockIdx.x] : first + blockIdx.x;
	const i64 h = blockIdx.y;
	const T* rec = sum + (phys * kvh + h) * 2 * D;
	unsigned char* out = codes + (phys * kvh + h) * 2 * D;
	float a = 0.f;
	int nonfinite = 0, empty = 1;
	for (i64 i = threadIdx.x; i < 2 * D; i += blockDim.x) {
		const float x = to_f(rec[i]);
		if (isfinite(x)) {
			a = fmaxf(a, fabsf(x));
		} else {
			nonfinite = 1;
		}
		empty &= i < D ? (x == __int_as_float(0x7f800000)) : (x == __int_as_float(0xff800000));
	}
	nonfinite = __syncthreads_or(nonfinite);
	empty = __syncthreads_and(empty);
	a = warp_max(a);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	if (lane == 0) red[warp] = a;
	__syncthreads();
	a = 0.f;
	for (int w = 0; w < nw; w++) a = fmaxf(a, red[w]);
	if (nonfinite) {
		const unsigned lo = empty ? 0x7eu : 0xfeu, hi = empty ? 0xfeu : 0x7eu;
		for (i64 i = threadIdx.x; i < 2 * D; i += blockDim.x) out[i] = (unsigned char)(i < D ? lo : hi);
		if (threadIdx.x == 0) scales[phys * kvh + h] = __int_as_float(0x7f800000);
		return;
	}
	int e = 0;
	if (a > 0.f) {
		int ex;
		const double f = frexp((double)a, &ex);
		e = ex - 9;  // a / 2^e = f * 512, in [256, 512)
		if (f * 512.0 > 448.0) e++;
		e = max(e, -126);
	}
	for (i64 i = threadIdx.x; i < 2 * D; i += blockDim.x) {
		const double v = ldexp((double)to_f(rec[i]), -e);
		out[i] = (unsigned char)(i < D ? fp8_down(v) : fp8_up(v));
	}
	if (threadIdx.x == 0) scales[phys * kvh + h] = __int_as_float((e + 127) << 23);
}

// score8: U[row][p] from fp8 records, for D <= 128 with D % 4 == 0 (a
// record is at most 256 codes: lane l reads codes 8l..8l+7). Block (page
// chunk, KV head, sequence), 4 warps; each lane keeps its 8 elements of
// the group's split queries in registers (G <= GM query heads per KV
// head) and each warp loads 4 records before computing them.
template <int GM>
__device__ void score8(const unsigned char* codes, const float* scales, const int* indptr, const int* pages,
		       const float* q, float* out, i64 qh, i64 kvh, i64 D, i64 per_head, i64 chunk) {
	const i64 seq = blockIdx.z, h = blockIdx.y;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const i64 lo = blockIdx.x * chunk;
	if (lo >= np) return;
	const i64 hi = min(lo + chunk, np);
	const int G = (int)(qh / kvh);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const i64 rec = 2 * D;
	const bool active = lane * 8 < rec;
	float w[GM][8];
	const float* qs = q + (seq * qh + h * G) * D;
#pragma unroll
	for (int g = 0; g < GM; g++) {
#pragma unroll
		for (int e = 0; e < 8; e++) {
			const i64 c = lane * 8 + e;  // column of the record: min j = c, or max j = c - D
			float x = 0.f;
			if (g < G && active) {
				x = c < D ? fminf(qs[g * D + c], 0.f) : fmaxf(qs[g * D + c - D], 0.f);
			}
			w[g][e] = x;
		}
	}
	const i64 rows = per_head ? qh : kvh;
	float* o = out + p0 * rows;
	const int* pt = pages + p0;
	for (i64 p = lo + warp; p < hi; p += 4 * nw) {
		uint2 x[4];
		float sc[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const i64 pp = p + u * nw;
			x[u] = make_uint2(0u, 0u);
			sc[u] = 0.f;
			if (pp < hi) {
				const i64 r = (i64)pt[pp] * kvh + h;
				if (active) x[u] = *reinterpret_cast<const uint2*>(codes + r * rec + lane * 8);
				sc[u] = scales[r];
			}
		}
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const i64 pp = p + u * nw;
			if (pp >= hi) break;  // uniform across the warp
			float v[8];
#pragma unroll
			for (int e = 0; e < 8; e++) v[e] = fp8_value(((e < 4 ? x[u].x : x[u].y) >> (8 * (e & 3))) & 0xffu);
			float best = __int_as_float(0xff800000);
#pragma unroll
			for (int g = 0; g < GM; g++) {
				if (g < G) {
					float a = 0.f;
#pragma unroll
					for (int e = 0; e < 8; e++) a = fmaf(w[g][e], v[e], a);
					a = warp_sum(a) * sc[u];
					if (per_head) {
						if (lane == 0) o[(h * G + g) * np + pp] = a;
					} else {
						best = fmaxf(best, a);
					}
				}
			}
			if (!per_head && lane == 0) o[h * np + pp] = best;
		}
	}
}

#define FP8ENC(SUF, T)                                                                                             \
	extern "C" __global__ void quest_encode8_##SUF(const T* sum, unsigned char* codes, float* scales,            \
						       const int* pages, i64 first, i64 kvh, i64 D) {                \
		encode8<T>(sum, codes, scales, pages, first, kvh, D);                                              \
	}
FP8ENC(f32, float)
FP8ENC(f16, __half)
FP8ENC(bf16, __nv_bfloat16)

#define FP8SCORE(GM)                                                                                               \
	extern "C" __global__ void __launch_bounds__(128) quest_score8_g##GM(                                       \
	    const unsigned char* codes, const float* scales, const int* indptr, const int* pages, const float* q,  \
	    float* out, i64 qh, i64 kvh, i64 D, i64 per_head, i64 chunk) {                                         \
		score8<GM>(codes, scales, indptr, pages, q, out, qh, kvh, D, per_head, chunk);                     \
	}
FP8SCORE(1)
FP8SCORE(2)
FP8SCORE(4)
FP8SCORE(8)
FP8SCORE(16)
FP8SCORE(32)
