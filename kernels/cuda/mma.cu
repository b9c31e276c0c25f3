// Tensor-core (mma.sync m16n8k16, fp32 accumulate) Quest kernels for 16-bit
// storage: the score pass and the paged decode attention. Compiled to PTX for
// sm_90 by gen.sh and embedded next to quest.ptx.
//
// Layout and parameters as in quest.cu: K, V [pages][kv_heads][S][D],
// summaries [pages][kv_heads][2][D] (mins then maxes), every integer
// parameter a 64-bit long long.
//
// Query-side operands (the score weights and the queries) are fp32 on the
// host; a 16-bit tensor-core operand would round them to 8 (bf16) or 11
// (fp16) significant bits, so each is split into hi + lo 16-bit parts and
// multiplied twice (about 16 significant bits, the error of the fp32
// accumulation rather than of the storage type). The probabilities of the
// P.V product are split the same way (FlashAttention rounds them to T
// instead); the tensor cores have throughput to spare in these
// memory-bound kernels.

#include "cpasync.cuh"
#include "mma.cuh"

typedef long long i64;

#define NEG_INF __int_as_float(0xff800000)


// nanmax is max that propagates NaN (fmaxf drops it): a tile maximum is
// NaN when a score of the tile is, which sends the row to the radix top-K.
__device__ __forceinline__ float nanmax(float a, float b) { return (a != a || a > b) ? a : b; }

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// page_numbers loads into pn the page numbers (pt[pp], 0 at pp >= hi) of
// the U pages lane g of a warp reads in the score loop's iteration at t0,
// for blocks of nw warps: the score kernels load an iteration's numbers
// while the previous iteration's records are in flight.
template <int U>
__device__ __forceinline__ void page_numbers(int (&pn)[U], const int* pt, i64 t0, i64 hi, int nw, int g) {
#pragma unroll
	for (int u = 0; u < U; u++) {
		const i64 pp = t0 + u * 8 * nw + g;
		pn[u] = pp < hi ? __ldg(pt + pp) : 0;
	}
}

