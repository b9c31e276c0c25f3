// fp8 K/V records (quest.cu): the append that quantizes on the device,
// summary rescans over the dequantized keys, and split-K attention that
// dequantizes in the kernel.
#pragma once

#include "attend.cuh"
#include "common.cuh"
#include "fp8.cuh"

// fp8 K/V pages (plan.FP8; package kernels/fp8 "KV records" documents the
// encoding, pagestore/fp8.go the CPU store these kernels match byte for
// byte). Per layer and physical page p:
//   K, V          [pages][kv_heads][S][D]  E4M3fn codes
//   kscale,vscale [pages][kv_heads]        float32 scale of each record
//   summary       [pages][kv_heads][2][D]  float32, over the dequantized keys
// The element of a code c is fp8_value(c) * scale, the product rounded to
// float32 (__fmul_rn: never contracted into a neighbouring FMA), so the
// kernels read exactly the values the CPU decodes.

// Code of the E4M3fn value nearest to x (finite), ties to the even code,
// saturating to +-448: kernels/fp8.RoundNearest. The magnitude a is
// n * 2^(e-3) with e its binade (the subnormal quantum 2^-9 below 2^-6),
// n exact in double; rint rounds n half to even, and the code's parity is
// n's (code = 8*(e+6) + n), so ties go to the even code as on the CPU.
__device__ __forceinline__ unsigned char kv8_round(float x) {
	const float a = fabsf(x);
	unsigned c;
	if (a >= 448.f) {
		c = 0x7eu;
	} else if (a == 0.f) {
		c = 0u;
	} else {
		int ex;
		frexp((double)a, &ex);          // a = f * 2^ex, f in [0.5, 1)
		const int e = max(ex - 1, -6);  // binade; subnormal quantum below 2^-6
		const double n = rint(ldexp((double)a, 3 - e));
		c = (unsigned)((e + 6) * 8 + (int)n);  // n = 16 carries into the next binade
	}
	return (unsigned char)(x < 0.f ? (c | 0x80u) : c);
}

// Element of code c under scale sc, as the CPU decodes it.
__device__ __forceinline__ float kv8_value(unsigned char c, float sc) { return __fmul_rn(fp8_value(c), sc); }

// append8: writes n new tokens (k, v float32 [n][kvh][D]) of one sequence at
// positions pos0.. into the pages named by page_table (logical -> physical),
// as pagestore's writeFP8 does: per touched (page, head) record of K
// (blockIdx.z 0) or V (1), the scale grows to max(old, amax/448) where amax
// is the largest magnitude of this call's tokens in the page and old the
// record's scale (0 when the call starts at slot 0: a fresh page); when it
// grows the earlier slots are decoded under the old scale and re-encoded
// under the new one; the new tokens are encoded under it (every code 0 for
// scale 0). The K block then rebuilds the page's float32 summary from its
// valid dequantized keys. slots, when not null, holds the device slot of
// each page_table entry: the codes and scales go to that slot of a slot
// pool (slots.go) while the summary stays indexed by physical page; null
// stores the records at the physical page. Grid (pages touched, kvh, 2);
// block: 128 threads (a multiple of 32, at most 1024). Callers that pass
// only the touched pages give pos0 < S.
__device__ void append8(unsigned char* K, unsigned char* V, float* ks, float* vs, float* sum, const int* page_table,
			const int* slots, const float* k, const float* v, i64 pos0, i64 n, i64 kvh, i64 D, i64 S) {
	__shared__ float red[32];
	const i64 page = pos0 / S + blockIdx.x, h = blockIdx.y;
	const bool isK = blockIdx.z == 0;
	const i64 t_lo = max(pos0, page * S), t_hi = min(pos0 + n, (page + 1) * S);
	if (t_lo >= t_hi) return;
	const i64 phys = page_table[page], rec = (slots ? (i64)slots[page] : phys) * kvh + h;
	const i64 slot = t_lo % S, cnt = t_hi - t_lo;
	unsigned char* codes = (isK ? K : V) + rec * S * D;
	float* scale = isK ? ks : vs;
	const float* src = isK ? k : v;
	const float old = slot == 0 ? 0.f : scale[rec];
	// amax of this call's tokens in the page.
	float a = 0.f;
	for (i64 i = threadIdx.x; i < cnt * D; i += blockDim.x) {
		const i64 t = t_lo - pos0 + i / D;
		a = fmaxf(a, fabsf(src[(t * kvh + h) * D + i % D]));
	}
	a = warp_max(a);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	if (lane == 0) red[warp] = a;
	__syncthreads();  // also: every thread has read old
	a = 0.f;
	for (int w = 0; w < nw; w++) a = fmaxf(a, red[w]);
	const float sc = fmaxf(old, __fdiv_rn(a, 448.f));
	if (sc != old && slot > 0) {
		// The scale grows: re-quantize the earlier tokens (each thread
		// rewrites only the elements it reads).
		for (i64 i = threadIdx.x; i < slot * D; i += blockDim.x) codes[i] = kv8_round(__fdiv_rn(kv8_value(codes[i], old), sc));
	}
	for (i64 i = threadIdx.x; i < cnt * D; i += blockDim.x) {
		const i64 t = t_lo - pos0 + i / D;
		codes[slot * D + i] = sc == 0.f ? (unsigned char)0 : kv8_round(__fdiv_rn(src[(t * kvh + h) * D + i % D], sc));
	}
	if (threadIdx.x == 0) scale[rec] = sc;
	if (!isK) return;
	__syncthreads();  // the record's codes are written
	float* out = sum + (phys * kvh + h) * 2 * D;
	for (i64 j = threadIdx.x; j < D; j += blockDim.x) {
		float lo = __int_as_float(0x7f800000), hi = __int_as_float(0xff800000);
		for (i64 t = 0; t < slot + cnt; t++) {
			const float x = kv8_value(codes[t * D + j], sc);
			lo = fminf(lo, x);
			hi = fmaxf(hi, x);
		}
		out[j] = lo;
		out[D + j] = hi;
	}
}

