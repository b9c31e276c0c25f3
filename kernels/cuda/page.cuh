// Paged K/V writes (quest.cu): the append of new tokens with the widening
// of their pages' summaries, summary rebuilds (rescan) and the gathering of
// a batch's page list from device page tables.
#pragma once

#include "common.cuh"

// append: writes n new tokens (k, v float32 [n][kvh][D]) of one sequence at
// positions pos0.. into the pages named by page_table (logical -> physical)
// and widens each touched page's summary (eq. 8). A page whose first slot is
// written here starts from +inf/-inf (a recycled page gets a fresh summary).
// slots, when not null, holds the device slot of each page_table entry: K
// and V go to that slot of a slot pool (slots.go) while the summary stays
// indexed by physical page; null stores K and V at the physical page.
// Callers that pass only the touched pages give pos0 < S (the slot in the
// first page). Grid: (pages touched, kvh); block: threads over D. Each
// thread owns one dimension of one (page, head) record, so no atomics are
// needed.
template <typename T>
__device__ void append(T* K, T* V, T* sum, const int* page_table, const int* slots, const float* k,
		       const float* v, i64 pos0, i64 n, i64 kvh, i64 D, i64 S) {
	const i64 first_page = pos0 / S;
	const i64 page = first_page + blockIdx.x;
	const i64 h = blockIdx.y;
	const i64 t_lo = max(pos0, page * S), t_hi = min(pos0 + n, (page + 1) * S);
	if (t_lo >= t_hi) return;
	const i64 phys = page_table[page];
	const i64 kv = slots ? (i64)slots[page] : phys;  // where K and V go
	T* rec = sum + (phys * kvh + h) * 2 * D;
	for (i64 j = threadIdx.x; j < D; j += blockDim.x) {
		float lo, hi;
		if (t_lo % S == 0) {
			lo = __int_as_float(0x7f800000);  // +inf
			hi = __int_as_float(0xff800000);  // -inf
		} else {
			lo = to_f(rec[j]);
			hi = to_f(rec[D + j]);
		}
		for (i64 t = t_lo; t < t_hi; t++) {
			const i64 src = ((t - pos0) * kvh + h) * D + j;
			const i64 dst = ((kv * kvh + h) * S + (t % S)) * D + j;
			T kq = from_f<T>(k[src]);
			K[dst] = kq;
			V[dst] = from_f<T>(v[src]);
			const float kf = to_f(kq);  // the summary covers the stored key
			lo = fminf(lo, kf);
			hi = fmaxf(hi, kf);
		}
		rec[j] = from_f<T>(lo);  // exact: lo, hi are stored values
		rec[D + j] = from_f<T>(hi);
	}
}

// summarize: rebuilds the summaries of pages from their first `valid`
// tokens (full pages: valid = S; valid = 0 gives the empty box): the
// physical pages list[0..gridDim.x), or pages [0, gridDim.x) when list is
// null. Grid: (pages, kvh); threads over D.
template <typename T>
__device__ void summarize(const T* K, T* sum, const int* list, i64 kvh, i64 D, i64 S, i64 valid) {
	const i64 p = list ? (i64)list[blockIdx.x] : (i64)blockIdx.x, h = blockIdx.y;
	const T* blk = K + (p * kvh + h) * S * D;
	T* rec = sum + (p * kvh + h) * 2 * D;
	for (i64 j = threadIdx.x; j < D; j += blockDim.x) {
		float lo = __int_as_float(0x7f800000), hi = __int_as_float(0xff800000);
		for (i64 t = 0; t < valid; t++) {
			const float x = to_f(blk[t * D + j]);
			lo = fminf(lo, x);
			hi = fmaxf(hi, x);
		}
		rec[j] = from_f<T>(lo);
		rec[D + j] = from_f<T>(hi);
	}
}

// gather_tables copies the first indptr[s+1]-indptr[s] entries of each
// sequence s's device page table (tabs[s], a device address) to
// out[indptr[s]...]: the batch's page list, built on the device. Grid
// (blocks per sequence, sequences).
extern "C" __global__ void quest_gather_tables(const long long* tabs, const int* indptr, int* out) {
	const i64 seq = blockIdx.y;
	const i64 p0 = indptr[seq], np = indptr[seq + 1] - p0;
	const int* t = reinterpret_cast<const int*>(tabs[seq]);
	for (i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += (i64)gridDim.x * blockDim.x) out[p0 + p] = t[p];
}

#define PAGE_ENTRIES(SUF, T)                                                                                     \
	extern "C" __global__ void quest_append_##SUF(T* K, T* V, T* sum, const int* pt, const int* st,               \
						      const float* k, const float* v, i64 pos0, i64 n, i64 kvh,      \
						      i64 D, i64 S) {                                                \
		append<T>(K, V, sum, pt, st, k, v, pos0, n, kvh, D, S);                                          \
	}                                                                                                        \
	extern "C" __global__ void quest_summarize_##SUF(const T* K, T* sum, i64 kvh, i64 D, i64 S, i64 valid) {      \
		summarize<T>(K, sum, nullptr, kvh, D, S, valid);                                                 \
	}                                                                                                        \
	extern "C" __global__ void quest_rescan_##SUF(const T* K, T* sum, const int* list, i64 kvh, i64 D, i64 S,  \
						      i64 valid) {                                                   \
		summarize<T>(K, sum, list, kvh, D, S, valid);                                                    \
	}

PAGE_ENTRIES(f32, float)
PAGE_ENTRIES(f16, __half)
PAGE_ENTRIES(bf16, __nv_bfloat16)