// ---- score ----
//
// U[row][page] = sum_k W[row][k] * R[page][k] over the 2D elements of a
// summary record R = (mins, maxes), W = (min(q, 0), max(q, 0)): one GEMM
// with A = W (16 rows: the group's query heads, zero-padded) and B = R^T
// (8 pages per n-tile). Thread (g = lane/4, t = lane%4) loads 16 contiguous
// bytes at a time from the record of page g (no shared memory: the k order
// inside a record is permuted so that each load fills the B fragments of
// two k-steps directly, and W is laid out with the same permutation).
// Element e of load i sits at k = 32i + 8t + e; k-step 2i+j holds elements
// 4j..4j+3 in the fragment slots (2t, 2t+1, 2t+8, 2t+9). When tmax is set
// the kernel also writes, for each output row, the maximum of every tile of
// 8 pages (tile j of a row at the row's offset + j, laid out like the
// scores), which quest_topk_thr reads instead of the scores.
template <typename T, int D, bool TWO, int U>
__device__ void score_mma(const T* sum, const int* indptr, const int* pages, const float* q, float* out,
			  float* tmax, i64 qh, i64 kvh, i64 per_head, i64 chunk) {
	constexpr int NS = D / 8;   // k-steps over the 2D record
	constexpr int NL = D / 16;  // 16-byte loads per thread per record
	constexpr int R = TWO ? 2 : 1;
	// A fragments of W for every k-step and lane: {hi a0, hi a2, lo a0,
	// lo a2} per row half (a0: slots 2t, 2t+1; a2: slots 2t+8, 2t+9).
	__shared__ uint4 wsm[R][NS][32];
	// Grid (KV heads, chunks, sequences): the blocks of all heads of a chunk
	// run together and read its pages' records, adjacent in memory, at the
	// same time (measured on an H200: 2-5% faster than chunks first).
	const i64 seq = blockIdx.z, h = blockIdx.x;
	const i64 G = qh / kvh;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const i64 lo = blockIdx.y * chunk;
	if (lo >= np) return;
	const i64 hi = min(lo + chunk, np);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int g = lane >> 2, t = lane & 3;
	const float* qs = q + (seq * qh + h * G) * D;
	for (int idx = threadIdx.x; idx < R * NS * 32; idx += blockDim.x) {
		const int ln = idx & 31, s = (idx >> 5) % NS, r = idx / (32 * NS);
		const int row = (ln >> 2) + 8 * r;
		const int base = 32 * (s >> 1) + 8 * (ln & 3) + 4 * (s & 1);
		float x[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int k = base + e;
			const float v = row < G ? qs[row * D + (k < D ? k : k - D)] : 0.f;
			x[e] = k < D ? fminf(v, 0.f) : fmaxf(v, 0.f);
		}
		uint4 f;
		split<T>(x[0], x[1], f.x, f.z);
		split<T>(x[2], x[3], f.y, f.w);
		wsm[r][s][ln] = f;
	}
	__syncthreads();
	const i64 rows = per_head ? qh : kvh;
	float* o = out + p0 * rows;
	const int* pt = pages + p0;
	// The page numbers of a warp's next pages are loaded while its current
	// records are in flight: the records' loads do not wait for a page
	// table load of their own (two dependent global loads an iteration
	// become one).
	const i64 stride = 8 * nw * U;
	int pn[U];
	page_numbers<U>(pn, pt, lo + 8 * warp, hi, nw, g);
	for (i64 t0 = lo + 8 * warp; t0 < hi; t0 += stride) {
		uint4 x[U][NL];
#pragma unroll
		for (int u = 0; u < U; u++) {
			const i64 pp = t0 + u * 8 * nw + g;
			if (pp < hi) {
				const T* r = sum + ((i64)pn[u] * kvh + h) * (2 * D) + 8 * t;
#pragma unroll
				for (int i = 0; i < NL; i++) x[u][i] = ldg_nc(r + 32 * i);
			} else {
#pragma unroll
				for (int i = 0; i < NL; i++) x[u][i] = make_uint4(0, 0, 0, 0);
			}
		}
		page_numbers<U>(pn, pt, t0 + stride, hi, nw, g);
#pragma unroll
		for (int u = 0; u < U; u++) {
			float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
			for (int s = 0; s < NS; s++) {
				const uint32_t b0 = word(x[u][s >> 1], 2 * (s & 1)), b1 = word(x[u][s >> 1], 2 * (s & 1) + 1);
				const uint4 w0 = wsm[0][s][lane];
				if (TWO) {
					const uint4 w1 = wsm[1][s][lane];
					mma<T>(c, w0.x, w1.x, w0.y, w1.y, b0, b1);
					mma<T>(c, w0.z, w1.z, w0.w, w1.w, b0, b1);
				} else {
					mma<T>(c, w0.x, 0u, w0.y, 0u, b0, b1);
					mma<T>(c, w0.z, 0u, w0.w, 0u, b0, b1);
				}
			}
			// c[0], c[1]: row g, pages col 2t, 2t+1; c[2], c[3]: row g+8.
			const i64 pc = t0 + u * 8 * nw + 2 * t;
			const i64 tile = (t0 + u * 8 * nw) / 8;  // chunk and lo are multiples of 8
			if (per_head) {
#pragma unroll
				for (int r = 0; r < (TWO ? 2 : 1); r++) {
					const int row = g + 8 * r;
					float* d = o + (h * G + row) * np;
					if (row < G) {
						if (pc < hi) d[pc] = c[2 * r];
						if (pc + 1 < hi) d[pc + 1] = c[2 * r + 1];
					}
					if (tmax) {
						float x = nanmax(pc < hi ? c[2 * r] : NEG_INF, pc + 1 < hi ? c[2 * r + 1] : NEG_INF);
						x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 1));
						x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 2));
						if (row < G && t == 0 && tile * 8 < hi) tmax[p0 * rows + (h * G + row) * np + tile] = x;
					}
				}
			} else {
				float m0 = g < G ? c[0] : NEG_INF, m1 = g < G ? c[1] : NEG_INF;
				if (TWO && g + 8 < G) {
					m0 = fmaxf(m0, c[2]);
					m1 = fmaxf(m1, c[3]);
				}
#pragma unroll
				for (int x_ = 4; x_ < 32; x_ <<= 1) {
					m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x_));
					m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x_));
				}
				if (g == 0) {
					if (pc < hi) o[h * np + pc] = m0;
					if (pc + 1 < hi) o[h * np + pc + 1] = m1;
				}
				if (tmax) {
					float x = nanmax(pc < hi ? m0 : NEG_INF, pc + 1 < hi ? m1 : NEG_INF);
					x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 1));
					x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 2));
					if (lane == 0 && tile * 8 < hi) tmax[p0 * rows + h * np + tile] = x;
				}
			}
		}
	}
}