// rescan8: rebuilds the float32 summaries of the physical pages
// list[0..gridDim.x) from their first valid dequantized keys (valid = 0
// gives the empty box), read from the pages' records or, when slots is
// not null, from the records of slot slots[i] of a slot pool. Grid
// (pages, kvh); threads over D.
__device__ void rescan8(const unsigned char* K, const float* ks, float* sum, const int* list, const int* slots, i64 kvh,
			i64 D, i64 S, i64 valid) {
	const i64 p = list[blockIdx.x], h = blockIdx.y, rec = (slots ? (i64)slots[blockIdx.x] : p) * kvh + h;
	const unsigned char* blk = K + rec * S * D;
	const float sc = valid > 0 ? ks[rec] : 0.f;  // valid 0: p may have no record (a slot pool's page)
	float* out = sum + (p * kvh + h) * 2 * D;
	for (i64 j = threadIdx.x; j < D; j += blockDim.x) {
		float lo = __int_as_float(0x7f800000), hi = __int_as_float(0xff800000);
		for (i64 t = 0; t < valid; t++) {
			const float x = kv8_value(blk[t * D + j], sc);
			lo = fminf(lo, x);
			hi = fmaxf(hi, x);
		}
		out[j] = lo;
		out[D + j] = hi;
	}
}

// attend8: attend (attend.cuh) over fp8 records: each page's K and V tiles
// are dequantized into float32 shared memory once for all the heads of the
// block, then each warp runs online softmax over the page's valid tokens.
// Requires D % 8 == 0, D <= 256, S <= 64 and S * D <= 4096 elements.
__device__ void attend8(const unsigned char* K, const unsigned char* V, const float* ksc, const float* vsc,
			const int* indptr, const int* pages, const int* last_len, const float* q, const int* item_seq,
			const int* item_row, const int* item_lo, const int* item_hi, const int* lists, float* part_o,
			float* part_lse, i64 qh, i64 kvh, i64 D, i64 S, i64 per_head) {
	__shared__ __align__(16) float kt[ATT_MAX_TILE];
	__shared__ __align__(16) float vt[ATT_MAX_TILE];
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
		const i64 rec = (i64)pages[p0 + lp] * kvh + kv;
		const float sk = ksc[rec], sv = vsc[rec];
		__syncthreads();
		for (i64 c = threadIdx.x * 4; c < valid * D; c += blockDim.x * 4) {
			const uchar4 a = *reinterpret_cast<const uchar4*>(&K[rec * tile + c]);
			const uchar4 b = *reinterpret_cast<const uchar4*>(&V[rec * tile + c]);
			kt[c] = kv8_value(a.x, sk); kt[c + 1] = kv8_value(a.y, sk); kt[c + 2] = kv8_value(a.z, sk); kt[c + 3] = kv8_value(a.w, sk);
			vt[c] = kv8_value(b.x, sv); vt[c + 1] = kv8_value(b.y, sv); vt[c + 2] = kv8_value(b.z, sv); vt[c + 3] = kv8_value(b.w, sv);
		}
		__syncthreads();
		if (!active) continue;
		float pm = __int_as_float(0xff800000);
		for (i64 t = 0; t < valid; t++) {
			float x = 0.f;
#pragma unroll
			for (int e = 0; e < 8; e++) {
				const i64 j = lane + 32 * e;
				if (j < D) x = fmaf(qv[e], kt[t * D + j], x);
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
				if (j < D) acc[e] = fmaf(p, vt[t * D + j], acc[e]);
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

// pt: the page table; st: the pages' slots in a slot pool, or null.
extern "C" __global__ void quest_append_fp8(unsigned char* K, unsigned char* V, float* ks, float* vs, float* sum,
					    const int* pt, const int* st, const float* k, const float* v, i64 pos0, i64 n,
					    i64 kvh, i64 D, i64 S) {
	append8(K, V, ks, vs, sum, pt, st, k, v, pos0, n, kvh, D, S);
}

extern "C" __global__ void quest_rescan_fp8(const unsigned char* K, const float* ks, float* sum, const int* list, i64 kvh,
					    i64 D, i64 S, i64 valid) {
	rescan8(K, ks, sum, list, nullptr, kvh, D, S, valid);
}

// The rescan of a slot pool (slots.go): page pages[i] from slot slots[i].
extern "C" __global__ void quest_rescan_slots_fp8(const unsigned char* K, const float* ks, float* sum, const int* pages,
						  const int* slots, i64 kvh, i64 D, i64 S, i64 valid) {
	rescan8(K, ks, sum, pages, slots, kvh, D, S, valid);
}

extern "C" __global__ void __launch_bounds__(1024) quest_attend_fp8(
    const unsigned char* K, const unsigned char* V, const float* ksc, const float* vsc, const int* indptr,
    const int* pages, const int* last_len, const float* q, const int* item_seq, const int* item_row,
    const int* item_lo, const int* item_hi, const int* lists, float* part_o, float* part_lse, i64 qh, i64 kvh, i64 D,
    i64 S, i64 per_head) {
	attend8(K, V, ksc, vsc, indptr, pages, last_len, q, item_seq, item_row, item_lo, item_hi, lists, part_o, part_lse,
		qh, kvh, D, S, per_head);
}