// ---- score from fp8 summaries ----
//
// score_mma8: U[row][page] from the E4M3fn records of kernels/fp8 (codes
// [pages][kv_heads][2D], one power-of-two scale per record), as score_mma
// does from 16-bit records: one GEMM with A = W (the group's query heads)
// and B = the record codes, converted in registers to fp16 (exact: every
// e4m3 value is an fp16 value) by cvt.rn.f16x2.e4m3x2, fp32 accumulate,
// then times the record's scale. Thread (g, t) loads 16 code bytes at a
// time from the record of page g; element e of load i sits at k = 64i +
// 16t + e and k-step s holds elements 4(s&3)..4(s&3)+3 of load s>>2 in the
// fragment slots (2t, 2t+1, 2t+8, 2t+9); W is laid out with the same
// permutation. W is fp16 hi + lo (about 22 significant bits), each query
// row scaled by a power of two 2^k_r first so that its largest |w| lies in
// [2^14, 2^15) (fp16's range; products and sums stay far inside fp32's),
// and the accumulator is multiplied by 2^-k_r (exact). tmax as in
// score_mma.
template <int D, bool TWO, int U, bool SPLIT = false>
__device__ void score_mma8(const unsigned char* codes, const float* scales, const int* indptr, const int* pages,
			   const float* q, float* out, float* tmax, i64 qh, i64 kvh, i64 per_head, i64 chunk) {
	constexpr int NS = D / 8;   // k-steps over the 2D codes of a record
	constexpr int NL = D / 32;  // 16-byte loads per thread per record
	constexpr int R = TWO ? 2 : 1;
	__shared__ uint4 wsm[R][NS][32];
	__shared__ float rinv[16];
	const i64 seq = blockIdx.z, h = blockIdx.x;
	const i64 G = qh / kvh;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const i64 lo = blockIdx.y * chunk;
	if (lo >= np) return;
	const i64 hi = min(lo + chunk, np);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const int g = lane >> 2, t = lane & 3;
	const float* qs = q + (seq * qh + h * G) * D;
	__shared__ float rscale[16];
	for (int row = warp; row < 8 * R; row += nw) {
		float a = 0.f;
		if (row < G) {
			for (int j = lane; j < D; j += 32) a = fmaxf(a, fabsf(qs[row * D + j]));
		}
#pragma unroll
		for (int x = 16; x > 0; x >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, x));
		if (lane == 0) {
			int k = 0;
			if (a > 0.f) k = min(126, max(-126, 14 - ilogbf(a)));
			rscale[row] = ldexpf(1.f, k);
			rinv[row] = ldexpf(1.f, -k);
		}
	}
	__syncthreads();
	for (int idx = threadIdx.x; idx < R * NS * 32; idx += blockDim.x) {
		const int ln = idx & 31, s = (idx >> 5) % NS, r = idx / (32 * NS);
		const int row = (ln >> 2) + 8 * r;
		const int base = 64 * (s >> 2) + 16 * (ln & 3) + 4 * (s & 3);
		float x[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int k = base + e;
			const float v = row < G ? qs[row * D + (k < D ? k : k - D)] * rscale[row] : 0.f;
			x[e] = k < D ? fminf(v, 0.f) : fmaxf(v, 0.f);
		}
		uint4 f;
		split<__half>(x[0], x[1], f.x, f.z);
		split<__half>(x[2], x[3], f.y, f.w);
		wsm[r][s][ln] = f;
	}
	__syncthreads();
	const float inv0 = rinv[g], inv1 = TWO ? rinv[g + 8] : 0.f;
	const i64 rows = per_head ? qh : kvh;
	float* o = out + p0 * rows;
	const int* pt = pages + p0;
	// The next pages' numbers are loaded while the current records are in
	// flight (as in score_mma).
	const i64 stride = 8 * nw * U;
	int pn[U];
	page_numbers<U>(pn, pt, lo + 8 * warp, hi, nw, g);
	for (i64 t0 = lo + 8 * warp; t0 < hi; t0 += stride) {
		uint4 x[U][NL];
		float sc[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			const i64 pp = t0 + u * 8 * nw + g;
			sc[u] = 0.f;
			if (pp < hi) {
				const i64 rec = (i64)pn[u] * kvh + h;
				const unsigned char* r = codes + rec * (2 * D) + 16 * t;
#pragma unroll
				for (int i = 0; i < NL; i++) x[u][i] = ldg_nc(r + 64 * i);
				sc[u] = __ldg(scales + rec);
			} else {
#pragma unroll
				for (int i = 0; i < NL; i++) x[u][i] = make_uint4(0, 0, 0, 0);
			}
		}
		page_numbers<U>(pn, pt, t0 + stride, hi, nw, g);
#pragma unroll
		for (int u = 0; u < U; u++) {
			// SPLIT: the hi and lo products in two accumulators (two
			// dependency chains of NS tensor-core operations, not one of
			// 2 NS), added at the end.
			float c[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
			for (int s = 0; s < NS; s++) {
				const uint32_t wd = word(x[u][s >> 2], s & 3);
				uint32_t b0, b1;
				asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(b0) : "h"((unsigned short)(wd & 0xffffu)));
				asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(b1) : "h"((unsigned short)(wd >> 16)));
				const uint4 w0 = wsm[0][s][lane];
				if (TWO) {
					const uint4 w1 = wsm[1][s][lane];
					mma<__half>(c, w0.x, w1.x, w0.y, w1.y, b0, b1);
					mma<__half>(SPLIT ? c2 : c, w0.z, w1.z, w0.w, w1.w, b0, b1);
				} else {
					mma<__half>(c, w0.x, 0u, w0.y, 0u, b0, b1);
					mma<__half>(SPLIT ? c2 : c, w0.z, 0u, w0.w, 0u, b0, b1);
				}
			}
			if (SPLIT) {
#pragma unroll
				for (int e = 0; e < 4; e++) c[e] += c2[e];
			}
			// c[0], c[1]: row g, pages col 2t, 2t+1; c[2], c[3]: row g+8.
			// The scales of those pages come from lanes 4(2t) and 4(2t+1),
			// which loaded the records of pages 2t and 2t+1.
			const float s0 = __shfl_sync(0xffffffffu, sc[u], 8 * t), s1 = __shfl_sync(0xffffffffu, sc[u], 8 * t + 4);
			c[0] = c[0] * inv0 * s0;
			c[1] = c[1] * inv0 * s1;
			c[2] = c[2] * inv1 * s0;
			c[3] = c[3] * inv1 * s1;
			const i64 pc = t0 + u * 8 * nw + 2 * t;
			const i64 tile = (t0 + u * 8 * nw) / 8;  // chunk and lo are multiples of 8
			if (per_head) {
#pragma unroll
				for (int r = 0; r < R; r++) {
					const int row = g + 8 * r;
					float* d = o + (h * G + row) * np;
					if (row < G) {
						if (pc < hi) d[pc] = c[2 * r];
						if (pc + 1 < hi) d[pc + 1] = c[2 * r + 1];
					}
					if (tmax) {
						float x = nanmax(pc < hi ? c[2 * r] : NEG_INF, pc + 1 < hi ? c[2 * r + 1] : NEG_INF);
						x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 1));
						x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 2));
						if (row < G && t == 0 && tile * 8 < hi) tmax[p0 * rows + (h * G + row) * np + tile] = x;
					}
				}
			} else {
				float m0 = g < G ? c[0] : NEG_INF, m1 = g < G ? c[1] : NEG_INF;
				if (TWO && g + 8 < G) {
					m0 = fmaxf(m0, c[2]);
					m1 = fmaxf(m1, c[3]);
				}
#pragma unroll
				for (int x_ = 4; x_ < 32; x_ <<= 1) {
					m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, x_));
					m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, x_));
				}
				if (g == 0) {
					if (pc < hi) o[h * np + pc] = m0;
					if (pc + 1 < hi) o[h * np + pc + 1] = m1;
				}
				if (tmax) {
					float x = nanmax(pc < hi ? m0 : NEG_INF, pc + 1 < hi ? m1 : NEG_INF);
					x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 1));
					x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 2));
					if (lane == 0 && tile * 8 < hi) tmax[p0 * rows + h * np + tile] = x;
				}
			}
		}
	}
}

// ---- attention ----

// e4m3x2_bf16x2: two E4M3fn codes (low byte first) as a bf16 pair, exact.
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t c) {
	uint32_t h;
	asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"((unsigned short)c));
	const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
	return pack2<__nv_bfloat16>::from(f.x, f.y);
}

__device__ __forceinline__ void ldsm4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
		     : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
		     : "r"(addr));
}

// attend_mma: decode attention for S = 16 (one page is one k16 step of the
// P.V product) and D in {64, 128}, all query heads of a KV head (up to 16,
// the M = 16 rows of the MMA) or one head (per_head) per work item. Each
// warp of the block takes every WARPS-th page of the item with its own
// STAGES-deep cp.async pipeline in shared memory (no block barrier in the
// loop; rows past a tail page's valid tokens are zero-filled) and its own
// online softmax; the block merges its warps' states at the end. Page
// tiles keep rows of D elements with their 16-byte chunks XOR-swizzled by
// row, so ldmatrix reads them free of bank conflicts: non-transposed for
// K (the B operand of S = Q K^T), transposed for V (the B operand of
// O = P V). Scores use base-2 exponentials (q is pre-scaled by log2(e) /
// sqrt(D)); lse is written in natural log. With fuse set, the last block
// of each row (per a counter in global memory that starts at zero and is
// left at zero) also merges the row's partial states into out_o / out_lse,
// which saves the separate quest_reduce launch; row_item[r..r+1] are row
// r's items.
//
// With KV8 the records are E4M3fn codes with a float32 scale per record
// (kvfp8.cuh's layout; T is then __nv_bfloat16, the tiles' type): each
// stage holds the page's K and V codes (S x D bytes each, cp.async as the
// 16-bit tiles are) and the two scales; before its page is used the warp
// converts the codes into one pair of bf16 tiles of the layout above
// (exact: every e4m3 value is a bf16 value), and the scales are applied
// to the fp32 scores (times the K scale) and to the probabilities before
// their hi + lo split (times the V scale; l sums the unscaled ones), so
// the products are those of the dequantized values up to fp32 rounding.
template <typename T, int D, int WARPS, int STAGES, bool TWO, bool KV8 = false>
__device__ void attend_mma(const T* K, const T* V, const int* indptr, const int* pages, const int* last_len,
			   const float* q, const int* item_seq, const int* item_row, const int* item_lo,
			   const int* item_hi, const int* lists, float* part_o, float* part_lse,
			   const int* row_item, int* counter, float* out_o, float* out_lse,
			   i64 qh, i64 kvh, i64 per_head, i64 fuse, i64 pdl, const float* ksc = nullptr,
			   const float* vsc = nullptr) {
	constexpr int S = 16;
	constexpr int ROWB = D * 2;           // bytes per token row
	constexpr int TILE = S * ROWB;        // bytes per K (or V) page tile
	constexpr int CPR = D / 8;            // 16-byte chunks per row
	constexpr int LPL = S * CPR / 32;     // chunks per lane per tile
	constexpr int NS = D / 16;            // k-steps of Q K^T
	constexpr int NT = D / 8;             // n-tiles of O
	constexpr int R = TWO ? 2 : 1;        // row halves in use (heads > 8)
	constexpr int TILE8 = S * D;          // KV8: bytes of a page's codes
	// Bytes of a stage (KV8: K and V codes, then the two scales padded to
	// 128) and of a warp's region (KV8: the stages, then the bf16 tiles).
	constexpr int STAGEB = KV8 ? 2 * TILE8 + 128 : 2 * TILE;
	constexpr int WARPB = STAGES * STAGEB + (KV8 ? 2 * TILE : 0);
	extern __shared__ __align__(128) unsigned char smem[];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int g = lane >> 2, t = lane & 3;
	const i64 it = blockIdx.x;
	const i64 seq = item_seq[it], row = item_row[it];
	const i64 G = qh / kvh;
	const int heads = per_head ? 1 : (int)G;
	const i64 kv = per_head ? row / G : row;
	const i64 h0 = per_head ? row : row * G;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const int tail = last_len[seq];
	const i64 lo = item_lo[it], hi = item_hi[it];
	const float qscale = rsqrtf((float)D) * 1.4426950408889634f;

	unsigned char* wb = smem + warp * WARPB;
	const uint32_t wbs = (uint32_t)__cvta_generic_to_shared(wb);
	const int cnt = hi - lo > warp ? (int)((hi - lo - warp + WARPS - 1) / WARPS) : 0;
	auto issue = [&](int stage, int j) {
		const i64 li = lo + warp + (i64)j * WARPS;
		const i64 lp = lists[li];
		const int valid = lp == np - 1 ? tail : S;
		const i64 rec = (i64)pages[p0 + lp] * kvh + kv;
		if (KV8) {
			const unsigned char* ks = reinterpret_cast<const unsigned char*>(K) + rec * TILE8;
			const unsigned char* vs = reinterpret_cast<const unsigned char*>(V) + rec * TILE8;
			unsigned char* kd = wb + stage * STAGEB;
			unsigned char* vd = kd + TILE8;
#pragma unroll
			for (int i = 0; i < TILE8 / 16 / 32; i++) {
				const int c = lane + 32 * i;
				const int bytes = c * 16 / D < valid ? 16 : 0;
				cp_async16(kd + c * 16, ks + c * 16, bytes);
				cp_async16(vd + c * 16, vs + c * 16, bytes);
			}
			if (lane == 0) {
				cp_async4(vd + TILE8, ksc + rec);
				cp_async4(vd + TILE8 + 4, vsc + rec);
			}
			return;
		}
		const i64 base = rec * (i64)TILE;
		const unsigned char* ks = reinterpret_cast<const unsigned char*>(K) + base;
		const unsigned char* vs = reinterpret_cast<const unsigned char*>(V) + base;
		unsigned char* kd = wb + stage * STAGEB;
		unsigned char* vd = kd + TILE;
#pragma unroll
		for (int i = 0; i < LPL; i++) {
			const int c = lane + 32 * i;
			const int tr = c / CPR, cc = c % CPR;
			const int dst = tr * ROWB + ((cc ^ (tr & 7)) << 4);
			const int src = tr * ROWB + (cc << 4);
			const int bytes = tr < valid ? 16 : 0;
			cp_async16(kd + dst, ks + src, bytes);
			cp_async16(vd + dst, vs + src, bytes);
		}
	};

	float acc[NT][4];
#pragma unroll
	for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
	float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};

	auto prologue = [&]() {
#pragma unroll
		for (int st = 0; st < STAGES - 1; st++) {
			if (st < cnt) issue(st, st);
			cp_async_commit();
		}
	};
	// Q fragments (A operand, rows = heads, k = d), split hi + lo. Without
	// pdl the first pages are put in flight first; with pdl (launched as a
	// programmatic dependent of the top-K kernel) the fragments are built
	// while the top-K drains, and the lists it writes are read after
	// griddepcontrol.wait.
	uint32_t qh_[NS][4], ql_[NS][4];
	if (!pdl) prologue();
	{
		const float* qs = q + (seq * qh + h0) * D;
#pragma unroll
		for (int s = 0; s < NS; s++) {
#pragma unroll
			for (int r = 0; r < 2; r++) {
				const int hr = g + 8 * r;
				const int d = 16 * s + 2 * t;
				float x0 = 0.f, x1 = 0.f, x2 = 0.f, x3 = 0.f;
				if (hr < heads && (r == 0 || TWO)) {
					x0 = qs[hr * D + d] * qscale;
					x1 = qs[hr * D + d + 1] * qscale;
					x2 = qs[hr * D + d + 8] * qscale;
					x3 = qs[hr * D + d + 9] * qscale;
				}
				split<T>(x0, x1, qh_[s][r], ql_[s][r]);
				split<T>(x2, x3, qh_[s][2 + r], ql_[s][2 + r]);
			}
		}
	}
	if (pdl) {
		asm volatile("griddepcontrol.wait;\n" ::: "memory");
		prologue();
	}

	for (int j = 0; j < cnt; j++) {
		const int stage = j % STAGES;
		cp_async_wait<STAGES - 2>();
		__syncwarp();
		const i64 lp = lists[lo + warp + (i64)j * WARPS];
		const int valid = lp == np - 1 ? tail : S;
		uint32_t kb = wbs + stage * STAGEB;
		float sk = 1.f, sv = 1.f;
		if (KV8) {
			// Codes to the bf16 tiles: 8 codes (one 16-byte row chunk) at a time.
			const unsigned char* st = wb + stage * STAGEB;
			unsigned char* kt = wb + STAGES * STAGEB;
#pragma unroll
			for (int i = 0; i < LPL; i++) {
				const int c = lane + 32 * i;
				const int tr = c / CPR, cc = c % CPR;
				const int dst = tr * ROWB + ((cc ^ (tr & 7)) << 4);
				const uint2 kc = *reinterpret_cast<const uint2*>(st + c * 8);
				const uint2 vc = *reinterpret_cast<const uint2*>(st + TILE8 + c * 8);
				*reinterpret_cast<uint4*>(kt + dst) = make_uint4(e4m3x2_bf16x2(kc.x & 0xffffu), e4m3x2_bf16x2(kc.x >> 16),
										e4m3x2_bf16x2(kc.y & 0xffffu), e4m3x2_bf16x2(kc.y >> 16));
				*reinterpret_cast<uint4*>(kt + TILE + dst) = make_uint4(e4m3x2_bf16x2(vc.x & 0xffffu), e4m3x2_bf16x2(vc.x >> 16),
											e4m3x2_bf16x2(vc.y & 0xffffu), e4m3x2_bf16x2(vc.y >> 16));
			}
			sk = *reinterpret_cast<const float*>(st + 2 * TILE8);
			sv = *reinterpret_cast<const float*>(st + 2 * TILE8 + 4);
			kb = wbs + STAGES * STAGEB;
			__syncwarp();
		}
		const uint32_t vb = kb + TILE;
		// S = Q K^T: two n-tiles of 8 tokens.
		float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
		{
			const int tr = (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
			for (int s = 0; s < NS; s++) {
				const int ch = 2 * s + ((lane >> 3) & 1);
				uint32_t b00, b01, b10, b11;
				ldsm4(kb + tr * ROWB + ((ch ^ (tr & 7)) << 4), b00, b01, b10, b11);
				if (TWO) {
					mma<T>(s0, qh_[s][0], qh_[s][1], qh_[s][2], qh_[s][3], b00, b01);
					mma<T>(s0, ql_[s][0], ql_[s][1], ql_[s][2], ql_[s][3], b00, b01);
					mma<T>(s1, qh_[s][0], qh_[s][1], qh_[s][2], qh_[s][3], b10, b11);
					mma<T>(s1, ql_[s][0], ql_[s][1], ql_[s][2], ql_[s][3], b10, b11);
				} else {
					mma<T>(s0, qh_[s][0], 0u, qh_[s][2], 0u, b00, b01);
					mma<T>(s0, ql_[s][0], 0u, ql_[s][2], 0u, b00, b01);
					mma<T>(s1, qh_[s][0], 0u, qh_[s][2], 0u, b10, b11);
					mma<T>(s1, ql_[s][0], 0u, ql_[s][2], 0u, b10, b11);
				}
			}
		}
		if (KV8) {
#pragma unroll
			for (int e = 0; e < 4; e++) {
				s0[e] *= sk;
				s1[e] *= sk;
			}
		}
		// Mask tokens past the valid ones (token index: 2t + e, 8 + 2t + e).
		if (2 * t >= valid) s0[0] = s0[2] = NEG_INF;
		if (2 * t + 1 >= valid) s0[1] = s0[3] = NEG_INF;
		if (8 + 2 * t >= valid) s1[0] = s1[2] = NEG_INF;
		if (8 + 2 * t + 1 >= valid) s1[1] = s1[3] = NEG_INF;
		float alpha[2];
#pragma unroll
		for (int r = 0; r < R; r++) {
			float mx = fmaxf(fmaxf(s0[2 * r], s0[2 * r + 1]), fmaxf(s1[2 * r], s1[2 * r + 1]));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
			const float mn = fmaxf(m[r], mx);
			const float ms = mn == NEG_INF ? 0.f : mn;
			alpha[r] = ex2(m[r] - ms);
			s0[2 * r] = ex2(s0[2 * r] - ms);
			s0[2 * r + 1] = ex2(s0[2 * r + 1] - ms);
			s1[2 * r] = ex2(s1[2 * r] - ms);
			s1[2 * r + 1] = ex2(s1[2 * r + 1] - ms);
			l[r] = l[r] * alpha[r] + (s0[2 * r] + s0[2 * r + 1]) + (s1[2 * r] + s1[2 * r + 1]);
			m[r] = mn;
		}
		if (!TWO) alpha[1] = 1.f;
#pragma unroll
		for (int n = 0; n < NT; n++) {
			acc[n][0] *= alpha[0];
			acc[n][1] *= alpha[0];
			if (TWO) {
				acc[n][2] *= alpha[1];
				acc[n][3] *= alpha[1];
			}
		}
		if (KV8) {
#pragma unroll
			for (int e = 0; e < 4; e++) {
				s0[e] *= sv;
				s1[e] *= sv;
			}
		}
		// P as the A operand (rows = heads, k = the page's 16 tokens),
		// split hi + lo like Q.
		uint32_t pa0, pa1 = 0u, pa2, pa3 = 0u, pb0, pb1 = 0u, pb2, pb3 = 0u;
		split<T>(s0[0], s0[1], pa0, pb0);
		split<T>(s1[0], s1[1], pa2, pb2);
		if (TWO) {
			split<T>(s0[2], s0[3], pa1, pb1);
			split<T>(s1[2], s1[3], pa3, pb3);
		}
		{
			const int tr = (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
			for (int n2 = 0; n2 < NT / 2; n2++) {
				const int ch = 2 * n2 + (lane >> 4);
				uint32_t v0, v1, v2, v3;
				ldsm4t(vb + tr * ROWB + ((ch ^ (tr & 7)) << 4), v0, v1, v2, v3);
				mma<T>(acc[2 * n2], pa0, pa1, pa2, pa3, v0, v1);
				mma<T>(acc[2 * n2], pb0, pb1, pb2, pb3, v0, v1);
				mma<T>(acc[2 * n2 + 1], pa0, pa1, pa2, pa3, v2, v3);
				mma<T>(acc[2 * n2 + 1], pb0, pb1, pb2, pb3, v2, v3);
			}
		}
		__syncwarp();
		if (j + STAGES - 1 < cnt) issue((j + STAGES - 1) % STAGES, j + STAGES - 1);
		cp_async_commit();
	}
	cp_async_wait<0>();
#pragma unroll
	for (int r = 0; r < R; r++) {
		l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
		l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
	}
	// Merge the warps' states through shared memory: [WARPS][heads][D]
	// accumulators, then [WARPS][heads] maxima and sums.
	__syncthreads();
	float* red = reinterpret_cast<float*>(smem);
	float* rm = red + WARPS * heads * D;
	float* rl = rm + WARPS * heads;
#pragma unroll
	for (int r = 0; r < R; r++) {
		const int hr = g + 8 * r;
		if (hr < heads) {
			float* dst = red + (warp * heads + hr) * D + 2 * t;
#pragma unroll
			for (int n = 0; n < NT; n++) {
				dst[8 * n] = acc[n][2 * r];
				dst[8 * n + 1] = acc[n][2 * r + 1];
			}
			if (t == 0) {
				rm[warp * heads + hr] = m[r];
				rl[warp * heads + hr] = l[r];
			}
		}
	}
	__syncthreads();
	for (int idx = threadIdx.x; idx < heads * D; idx += blockDim.x) {
		const int hr = idx / D, d = idx % D;
		float M = NEG_INF;
#pragma unroll
		for (int w = 0; w < WARPS; w++) M = fmaxf(M, rm[w * heads + hr]);
		float num = 0.f, den = 0.f;
		if (M != NEG_INF) {
#pragma unroll
			for (int w = 0; w < WARPS; w++) {
				const float f = ex2(rm[w * heads + hr] - M);
				num = fmaf(f, red[(w * heads + hr) * D + d], num);
				den = fmaf(f, rl[w * heads + hr], den);
			}
		}
		part_o[(it * heads + hr) * D + d] = den > 0.f ? num / den : 0.f;
		if (d == 0) part_lse[it * heads + hr] = den > 0.f ? (M + log2f(den)) * 0.6931471805599453f : NEG_INF;
	}
	if (!fuse) return;
	// Fused reduce: the row's last item to finish merges the row's partial
	// states in item order (deterministic whichever block is last) and
	// resets the row's counter for the next launch.
	__shared__ int s_last;
	const i64 rr = seq * (per_head ? qh : kvh) + row;
	const i64 i0 = row_item[rr], i1 = row_item[rr + 1];
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) s_last = atomicAdd(&counter[rr], 1) == (int)(i1 - i0) - 1;
	__syncthreads();
	if (!s_last) return;
	__threadfence();
	// Weights exp(lse - M) / z per (item, head) staged in shared memory,
	// then each output sums its items with the loads unrolled (in flight
	// together).
	const int ni = (int)(i1 - i0);
	float* wts = reinterpret_cast<float*>(smem);  // [ni][heads]
	float* hm = wts + ni * heads;                 // [heads] max
	float* hz = hm + heads;                       // [heads] sum
	for (int x = threadIdx.x; x < ni * heads; x += blockDim.x) wts[x] = __ldcg(part_lse + i0 * heads + x);
	__syncthreads();
	if (threadIdx.x < heads) {
		float M = NEG_INF, z = 0.f;
		for (int k = 0; k < ni; k++) M = fmaxf(M, wts[k * heads + threadIdx.x]);
		if (M != NEG_INF)
			for (int k = 0; k < ni; k++) z += __expf(wts[k * heads + threadIdx.x] - M);
		hm[threadIdx.x] = M;
		hz[threadIdx.x] = z;
	}
	__syncthreads();
	for (int x = threadIdx.x; x < ni * heads; x += blockDim.x) {
		const int hr = x % heads;
		wts[x] = hz[hr] > 0.f ? __expf(wts[x] - hm[hr]) / hz[hr] : 0.f;
	}
	__syncthreads();
	for (int idx = threadIdx.x; idx < heads * D; idx += blockDim.x) {
		const int hr = idx / D, d = idx % D;
		const float* po = part_o + (i0 * heads + hr) * D + d;
		float a = 0.f;
#pragma unroll 16
		for (int k = 0; k < ni; k++) a = fmaf(wts[k * heads + hr], __ldcg(po + (i64)k * heads * D), a);
		const i64 h = per_head ? row : row * G + hr;
		out_o[(seq * qh + h) * D + d] = a;
		if (d == 0) out_lse[seq * qh + h] = hz[hr] > 0.f ? hm[hr] + __logf(hz[hr]) : NEG_INF;
	}
	if (threadIdx.x == 0) counter[rr] = 0;
}

#define SCORE(SUF, T, D)                                                                                           \
	extern "C" __global__ void __launch_bounds__(128) quest_scoremma_##SUF##_d##D(                                \
	    const T* s, const int* a, const int* b, const float* q, float* o, float* tm, i64 qh, i64 kvh, i64 ph,   \
	    i64 c) {                                                                                               \
		score_mma<T, D, false, 2>(s, a, b, q, o, tm, qh, kvh, ph, c);                                      \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(128) quest_scoremma_##SUF##_d##D##_h16(                          \
	    const T* s, const int* a, const int* b, const float* q, float* o, float* tm, i64 qh, i64 kvh, i64 ph,   \
	    i64 c) {                                                                                               \
		score_mma<T, D, true, 2>(s, a, b, q, o, tm, qh, kvh, ph, c);                                       \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(128) quest_scoremma_##SUF##_d##D##_u4(                           \
	    const T* s, const int* a, const int* b, const float* q, float* o, float* tm, i64 qh, i64 kvh, i64 ph,   \
	    i64 c) {                                                                                               \
		score_mma<T, D, false, 4>(s, a, b, q, o, tm, qh, kvh, ph, c);                                      \
	}

// The fp8 score kernels: one record per lane in flight and split
// accumulators (measured on an H200 at 1M tokens, batch 1, in a tuning
// build: 54 us against 68 for two records per lane and 89 for four, whose
// registers cap the occupancy).
#define SCORE8(D)                                                                                                  \
	extern "C" __global__ void __launch_bounds__(128) quest_score8mma_d##D(                                      \
	    const unsigned char* s, const float* sc, const int* a, const int* b, const float* q, float* o, float* tm, \
	    i64 qh, i64 kvh, i64 ph, i64 c) {                                                                      \
		score_mma8<D, false, 1, true>(s, sc, a, b, q, o, tm, qh, kvh, ph, c);                              \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(128) quest_score8mma_d##D##_h16(                                \
	    const unsigned char* s, const float* sc, const int* a, const int* b, const float* q, float* o, float* tm, \
	    i64 qh, i64 kvh, i64 ph, i64 c) {                                                                      \
		score_mma8<D, true, 1, true>(s, sc, a, b, q, o, tm, qh, kvh, ph, c);                               \
	}

#define ATTEND(NAME, T, D, W, ST, TWO)                                                                             \
	extern "C" __global__ void __launch_bounds__(32 * W) NAME(                                                    \
	    const T* K, const T* V, const int* indptr, const int* pages, const int* last_len, const float* q,      \
	    const int* item_seq, const int* item_row, const int* item_lo, const int* item_hi, const int* lists,    \
	    float* part_o, float* part_lse, const int* row_item, int* counter, float* out_o, float* out_lse,       \
	    i64 qh, i64 kvh, i64 per_head, i64 fuse, i64 pdl) {                                                    \
		attend_mma<T, D, W, ST, TWO>(K, V, indptr, pages, last_len, q, item_seq, item_row, item_lo, item_hi, \
					     lists, part_o, part_lse, row_item, counter, out_o, out_lse, qh, kvh,  \
					     per_head, fuse, pdl);                                                 \
	}

// fp8 records (KV8): the scales follow K and V.
#define ATTEND8(NAME, D, W, ST, TWO)                                                                               \
	extern "C" __global__ void __launch_bounds__(32 * W) NAME(                                                    \
	    const unsigned char* K, const unsigned char* V, const float* ksc, const float* vsc, const int* indptr,  \
	    const int* pages, const int* last_len, const float* q, const int* item_seq, const int* item_row,       \
	    const int* item_lo, const int* item_hi, const int* lists, float* part_o, float* part_lse,              \
	    const int* row_item, int* counter, float* out_o, float* out_lse, i64 qh, i64 kvh, i64 per_head,        \
	    i64 fuse, i64 pdl) {                                                                                   \
		attend_mma<__nv_bfloat16, D, W, ST, TWO, true>(                                                     \
		    reinterpret_cast<const __nv_bfloat16*>(K), reinterpret_cast<const __nv_bfloat16*>(V), indptr,  \
		    pages, last_len, q, item_seq, item_row, item_lo, item_hi, lists, part_o, part_lse, row_item,    \
		    counter, out_o, out_lse, qh, kvh, per_head, fuse, pdl, ksc, vsc);                               \
	}

SCORE(f16, __half, 64)
SCORE(f16, __half, 128)
SCORE(bf16, __nv_bfloat16, 64)
SCORE(bf16, __nv_bfloat16, 128)
SCORE8(64)
SCORE8(128)

// Default variants: 4 warps, 3 stages per warp (at 190-odd registers per
// thread two blocks fit an SM either way); _h16 for more than 8 heads per
// KV head.
ATTEND(quest_attendmma_f16_d64, __half, 64, 4, 3, false)
ATTEND(quest_attendmma_f16_d64_h16, __half, 64, 4, 3, true)
ATTEND(quest_attendmma_f16_d128, __half, 128, 4, 3, false)
ATTEND(quest_attendmma_f16_d128_h16, __half, 128, 4, 3, true)
ATTEND(quest_attendmma_bf16_d64, __nv_bfloat16, 64, 4, 3, false)
ATTEND(quest_attendmma_bf16_d64_h16, __nv_bfloat16, 64, 4, 3, true)
ATTEND(quest_attendmma_bf16_d128, __nv_bfloat16, 128, 4, 3, false)
ATTEND(quest_attendmma_bf16_d128_h16, __nv_bfloat16, 128, 4, 3, true)
// Tuning variants (bf16, D = 128), chosen with Config.AttendVariant.
ATTEND(quest_attendmma_bf16_d128_w4s2, __nv_bfloat16, 128, 4, 2, false)
ATTEND(quest_attendmma_bf16_d128_w8s2, __nv_bfloat16, 128, 8, 2, false)
ATTEND(quest_attendmma_bf16_d128_w2s3, __nv_bfloat16, 128, 2, 3, false)
ATTEND(quest_attendmma_bf16_d128_w4s4, __nv_bfloat16, 128, 4, 4, false)
// fp8 records, converted to bf16 tiles in shared memory (the default for
// plan.FP8 pages of S = 16 and D 64 or 128; quest_attend_fp8 is the
// CUDA-core kernel).
ATTEND8(quest_attendmma_fp8_d64, 64, 4, 3, false)
ATTEND8(quest_attendmma_fp8_d64_h16, 64, 4, 3, true)
ATTEND8(quest_attendmma_fp8_d128, 128, 4, 3, false)
ATTEND8(quest_attendmma_fp8_d128_h16, 128, 4, 3, true)
