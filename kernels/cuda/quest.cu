// Quest decode kernels for questrt's CUDA backend (compiled to PTX for sm_90
// by kernels/cuda/gen.sh and embedded in the Go package).
//
// Layout (same as the CPU backend), per layer and physical page p:
//   K, V     [pages][kv_heads][S][D]   storage type T (float, __half, __nv_bfloat16)
//   summary  [pages][kv_heads][2][D]   T: D mins then D maxes
// Scores, softmax and accumulation are fp32. Every integer parameter is a
// 64-bit `long long` (gorgonia.org/cu passes each parameter as 8 bytes).
//
// Query head h belongs to KV head h / G. Score rows are KV heads
// (group_max: the max over the group) or query heads (per_head).

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <cub/block/block_radix_sort.cuh>

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

// ---------------------------------------------------------------------------
// convert: dst[i] = T(src[i]) (uploading float32 pools into T storage).
template <typename T>
__device__ void convert(const float* src, T* dst, i64 n) {
	for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
		dst[i] = from_f<T>(src[i]);
}

// ---------------------------------------------------------------------------
// append: writes n new tokens (k, v float32 [n][kvh][D]) of one sequence at
// positions pos0.. into the pages named by page_table (logical -> physical)
// and widens each touched page's summary (eq. 8). A page whose first slot is
// written here starts from +inf/-inf (a recycled page gets a fresh summary).
// Grid: (pages touched, kvh); block: threads over D. Each thread owns one
// dimension of one (page, head) record, so no atomics are needed.
template <typename T>
__device__ void append(T* K, T* V, T* sum, const int* page_table, const float* k, const float* v,
		       i64 pos0, i64 n, i64 kvh, i64 D, i64 S) {
	const i64 first_page = pos0 / S;
	const i64 page = first_page + blockIdx.x;
	const i64 h = blockIdx.y;
	const i64 t_lo = max(pos0, page * S), t_hi = min(pos0 + n, (page + 1) * S);
	if (t_lo >= t_hi) return;
	const i64 phys = page_table[page];
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
			const i64 dst = ((phys * kvh + h) * S + (t % S)) * D + j;
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

// ---------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------
// topk: one block per row. Row r selects k of n scores starting at
// scores[soff]; candidate i is logical page base+i; the chosen pages are
// written ascending at out[ooff..]. Order: score descending, ties to the
// lower index. Radix select on an order-preserving 32-bit key finds the k-th
// key in four 8-bit passes; a fifth pass writes the chosen indices in index
// order with a block-wide scan, so the output needs no sort.
#define TOPK_THREADS 1024

__device__ __forceinline__ uint32_t desc_key(float f) {
	uint32_t u = __float_as_uint(f);
	if (f == 0.f) u = 0;  // -0 and +0 tie
	const uint32_t asc = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return ~asc;  // ascending key = descending score
}

// find_bucket: warp 0 finds the first of 256 histogram bins where the
// running count reaches need; it returns (bin, need left inside the bin) in
// *d and *left (thread 0 writes them). Other warps do nothing.
__device__ __forceinline__ void find_bucket(const int* hist, int need, int* d, int* left) {
	if (threadIdx.x >= 32) return;
	const int lane = threadIdx.x;
	int c[8], sum = 0;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		c[i] = hist[lane * 8 + i];
		sum += c[i];
	}
	int inc = sum;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		const int y = __shfl_up_sync(0xffffffffu, inc, o);
		if (lane >= o) inc += y;
	}
	const int excl = inc - sum;
	const unsigned hit = __ballot_sync(0xffffffffu, inc >= need);
	const int first = hit ? __ffs(hit) - 1 : 31;
	if (lane == first) {
		int rem = need - excl, b = lane * 8;
		int i = 0;
		while (i < 7 && c[i] < rem) {
			rem -= c[i];
			i++;
		}
		*d = b + i;
		*left = rem;
	}
}

// Block-wide exclusive scan of one int per thread; returns the prefix and
// sets *total. Uses 32 ints of shared scratch.
__device__ int block_scan(int x, int* scratch, int* total) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	int inc = x;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		const int y = __shfl_up_sync(0xffffffffu, inc, o);
		if (lane >= o) inc += y;
	}
	if (lane == 31) scratch[warp] = inc;
	__syncthreads();
	if (warp == 0) {
		int v = lane < nw ? scratch[lane] : 0;
		int vi = v;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			const int y = __shfl_up_sync(0xffffffffu, vi, o);
			if (lane >= o) vi += y;
		}
		if (lane < nw) scratch[lane] = vi - v;  // exclusive warp offsets
		if (lane == nw - 1) scratch[32] = vi;
	}
	__syncthreads();
	const int res = scratch[warp] + inc - x;
	*total = scratch[32];
	__syncthreads();
	return res;
}

// topk_row: the k best of s[0..n) (0 < k < n) by a radix select over the
// row in global memory, written as b + index ascending at o. The whole
// block calls it.
__device__ void topk_row(const float* s, int n, int k, int b, int* o) {
	__shared__ int hist[256];
	__shared__ int scratch[33];
	__shared__ uint32_t s_prefix, s_mask;
	__shared__ int s_k;
	if (threadIdx.x == 0) { s_prefix = 0; s_mask = 0; s_k = k; }
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
		__syncthreads();
		const uint32_t prefix = s_prefix, mask = s_mask;
		// Warp-aggregated: lanes with the same digit add once (scores
		// of one row share few exponents, so plain atomics serialize).
		for (int i0 = 0; i0 < n; i0 += blockDim.x * 4) {
			float x[4];
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int i = i0 + u * blockDim.x + threadIdx.x;
				x[u] = i < n ? s[i] : 0.f;
			}
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int i = i0 + u * blockDim.x + threadIdx.x;
				unsigned digit = 256;
				if (i < n) {
					const uint32_t key = desc_key(x[u]);
					if ((key & mask) == prefix) digit = (key >> shift) & 255;
				}
				const unsigned peers = __match_any_sync(0xffffffffu, digit);
				if (digit != 256 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
			}
		}
		__syncthreads();
		__shared__ int s_d, s_left;
		find_bucket(hist, s_k, &s_d, &s_left);
		__syncthreads();
		if (threadIdx.x == 0) {
			s_prefix = prefix | ((uint32_t)s_d << shift);
			s_mask = mask | (255u << shift);
			s_k = s_left;  // keys equal to the prefix still needed
		}
		__syncthreads();
	}
	const uint32_t T = s_prefix;
	const int ties_needed = s_k;
	// Each thread owns 4 consecutive indices, so thread order is index
	// order and two block scans per 4*blockDim elements place the output.
	int written = 0, ties_seen = 0;
	for (int i0 = 0; i0 < n; i0 += blockDim.x * 4) {
		uint32_t key[4];
		int nt = 0;
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int i = i0 + threadIdx.x * 4 + u;
			key[u] = i < n ? desc_key(s[i]) : 0xffffffffu;
			nt += (i < n && key[u] == T);
		}
		int ties_total;
		int tie_rank = ties_seen + block_scan(nt, scratch, &ties_total);
		int take[4], nk = 0;
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int i = i0 + threadIdx.x * 4 + u;
			const bool tie = i < n && key[u] == T;
			take[u] = i < n && (key[u] < T || (tie && tie_rank < ties_needed));
			tie_rank += tie;
			nk += take[u];
		}
		int take_total;
		int pos = written + block_scan(nk, scratch, &take_total);
#pragma unroll
		for (int u = 0; u < 4; u++) {
			if (take[u]) o[pos++] = b + i0 + threadIdx.x * 4 + u;
		}
		written += take_total;
		ties_seen += ties_total;
		if (written >= k) break;
	}
}


extern "C" __global__ void __launch_bounds__(1024) quest_topk(const float* scores, const int* soff, const int* nn, const int* base,
				      const int* kk, const int* ooff, int* out) {
	const int r = blockIdx.x;
	const int n = nn[r], k = kk[r], b = base[r];
	int* o = out + ooff[r];
	if (k <= 0) return;
	if (k >= n) {
		for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = b + i;
		return;
	}
	topk_row(scores + soff[r], n, k, b, o);
}

// ---------------------------------------------------------------------------
// Two-stage top-K for long rows: quest_topk_local splits each row into
// slices that fit shared memory and keeps every slice's best k (a superset
// of the row's best k); quest_topk_merge selects the row's best k among the
// slices' candidates. Both select with a radix select over keys held in
// shared memory, and emit the chosen entries in position order, which is
// index order, so the output needs no sort.
#define TOPK_SLICE_MAX 8192
#define TOPK_CAND_MAX 4096

// smem_select finds the k best of keys[0..m) (smallest key, ties to the
// lower position) and returns the threshold key T and how many entries
// equal to T are taken (the first ones by position).
__device__ void smem_select(const uint32_t* keys, int m, int k, int* hist, uint32_t* s_prefix, int* s_k) {
	if (threadIdx.x == 0) { *s_prefix = 0; *s_k = k; }
	uint32_t mask = 0;
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
		__syncthreads();
		const uint32_t prefix = *s_prefix;
		for (int i0 = 0; i0 < m; i0 += blockDim.x) {
			const int i = i0 + threadIdx.x;
			unsigned digit = 256;
			if (i < m && (keys[i] & mask) == prefix) digit = (keys[i] >> shift) & 255;
			const unsigned peers = __match_any_sync(0xffffffffu, digit);
			if (digit != 256 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
		}
		__syncthreads();
		__shared__ int s_d, s_left;
		find_bucket(hist, *s_k, &s_d, &s_left);
		__syncthreads();
		if (threadIdx.x == 0) {
			*s_prefix = prefix | ((uint32_t)s_d << shift);
			*s_k = s_left;
		}
		mask |= 255u << shift;
		__syncthreads();
	}
}

// smem_emit writes, in position order, out_idx[j] = idx_of(pos) (and
// out_key[j] = keys[pos] when out_key is set) for the chosen entries.
template <typename F>
__device__ void smem_emit(const uint32_t* keys, int m, int k, uint32_t T, int ties, int* scratch, F emit) {
	int written = 0, ties_seen = 0;
	for (int i0 = 0; i0 < m; i0 += blockDim.x * 4) {
		uint32_t key[4];
		int nt = 0;
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int i = i0 + threadIdx.x * 4 + u;
			key[u] = i < m ? keys[i] : 0xffffffffu;
			nt += (i < m && key[u] == T);
		}
		int ties_total;
		int tie_rank = ties_seen + block_scan(nt, scratch, &ties_total);
		int take[4], nk = 0;
#pragma unroll
		for (int u = 0; u < 4; u++) {
			const int i = i0 + threadIdx.x * 4 + u;
			const bool tie = i < m && key[u] == T;
			take[u] = i < m && (key[u] < T || (tie && tie_rank < ties));
			tie_rank += tie;
			nk += take[u];
		}
		int take_total;
		int pos = written + block_scan(nk, scratch, &take_total);
#pragma unroll
		for (int u = 0; u < 4; u++) {
			if (take[u]) emit(pos++, i0 + threadIdx.x * 4 + u, key[u]);
		}
		written += take_total;
		ties_seen += ties_total;
		if (written >= k) break;
	}
}

// quest_topk_local: grid (slices, rows). Slice j of row r covers candidates
// [j*slice, (j+1)*slice) of the row; it writes k candidates (key, index in
// the row) at cand[(r*slices + j)*k ...], padding with the worst key when
// the slice is shorter than k.
extern "C" __global__ void __launch_bounds__(1024) quest_topk_local(const float* scores, const int* soff, const int* nn, const int* kk,
					    uint32_t* cand_key, int* cand_idx, i64 slice, i64 slices, i64 kstride) {
	__shared__ uint32_t keys[TOPK_SLICE_MAX];
	__shared__ int hist[256];
	__shared__ int scratch[33];
	__shared__ uint32_t s_prefix;
	__shared__ int s_k;
	const int r = blockIdx.y, j = blockIdx.x;
	const int n = nn[r], k = kk[r];
	const int lo = j * (int)slice, m = max(0, min((int)slice, n - lo));
	uint32_t* ck = cand_key + ((i64)r * slices + j) * kstride;
	int* ci = cand_idx + ((i64)r * slices + j) * kstride;
	const float* s = scores + soff[r] + lo;
	for (int i = threadIdx.x; i < m; i += blockDim.x) keys[i] = desc_key(s[i]);
	__syncthreads();
	if (m <= k) {
		for (int i = threadIdx.x; i < k; i += blockDim.x) {
			ck[i] = i < m ? keys[i] : 0xffffffffu;
			ci[i] = i < m ? lo + i : 0x7fffffff;
		}
		return;
	}
	smem_select(keys, m, k, hist, &s_prefix, &s_k);
	const uint32_t T = s_prefix;
	const int ties = s_k;
	smem_emit(keys, m, k, T, ties, scratch, [&](int p, int i, uint32_t key) { ck[p] = key; ci[p] = lo + i; });
}

// quest_topk_merge: one block per row; selects the row's best k among its
// slices*k candidates (position order = index order) and writes base+index
// ascending at out[ooff[r]..].
extern "C" __global__ void __launch_bounds__(1024) quest_topk_merge(const uint32_t* cand_key, const int* cand_idx, const int* base,
					    const int* kk, const int* ooff, int* out, i64 slices, i64 kstride) {
	__shared__ uint32_t keys[TOPK_CAND_MAX];
	__shared__ int hist[256];
	__shared__ int scratch[33];
	__shared__ uint32_t s_prefix;
	__shared__ int s_k;
	const int r = blockIdx.x;
	const int k = kk[r];
	const int m = (int)slices * k;
	// Candidate i of the row is entry i % k of slice i / k.
	const i64 row0 = (i64)r * slices * kstride;
	for (int i = threadIdx.x; i < m; i += blockDim.x) keys[i] = cand_key[row0 + (i / k) * kstride + i % k];
	__syncthreads();
	smem_select(keys, m, k, hist, &s_prefix, &s_k);
	const uint32_t T = s_prefix;
	const int ties = s_k;
	int* o = out + ooff[r];
	const int b = base[r];
	smem_emit(keys, m, k, T, ties, scratch, [&](int p, int i, uint32_t) { o[p] = b + cand_idx[row0 + (i / k) * kstride + i % k]; });
}

// ---------------------------------------------------------------------------
// quest_topk_thr: one block per row for rows of up to THR_TILES*8 scores and
// k <= THR_CAND/8. The row is cut into tiles of 8 consecutive scores. A
// threshold tau with at least k tile maxima >= tau bounds the row's k-th
// best score from below (those tiles each hold a score >= tau), so every
// score the row keeps is >= tau and lies in a tile whose maximum is >= tau.
// tau is found with one histogram of the tile maxima (THR_BINS linear bins
// between their min and max; tau = the least tile maximum in the bins from
// the top down to the first bin where k tiles are reached); the scores >=
// tau of the qualifying tiles (usually a little over k) are gathered in
// index order and the k best among them selected exactly (radix select in
// shared memory, ties to the lower index, indices written ascending). The
// tile maxima come from the score kernel (tmax, laid out like the scores,
// when every row starts at a score row's start) or from the scores. If
// more than THR_CAND scores qualify (heavy ties), the row falls back to
// topk_row. Loads are issued 16 at a time per thread: a block's 64 serial
// round trips to L2 would otherwise dominate.
// block_minmax reduces (mn, mx) over the block; every thread gets the
// result. red holds 64 values of T; it may be reused after the next
// barrier.
template <typename T> __device__ void block_minmax(T& mn, T& mx, T* red) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
	for (int x = 16; x > 0; x >>= 1) {
		mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, x));
		mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, x));
	}
	if (lane == 0) { red[warp] = mn; red[32 + warp] = mx; }
	__syncthreads();
	mn = red[0];
	mx = red[32];
	for (int w = 1; w < nw; w++) { mn = min(mn, red[w]); mx = max(mx, red[32 + w]); }
}

// nanmax is max that propagates NaN (fmaxf drops it).
__device__ __forceinline__ float nanmax(float a, float b) { return (a != a || a > b) ? a : b; }

#define THR_TILES 8192
#define THR_BINS 2048
#define THR_CAND 4096
extern "C" __global__ void __launch_bounds__(1024) quest_topk_thr(const float* scores, const float* tmax, const int* soff, const int* nn,
					  const int* base, const int* kk, const int* ooff, int* out) {
	__shared__ float tm[THR_TILES];  // tile maxima, then candidate keys and indices
	__shared__ int hist[THR_BINS];
	__shared__ int scratch[33];
	__shared__ float red[64];
	__shared__ int s_bin;
	__shared__ uint32_t s_prefix;
	__shared__ int s_k;
	const int r = blockIdx.x;
	const int n = nn[r], k = kk[r], b = base[r];
	const float* s = scores + soff[r];
	int* o = out + ooff[r];
	// Launched as a programmatic dependent of the score kernel: the plan
	// (uploaded before the pipeline) is read above, the scores below.
	asm volatile("griddepcontrol.wait;\n" ::: "memory");
	if (k <= 0) return;
	if (k >= n) {
		for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = b + i;
		return;
	}
	if (n > THR_TILES * 8 || k > THR_CAND / 8) {
		topk_row(s, n, k, b, o);
		return;
	}
	const float NINF = __int_as_float(0xff800000);
	const int nt = (n + 7) / 8;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	// 1. Tile maxima: from tmax when the score kernel wrote them (every
	// whole tile of the row; the partial last tile, which may also cover
	// scores past n, is recomputed), else lane-contiguous loads of the
	// scores, 8 lanes per tile.
	if (tmax) {
		const float* tr = tmax + soff[r];
		const int full = n / 8;
		for (int t = threadIdx.x; t < full; t += blockDim.x) tm[t] = tr[t];
		if (full < nt && threadIdx.x == 0) {
			float x = NINF;
			for (int i = full * 8; i < n; i++) x = nanmax(x, s[i]);
			tm[full] = x;
		}
	} else
	for (int i0 = warp * 32; i0 < nt * 8; i0 += nw * 32 * 16) {
		float v[16];
#pragma unroll
		for (int u = 0; u < 16; u++) {
			const int i = i0 + u * nw * 32 + lane;
			v[u] = i < n ? s[i] : NINF;
		}
#pragma unroll
		for (int u = 0; u < 16; u++) {
			float x = v[u];
			x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 1));
			x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 2));
			x = nanmax(x, __shfl_xor_sync(0xffffffffu, x, 4));
			const int i = i0 + u * nw * 32 + lane;
			if ((lane & 7) == 0 && i < nt * 8) tm[i / 8] = x;
		}
	}
	// A NaN score (from non-finite stored data) makes its tile maximum NaN;
	// such rows take the radix select, which ranks NaN like any key.
	int nan = 0;
	for (int t = threadIdx.x; t < nt; t += blockDim.x) nan |= tm[t] != tm[t];
	if (__syncthreads_or(nan)) {
		topk_row(s, n, k, b, o);
		return;
	}
	float tau = NINF;  // every score qualifies when k >= nt (n <= 8k)
	if (k < nt) {
		// 2. Range of the tile maxima.
		float mn = __int_as_float(0x7f800000), mx = NINF;
		for (int t = threadIdx.x; t < nt; t += blockDim.x) {
			mn = fminf(mn, tm[t]);
			mx = fmaxf(mx, tm[t]);
		}
		block_minmax(mn, mx, red);
		for (int i = threadIdx.x; i < THR_BINS; i += blockDim.x) hist[i] = 0;
		__syncthreads();
		// 3. Histogram (bin is non-decreasing in the value).
		const float scale = mx > mn ? (float)THR_BINS / (mx - mn) : 0.f;
		for (int t = threadIdx.x; t < nt; t += blockDim.x)
			atomicAdd(&hist[min(THR_BINS - 1, (int)((tm[t] - mn) * scale))], 1);
		__syncthreads();
		// 4. From the top bin down, the first bin where k tiles are reached:
		// thread t owns bins THR_BINS-1-2t and THR_BINS-2-2t.
		const int bh = THR_BINS - 1 - 2 * (int)threadIdx.x, bl = bh - 1;
		const int ch = bh >= 0 ? hist[bh] : 0, cl = bl >= 0 ? hist[bl] : 0;
		int total;
		const int above = block_scan(ch + cl, scratch, &total);
		if (bh >= 0 && above < k && above + ch >= k) s_bin = bh;
		else if (bl >= 0 && above + ch < k && above + ch + cl >= k) s_bin = bl;
		__syncthreads();
		const int bstar = s_bin;
		// 5. tau = the least tile maximum in bins >= bstar.
		float lo = __int_as_float(0x7f800000);
		for (int t = threadIdx.x; t < nt; t += blockDim.x)
			if (min(THR_BINS - 1, (int)((tm[t] - mn) * scale)) >= bstar) lo = fminf(lo, tm[t]);
#pragma unroll
		for (int x = 16; x > 0; x >>= 1) lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, x));
		if (lane == 0) red[warp] = lo;
		__syncthreads();
		tau = red[0];
		for (int w = 1; w < nw; w++) tau = fminf(tau, red[w]);
	}
	// 6. The qualifying tiles (maximum >= tau), listed in index order in
	// qt (hist's space): thread t owns tiles [t*TPT, (t+1)*TPT).
	const int TPT = (nt + blockDim.x - 1) / blockDim.x;  // <= 8
	int q = 0;
	for (int e = 0; e < TPT; e++) {
		const int tl = threadIdx.x * TPT + e;
		q += tl < nt && tm[tl] >= tau;
	}
	int nq;
	int qpos = block_scan(q, scratch, &nq);
	if (nq > THR_BINS) {
		topk_row(s, n, k, b, o);
		return;
	}
	int* qt = hist;
	for (int e = 0; e < TPT; e++) {
		const int tl = threadIdx.x * TPT + e;
		if (tl < nt && tm[tl] >= tau) qt[qpos++] = tl;
	}
	__syncthreads();
	// 7. Gather the scores >= tau of the listed tiles in index order: thread
	// t reads tile qt[t] (8 independent loads, one round trip per 1024
	// tiles).
	uint32_t* ckey = reinterpret_cast<uint32_t*>(tm);
	int* cidx = reinterpret_cast<int*>(tm + THR_CAND);
	int m = 0;
	for (int r0 = 0; r0 < nq; r0 += blockDim.x) {
		const int j = r0 + threadIdx.x;
		const int tl = j < nq ? qt[j] : 0;
		float v[8];
#pragma unroll
		for (int e = 0; e < 8; e++) v[e] = j < nq && tl * 8 + e < n ? s[tl * 8 + e] : NINF;
		int c = 0;
#pragma unroll
		for (int e = 0; e < 8; e++) c += j < nq && tl * 8 + e < n && v[e] >= tau;
		int tot;
		int pos = m + block_scan(c, scratch, &tot);  // syncs: tm is free after the first
		if (m + tot > THR_CAND) {
			topk_row(s, n, k, b, o);
			return;
		}
#pragma unroll
		for (int e = 0; e < 8; e++) {
			if (j < nq && tl * 8 + e < n && v[e] >= tau) {
				ckey[pos] = desc_key(v[e]);
				cidx[pos] = tl * 8 + e;
				pos++;
			}
		}
		m += tot;
	}
	if (m < k) {  // cannot happen without NaN scores, which took the radix path above
		topk_row(s, n, k, b, o);
		return;
	}
	__syncthreads();
	// 8. The k best candidates, emitted in index order: a histogram of the
	// candidates' keys (linear bins between their min and max) finds the
	// bin b2 where the k-th best falls; the candidates of b2 (usually one or
	// two) are ranked by (key, index) to find the last one taken; more than
	// 1024 in b2 (ties) fall back to the radix select.
	uint32_t kmin = 0xffffffffu, kmax = 0;
	for (int p = threadIdx.x; p < m; p += blockDim.x) {
		kmin = min(kmin, ckey[p]);
		kmax = max(kmax, ckey[p]);
	}
	// (red's last readers, in step 5, are past the barriers of steps 6-7.)
	block_minmax(kmin, kmax, reinterpret_cast<uint32_t*>(red));
	for (int i = threadIdx.x; i < THR_BINS; i += blockDim.x) hist[i] = 0;
	__syncthreads();
	const unsigned long long span = (unsigned long long)(kmax - kmin) + 1;
	auto kbin = [&](uint32_t key) { return (int)(((unsigned long long)(key - kmin) * THR_BINS) / span); };
	for (int p = threadIdx.x; p < m; p += blockDim.x) atomicAdd(&hist[kbin(ckey[p])], 1);
	__syncthreads();
	__shared__ int s_need, s_cnt;
	__shared__ uint32_t s_tkey;
	__shared__ int s_tidx;
	{
		const int c0 = hist[2 * threadIdx.x], c1 = hist[2 * threadIdx.x + 1];
		int tot;
		const int below = block_scan(c0 + c1, scratch, &tot);
		if (below < k && below + c0 >= k) { s_bin = 2 * threadIdx.x; s_need = k - below; s_cnt = c0; }
		else if (below + c0 < k && below + c0 + c1 >= k) { s_bin = 2 * threadIdx.x + 1; s_need = k - below - c0; s_cnt = c1; }
	}
	__syncthreads();
	const int b2 = s_bin, need2 = s_need, cnt2 = s_cnt;
	if (cnt2 > 1024) {
		smem_select(ckey, m, k, hist, &s_prefix, &s_k);
		const uint32_t T = s_prefix;
		const int ties = s_k;
		smem_emit(ckey, m, k, T, ties, scratch, [&](int p, int i, uint32_t) { o[p] = b + cidx[i]; });
		return;
	}
	// Every candidate of b2 is taken when need2 == cnt2; else the need2-th
	// best of b2 by (key, index) is the last one taken.
	uint32_t tkey = 0xffffffffu;
	int tidx = 0x7fffffff;
	if (need2 < cnt2) {
		uint32_t* mk = reinterpret_cast<uint32_t*>(hist);  // [cnt2] keys, then [cnt2] indices
		int* mi = hist + 1024;
		if (threadIdx.x == 0) s_k = 0;
		__syncthreads();
		for (int p = threadIdx.x; p < m; p += blockDim.x) {
			if (kbin(ckey[p]) == b2) {
				const int j = atomicAdd(&s_k, 1);
				mk[j] = ckey[p];
				mi[j] = cidx[p];
			}
		}
		__syncthreads();
		if ((int)threadIdx.x < cnt2) {
			const uint32_t key = mk[threadIdx.x];
			const int idx = mi[threadIdx.x];
			int rank = 0;
			for (int j = 0; j < cnt2; j++) rank += mk[j] < key || (mk[j] == key && mi[j] < idx);
			if (rank == need2 - 1) { s_tkey = key; s_tidx = idx; }
		}
		__syncthreads();
		tkey = s_tkey;
		tidx = s_tidx;
	}
	// Emit: thread t owns candidates [t*CPT, (t+1)*CPT) (index order).
	const int CPT = (m + blockDim.x - 1) / blockDim.x;  // <= 4
	int nsel = 0;
	for (int e = 0; e < CPT; e++) {
		const int p = threadIdx.x * CPT + e;
		if (p < m) {
			const int bn = kbin(ckey[p]);
			nsel += bn < b2 || (bn == b2 && (ckey[p] < tkey || (ckey[p] == tkey && cidx[p] <= tidx)));
		}
	}
	int tot;
	int pos = block_scan(nsel, scratch, &tot);
	for (int e = 0; e < CPT; e++) {
		const int p = threadIdx.x * CPT + e;
		if (p < m) {
			const int bn = kbin(ckey[p]);
			if (bn < b2 || (bn == b2 && (ckey[p] < tkey || (ckey[p] == tkey && cidx[p] <= tidx)))) o[pos++] = b + cidx[p];
		}
	}
}

// ---------------------------------------------------------------------------
// quest_topk_radix: exact top-K of long rows with many blocks per row, in
// one launch. Entries are ranked by the 64-bit composite
// CL = desc_key(score) << ib | index (ib = bits of the longest row's last
// index), which is unique per row, so "score descending, ties to the lower
// index" is plain "CL ascending" and a radix select on CL finds exactly the
// k best. A row's passes each resolve 12 more bits of the k-th best CL
// (prefix): pass p reads the row (or, when the previous pass gathered its
// candidates into a buffer, that buffer), histograms digit p of the
// entries that match the prefix (shared memory, then atomics into a global
// per-row histogram), appends to the row's kept list every entry whose
// prefix is below the previous pass's (certainly chosen; fewer than k), and
// gathers the entries that match the prefix into a buffer when they are few
// enough. The last block of a pass to finish (arrival counter) finds the
// bucket where the k-th best falls, zeroes the histogram for the next pass
// and publishes the new prefix. Once the entries matching the prefix fit
// shared memory (at most RADIX_SCAP), the next pass only gathers them, and a
// finishing block per row selects the remaining ones exactly in shared
// memory (radix select on CL), adds the kept list and writes the k indices
// ascending (rank counting, or a block radix sort for k > 512). Typical
// rows take two passes over the scores; ties or NaN-heavy rows take more
// (up to ceil((32+ib)/12) + 1), each a multi-block pass.
//
// Blocks take their role from a ticket (atomic counter, in start order):
// npass passes x rows x G blocks, then one finishing block per row. A block
// waits only for blocks with smaller tickets, which have started, so the
// waits cannot deadlock whatever the number of resident blocks.
//
// Workspace: ctrl (zeroed before each launch): ctrl[0] is the ticket, row r
// owns ints [64 + 32r, 64 + 32r + 32) (RADIX_C_*). ghist: rows x 4096 bins,
// zero between launches (each pass's last block clears it). kept: rows x
// RADIX_KMAX indices. cand: rows x 2 x bufcap entries (key << 32 | index),
// two buffers used alternately by consecutive passes. Needs blockDim 1024,
// 0 < k <= RADIX_KMAX for rows with k < n, and bufcap >= RADIX_SCAP.
#define RADIX_THREADS 1024
#define RADIX_BITS 12
#define RADIX_BINS 4096
#define RADIX_SCAP 3072
#define RADIX_KMAX 4096
#define RADIX_DONE (1 << 30)
#define RADIX_CTRL 32
#define RADIX_C_NEXT 0    // next pass whose inputs are published, or RADIX_DONE
#define RADIX_C_NEED 1    // entries still to choose among those matching the prefix
#define RADIX_C_CNT 2     // entries matching the prefix
#define RADIX_C_FINAL 3   // the pass only gathers (count <= RADIX_SCAP)
#define RADIX_C_PRE 4     // prefix (u64, ints 4-5)
#define RADIX_C_KEPT 6    // kept-list cursor
#define RADIX_C_CP 7      // the gathering pass (for the finishing block)
#define RADIX_C_SRCBUF 8  // the previous pass gathered its matches into its buffer
#define RADIX_C_SRCCNT 9  // how many
#define RADIX_C_ARRIVE 12 // per pass (8)
#define RADIX_C_CURSOR 20 // per pass buffer cursor (8)

typedef unsigned long long u64;

__device__ __forceinline__ int radix_shift(int L, int p) { return max(0, L - RADIX_BITS * p); }

__device__ __forceinline__ int ld_acquire(const int* p) {
	int v;
	asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__device__ __forceinline__ u64 global_ns() {
	u64 t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

// Thread 0 waits until *next >= p; every thread gets the value seen. A wait
// of over 20 s means a bug (a pass that never completes): trap, so that the
// launch fails instead of hanging the device.
__device__ __forceinline__ int radix_wait(const int* next, int p, int* s_v) {
	if (threadIdx.x == 0) {
		int v;
		const u64 t0 = global_ns();
		while ((v = ld_acquire(next)) < p) {
			__nanosleep(200);
			if (global_ns() - t0 > 20000000000ull) __trap();
		}
		__threadfence();
		*s_v = v;
	}
	__syncthreads();
	return *s_v;
}

// warp_append: the lanes with pred get consecutive slots of *cursor (one
// atomic per warp); returns the lane's slot (undefined without pred). The
// whole warp calls it.
__device__ __forceinline__ int warp_append(bool pred, int* cursor) {
	const unsigned m = __ballot_sync(0xffffffffu, pred);
	if (m == 0) return 0;
	const int lane = threadIdx.x & 31, leader = __ffs(m) - 1;
	int b = 0;
	if (lane == leader) b = atomicAdd(cursor, __popc(m));
	b = __shfl_sync(0xffffffffu, b, leader);
	return b + __popc(m & ((1u << lane) - 1));
}

struct RadixPass {
	u64 pre, prePrev;
	int ib, sp, sPrev, lo, w, p, bufcap;
	bool hist, wbuf;
	unsigned* shist;
	int* cursor;
	int* keptCur;
	u64* dst;
	int* kept;
};

// radix_item handles one entry of a pass; the whole warp calls it.
__device__ __forceinline__ void radix_item(const RadixPass& P, bool valid, uint32_t key, int idx) {
	const u64 cl = ((u64)key << P.ib) | (uint32_t)idx;
	const u64 top = cl >> P.sp;
	const bool isc = valid && top == P.pre;
	if (P.hist) {
		const unsigned digit = isc ? (unsigned)(cl >> P.lo) & ((1u << P.w) - 1) : 0xffffffffu;
		const unsigned peers = __match_any_sync(0xffffffffu, digit);
		if (isc && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&P.shist[digit], (unsigned)__popc(peers));
	}
	if (P.wbuf) {
		const int pos = warp_append(isc, P.cursor);
		if (isc && pos < P.bufcap) P.dst[pos] = ((u64)key << 32) | (uint32_t)idx;
	}
	if (P.p > 0) {
		const bool isk = valid && top < P.pre && (cl >> P.sPrev) == P.prePrev;
		const int pos = warp_append(isk, P.keptCur);
		if (isk && pos < RADIX_KMAX) P.kept[pos] = idx;
	}
}

typedef cub::BlockRadixSort<unsigned, RADIX_THREADS, 4> RadixSort;
union __align__(16) RadixSmem {
	unsigned hist[RADIX_BINS];
	struct {
		u64 c[RADIX_SCAP];
		unsigned sel[RADIX_KMAX];
	} f;
	typename RadixSort::TempStorage sort;
};

__device__ void radix_pass(RadixSmem& sm, int* scratch, int p, int r, int g, const float* scores, const int* soff,
			   const int* nn, const int* base, const int* kk, const int* ooff, int* out, int* ctrl,
			   unsigned* ghist, int* kept, u64* cand, int G, int ib, int bufcap) {
	__shared__ int s_v, s_d, s_left, s_cnt;
	const int n = nn[r], k = kk[r];
	if (k <= 0) return;
	const int lo_r = (int)((i64)n * g / G), hi_r = (int)((i64)n * (g + 1) / G);
	if (k >= n) {
		if (p == 0) {
			int* o = out + ooff[r];
			const int b = base[r];
			for (int i = lo_r + threadIdx.x; i < hi_r; i += blockDim.x) o[i] = b + i;
		}
		return;
	}
	int* st = ctrl + 64 + r * RADIX_CTRL;
	const int L = 32 + ib;
	u64 pre = 0;
	int need = k, cnt = n, srcCnt = n;
	bool fin = n <= RADIX_SCAP, srcBuf = false;
	if (p > 0) {
		if (radix_wait(st + RADIX_C_NEXT, p, &s_v) == RADIX_DONE) return;  // the row finished before this pass
		pre = __ldcg(reinterpret_cast<const u64*>(st + RADIX_C_PRE));
		need = __ldcg(st + RADIX_C_NEED);
		cnt = __ldcg(st + RADIX_C_CNT);
		fin = __ldcg(st + RADIX_C_FINAL) != 0;
		srcBuf = __ldcg(st + RADIX_C_SRCBUF) != 0;
		srcCnt = __ldcg(st + RADIX_C_SRCCNT);
	}
	RadixPass P;
	P.ib = ib;
	P.p = p;
	P.sp = radix_shift(L, p);
	P.lo = max(0, P.sp - RADIX_BITS);
	P.w = P.sp - P.lo;
	P.sPrev = p > 0 ? radix_shift(L, p - 1) : L;
	P.pre = pre;
	P.prePrev = pre >> (P.sPrev - P.sp);
	fin = fin || P.sp == 0;
	P.hist = !fin;
	P.wbuf = fin || (p > 0 && cnt <= bufcap);
	P.bufcap = bufcap;
	P.shist = sm.hist;
	P.cursor = st + RADIX_C_CURSOR + p;
	P.keptCur = st + RADIX_C_KEPT;
	P.dst = cand + ((i64)r * 2 + (p & 1)) * bufcap;
	P.kept = kept + (i64)r * RADIX_KMAX;
	if (P.hist)
		for (int i = threadIdx.x; i < RADIX_BINS; i += blockDim.x) sm.hist[i] = 0;
	__syncthreads();
	if (!srcBuf) {
		const float* s = scores + soff[r];
		for (i64 i0 = lo_r; i0 < hi_r; i0 += RADIX_THREADS * 16) {
			float x[16];
#pragma unroll
			for (int u = 0; u < 16; u++) {
				const i64 i = i0 + u * RADIX_THREADS + threadIdx.x;
				x[u] = i < hi_r ? s[i] : 0.f;
			}
#pragma unroll
			for (int u = 0; u < 16; u++) {
				const i64 i = i0 + u * RADIX_THREADS + threadIdx.x;
				radix_item(P, i < hi_r, desc_key(x[u]), (int)i);
			}
		}
	} else {
		const u64* src = cand + ((i64)r * 2 + ((p - 1) & 1)) * bufcap;
		const int len = min(srcCnt, bufcap);
		const int lo_b = (int)((i64)len * g / G), hi_b = (int)((i64)len * (g + 1) / G);
		for (int i0 = lo_b; i0 < hi_b; i0 += RADIX_THREADS * 8) {
			u64 x[8];
#pragma unroll
			for (int u = 0; u < 8; u++) {
				const int i = i0 + u * RADIX_THREADS + threadIdx.x;
				x[u] = i < hi_b ? __ldcg(src + i) : 0ull;
			}
#pragma unroll
			for (int u = 0; u < 8; u++) {
				const int i = i0 + u * RADIX_THREADS + threadIdx.x;
				radix_item(P, i < hi_b, (uint32_t)(x[u] >> 32), (int)(uint32_t)x[u]);
			}
		}
	}
	__syncthreads();
	unsigned* gh = ghist + (i64)r * RADIX_BINS;
	if (P.hist) {
		for (int i = threadIdx.x; i < (1 << P.w); i += blockDim.x) {
			const unsigned v = sm.hist[i];
			if (v) atomicAdd(gh + i, v);
		}
	}
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) s_v = atomicAdd(st + RADIX_C_ARRIVE + p, 1) == G - 1;
	__syncthreads();
	if (!s_v) return;
	__threadfence();  // the last block of the pass: every block's histogram and appends are visible
	if (fin) {
		if (threadIdx.x == 0) {
			st[RADIX_C_CP] = p;
			st[RADIX_C_NEED] = need;
			st[RADIX_C_CNT] = cnt;
			*reinterpret_cast<u64*>(st + RADIX_C_PRE) = pre;
			__threadfence();
			atomicExch(st + RADIX_C_NEXT, RADIX_DONE);
		}
		return;
	}
	// The bucket of the need-th best: thread t owns bins 4t..4t+3.
	unsigned c[4];
	int sum = 0;
#pragma unroll
	for (int e = 0; e < 4; e++) {
		c[e] = __ldcg(gh + threadIdx.x * 4 + e);
		sum += (int)c[e];
	}
	if (threadIdx.x == 0) {  // (overwritten below; keeps a broken histogram from leaving garbage)
		s_d = 0;
		s_left = need;
		s_cnt = 0;
	}
	int tot;
	const int excl = block_scan(sum, scratch, &tot);
	if (excl < need && need <= excl + sum) {
		int rem = need - excl, e = 0;
		while (e < 3 && (int)c[e] < rem) {
			rem -= (int)c[e];
			e++;
		}
		s_d = threadIdx.x * 4 + e;
		s_left = rem;
		s_cnt = (int)c[e];
	}
#pragma unroll
	for (int e = 0; e < 4; e++) gh[threadIdx.x * 4 + e] = 0;  // clean for the next pass (and launch)
	__syncthreads();
	if (threadIdx.x == 0) {
		*reinterpret_cast<u64*>(st + RADIX_C_PRE) = (pre << P.w) | (unsigned)s_d;
		st[RADIX_C_NEED] = s_left;
		st[RADIX_C_CNT] = s_cnt;
		st[RADIX_C_FINAL] = s_cnt <= RADIX_SCAP;
		st[RADIX_C_SRCBUF] = P.wbuf;
		st[RADIX_C_SRCCNT] = cnt;
	}
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) atomicExch(st + RADIX_C_NEXT, p + 1);
}

__device__ void radix_finish(RadixSmem& sm, int r, const int* nn, const int* base, const int* kk, const int* ooff,
			     int* out, int* ctrl, const int* kept, const u64* cand, int ib, int bufcap) {
	__shared__ int hist[256];
	__shared__ int s_v, s_d, s_left, s_sel;
	const int n = nn[r], k = kk[r];
	if (k <= 0 || k >= n) return;
	const int* st = ctrl + 64 + r * RADIX_CTRL;
	radix_wait(st + RADIX_C_NEXT, RADIX_DONE, &s_v);
	const int L = 32 + ib;
	const int cp = __ldcg(st + RADIX_C_CP);
	const int need = __ldcg(st + RADIX_C_NEED);
	const u64 pre = __ldcg(reinterpret_cast<const u64*>(st + RADIX_C_PRE));
	const int m = min(__ldcg(st + RADIX_C_CURSOR + cp), RADIX_SCAP);
	const int kc = min(__ldcg(st + RADIX_C_KEPT), RADIX_KMAX);
	const u64* cb = cand + ((i64)r * 2 + (cp & 1)) * bufcap;
	for (int i = threadIdx.x; i < m; i += blockDim.x) {
		const u64 v = __ldcg(cb + i);
		sm.f.c[i] = ((v >> 32) << ib) | (uint32_t)v;
	}
	__syncthreads();
	// The need-th smallest candidate CL, 8 bits at a time below the prefix.
	u64 T = ~0ull;
	if (need < m) {
		u64 tp = pre;
		int left = need;
		for (int hi = radix_shift(L, cp); hi > 0; hi -= 8) {
			const int lo = max(0, hi - 8), w = hi - lo;
			for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
			__syncthreads();
			for (int i0 = 0; i0 < m; i0 += blockDim.x) {
				const int i = i0 + threadIdx.x;
				unsigned d = 256;
				if (i < m) {
					const u64 cl = sm.f.c[i];
					if ((cl >> hi) == tp) d = (unsigned)(cl >> lo) & ((1u << w) - 1);
				}
				const unsigned peers = __match_any_sync(0xffffffffu, d);
				if (d != 256 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[d], __popc(peers));
			}
			__syncthreads();
			find_bucket(hist, left, &s_d, &s_left);
			__syncthreads();
			tp = (tp << w) | (unsigned)s_d;
			left = s_left;
			__syncthreads();
		}
		T = tp;
	}
	// The chosen indices: the kept list, then the candidates <= T.
	const int* kr = kept + (i64)r * RADIX_KMAX;
	for (int i = threadIdx.x; i < kc; i += blockDim.x) sm.f.sel[i] = (unsigned)__ldcg(kr + i);
	if (threadIdx.x == 0) s_sel = kc;
	__syncthreads();
	const u64 imask = (1ull << ib) - 1;
	for (int i = threadIdx.x; i < m; i += blockDim.x) {
		const u64 cl = sm.f.c[i];
		if (cl <= T) {
			const int pos = atomicAdd(&s_sel, 1);
			if (pos < RADIX_KMAX) sm.f.sel[pos] = (unsigned)(cl & imask);
		}
	}
	__syncthreads();
	const int tot = min(s_sel, min(k, RADIX_KMAX));  // == k
	int* o = out + ooff[r];
	const int b = base[r];
	if (tot <= 512) {
		// Rank by counting (indices are distinct); pad to a multiple of 4.
		if (threadIdx.x < 4) sm.f.sel[tot + threadIdx.x] = 0xffffffffu;
		__syncthreads();
		if ((int)threadIdx.x < tot) {
			const unsigned v = sm.f.sel[threadIdx.x];
			int rank = 0;
			const uint4* s4 = reinterpret_cast<const uint4*>(sm.f.sel);
			for (int j = 0; j < (tot + 3) / 4; j++) {
				const uint4 q = s4[j];
				rank += (q.x < v) + (q.y < v) + (q.z < v) + (q.w < v);
			}
			o[rank] = b + (int)v;
		}
		return;
	}
	unsigned items[4];
#pragma unroll
	for (int u = 0; u < 4; u++) {
		const int j = threadIdx.x * 4 + u;
		items[u] = j < tot ? sm.f.sel[j] : 0xffffffffu;
	}
	__syncthreads();  // sel is dead: the sort's storage overlays it
	RadixSort(sm.sort).Sort(items, 0, min(32, ib + 1));
#pragma unroll
	for (int u = 0; u < 4; u++) {
		const int j = threadIdx.x * 4 + u;
		if (j < tot) o[j] = b + (int)items[u];
	}
}

extern "C" __global__ void __launch_bounds__(RADIX_THREADS) quest_topk_radix(
	const float* scores, const int* soff, const int* nn, const int* base, const int* kk, const int* ooff, int* out,
	int* ctrl, unsigned* ghist, int* kept, u64* cand, i64 rows, i64 G, i64 ib, i64 npass, i64 bufcap) {
	__shared__ RadixSmem sm;
	__shared__ int scratch[33];
	__shared__ int s_t;
	if (threadIdx.x == 0) s_t = atomicAdd(ctrl, 1);
	__syncthreads();
	const int t = s_t;
	const int per = (int)rows * (int)G;
	if (t >= (int)npass * per) {
		radix_finish(sm, t - (int)npass * per, nn, base, kk, ooff, out, ctrl, kept, cand, (int)ib, (int)bufcap);
		return;
	}
	const int p = t / per, r = (t % per) / (int)G, g = t % (int)G;
	radix_pass(sm, scratch, p, r, g, scores, soff, nn, base, kk, ooff, out, ctrl, ghist, kept, cand, (int)G, (int)ib,
		   (int)bufcap);
}

// ---------------------------------------------------------------------------
// quest_topk_sample_t{1024,512,256}: exact top-K of long rows in one launch
// and (typically) one read of the scores: sample, then one pass. Ranks by
// the 64-bit composite CL = desc_key(score) << 32 | index, unique per row,
// like quest_topk_radix (score descending, ties to the lower index).
//
// Grid rows x G blocks; block r*G + g owns the scores [n*g/G, n*(g+1)/G)
// of row r.
// Every block of a row computes the same threshold TH from the same
// sample of the row (no hand-over between blocks): groups of 8 consecutive
// scores, one group every 2^(ls+3) (ls the smallest with at most mmax
// sampled scores, at most SAMP_SMAX, held in shared memory), and takes for
// TH the bucket bound of a bisection over the sample's CLs that leaves j
// to jhi sampled entries at or below it, j chosen so that the row's count
// C of entries with CL <= TH is at least k but for a vanishing chance on
// scores in random order (and for every tie pattern: the groups make the
// worst case, equal scores, give C >= 2^(ls+3) * floor((j-1)/8) >= k),
// and about 2^ls * j, a few k at most. The block then reads its share once
// and appends every entry with CL <= TH (key << 32 | index) to the row's
// candidate list (staged in shared memory, one atomic per block; with
// SAMP_F_DIRECT one per warp and item that has one). The last
// block of the row to finish (arrival counter) selects the k best of the
// C candidates exactly: in shared memory when C <= SAMP_SCAP, else first
// narrowing the candidates in global memory to a bucket that fits; it
// writes the k indices ascending and zeroes the row's control words for the
// next launch. Rows where the sample misleads (C < k, or C over the
// buffer: scores laid out with the sample's period) fall back to a
// one-block radix select of the whole row (topk_row) in that last block:
// exact, slow.
//
// Bisections (samp_bisect) split a bucket of CLs by RB bits per step with
// block-wide counts (warp reductions, one barrier per step); no histogram
// and so no atomics on shared memory bins.
//
// ctrl: SAMP_STATS statistics ints for tuning, never reset here ([0]
// fallbacks, [1] finishes through global memory, [2..3] the sum of C as a
// u64, [4] finishes, [6] the largest C), then SAMP_ROW ints per row
// (arrivals, candidate cursor) that must be zero before the first launch;
// every launch leaves them zero. cand: rows x
// bufcap entries. flags: SAMP_F_FALLBACK (tests: every row takes the
// fallback), SAMP_F_NOSMEM (tests: narrow in global memory to buckets of at
// most 64), SAMP_F_DIRECT (append each candidate to the global list as it
// is found, no staging). Rows with 0 < k < n need k <= SAMP_KMAX.
#define SAMP_SCAP 3072
#define SAMP_SMAX 10240
#define SAMP_KMAX 4096
#define SAMP_ROW 2
#define SAMP_STATS 8
#define SAMP_F_FALLBACK 1
#define SAMP_F_NOSMEM 2
#define SAMP_F_DIRECT 4
#define SAMP_BATCH 16
#define SAMP_RBS 2  // bits per bisection step: the sample's
#define SAMP_RBF 3  // the finish's
#define SAMP_NQ 7   // thresholds per step, at most (RB <= 3)

template <int T>
union __align__(16) SampSmem {
	uint32_t samp[SAMP_SMAX];
	struct {
		u64 c[SAMP_SCAP];
		unsigned sel[SAMP_KMAX];
	} f;
	typename cub::BlockRadixSort<unsigned, T, SAMP_KMAX / T>::TempStorage sort;
};

struct SampShared {
	int red[2 * (SAMP_NQ + 4) * 32];  // samp_reduce's, double-buffered
	int last, C, nc, ns, nloc, gbase;
};

// low_mask(b): bits 0..b set (none for b < 0).
__device__ __forceinline__ u64 low_mask(int b) { return b < 0 ? 0ull : (b >= 63 ? ~0ull : (2ull << b) - 1); }

// samp_reduce: block-wide sums of NQ counts and the OR and AND of vo and
// va, with one barrier; par alternates the halves of red so that
// consecutive calls need no second barrier.
template <int T, int NQ>
__device__ __forceinline__ void samp_reduce(int (&c)[NQ], u64& vo, u64& va, int* red, int& par) {
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	int* r = red + par * ((SAMP_NQ + 4) * 32);
#pragma unroll
	for (int q = 0; q < NQ; q++) {
		const int v = __reduce_add_sync(0xffffffffu, c[q]);
		if (lane == 0) r[q * 32 + w] = v;
	}
	const unsigned o0 = __reduce_or_sync(0xffffffffu, (unsigned)vo), o1 = __reduce_or_sync(0xffffffffu, (unsigned)(vo >> 32));
	const unsigned a0 = __reduce_and_sync(0xffffffffu, (unsigned)va), a1 = __reduce_and_sync(0xffffffffu, (unsigned)(va >> 32));
	if (lane == 0) {
		r[(NQ + 0) * 32 + w] = (int)o0;
		r[(NQ + 1) * 32 + w] = (int)o1;
		r[(NQ + 2) * 32 + w] = (int)a0;
		r[(NQ + 3) * 32 + w] = (int)a1;
	}
	__syncthreads();
	const bool in = lane < T / 32;
#pragma unroll
	for (int q = 0; q < NQ; q++) c[q] = __reduce_add_sync(0xffffffffu, in ? r[q * 32 + lane] : 0);
	const unsigned p0 = __reduce_or_sync(0xffffffffu, in ? (unsigned)r[(NQ + 0) * 32 + lane] : 0u);
	const unsigned p1 = __reduce_or_sync(0xffffffffu, in ? (unsigned)r[(NQ + 1) * 32 + lane] : 0u);
	const unsigned b0 = __reduce_and_sync(0xffffffffu, in ? (unsigned)r[(NQ + 2) * 32 + lane] : ~0u);
	const unsigned b1 = __reduce_and_sync(0xffffffffu, in ? (unsigned)r[(NQ + 3) * 32 + lane] : ~0u);
	vo = ((u64)p1 << 32) | p0;
	va = ((u64)b1 << 32) | b0;
	par ^= 1;
}

// A bucket of CLs: those with the bits above b equal to P's (P's bits b..0
// are zero); cu items are <= its top, base of them below it. {0, 63, m,
// 0} holds every one of m items.
struct SampBucket {
	u64 P;
	int b, cu, base;
};

// samp_bisect narrows B to the sub-bucket holding the j-th smallest item
// (1-based), RB bits per step, until cu <= jhi (the items <= the bucket's
// top are j to jhi), cu - base <= cap, or the bucket is a single value.
// Each step counts the items at or below 2^RB - 1 thresholds and, in the
// same barrier, the bits on which the bucket's items differ, so that runs
// of bits the bucket's items share (ties, the zero high bits of indices)
// cost one step. visit(f) calls f(cl) for each of this thread's items.
// Every thread gets the same result.
template <int T, int RB, typename V>
__device__ SampBucket samp_bisect(V visit, SampBucket B, int j, int jhi, int cap, int* red, int& par) {
	constexpr int NQ = (1 << RB) - 1;
	while (B.b >= 0 && B.cu > jhi && B.cu - B.base > cap) {
		const int rb = min(RB, B.b + 1), lo = B.b - rb + 1, nq = (1 << rb) - 1;
		const u64 bm = ~low_mask(B.b), P = B.P;
		u64 t[NQ];
		int c[NQ];
#pragma unroll
		for (int q = 0; q < NQ; q++) {
			t[q] = P | (((u64)(q + 1) << lo) - 1);  // digit <= q (unused past nq)
			c[q] = 0;
		}
		u64 vo = 0, va = ~0ull;
		visit([&](u64 cl) {
#pragma unroll
			for (int q = 0; q < NQ; q++) c[q] += cl <= t[q];
			if ((cl & bm) == P) {
				vo |= cl;
				va &= cl;
			}
		});
		samp_reduce<T, NQ>(c, vo, va, red, par);
		const u64 var = (vo ^ va) & low_mask(B.b);
		const int hv = var ? 63 - __clzll((long long)var) : -1;
		if (hv < lo) {  // the bucket's items share bits b..lo (and down to hv + 1): skip them
			B.P |= va & low_mask(B.b) & ~low_mask(hv);
			B.b = hv;
			continue;
		}
		// The j-th is in the first digit q whose count reaches j (counts
		// grow with q; the top digit nq holds cu).
		int q = 0;
		bool found = false;
#pragma unroll
		for (int e = 0; e < NQ; e++) {
			if (e < nq && !found) {
				if (c[e] < j) {
					q = e + 1;
					B.base = c[e];
				} else {
					B.cu = c[e];
					found = true;
				}
			}
		}
		B.P |= (u64)q << lo;
		B.b = lo - 1;
	}
	return B;
}

// samp_threshold: the row's threshold TH (every block of the row computes
// the same); ~0 (every entry) when the sample cannot narrow it.
template <int T>
__device__ u64 samp_threshold(uint32_t* samp, const float* __restrict__ s, int n, int k, int mmax, SampShared& sh,
			      int& par) {
	mmax = min(max(mmax, 64), SAMP_SMAX);
	int ls = 0;
	while (((((i64)n - 1) >> (ls + 3)) + 1) * 8 > mmax) ls++;
	const int gs = ls + 3;  // a group of 8 every 2^gs
	const int full = n >> gs, rem = n - (full << gs);
	const int m = full * 8 + min(8, rem);
	const float lam = (float)k * (float)m / (float)n;  // expected sampled entries among the k best
	int j = (int)ceilf(lam + 6.f * sqrtf(lam) + 4.f);
	j = max(j, 8 * (int)(((i64)k + (1 << gs) - 1) >> gs) + 1);
	if (j >= m) return ~0ull;
	const int jhi = max(j, min(2 * j, (SAMP_SCAP / 2) >> ls));
	constexpr int CH = 8;
	for (int v0 = 0; v0 < m; v0 += T * CH) {
		float x[CH];
#pragma unroll
		for (int u = 0; u < CH; u++) {
			const int v = v0 + u * T + threadIdx.x;
			x[u] = v < m ? __ldg(s + (((v >> 3) << gs) | (v & 7))) : 0.f;
		}
#pragma unroll
		for (int u = 0; u < CH; u++) {
			const int v = v0 + u * T + threadIdx.x;
			if (v < m) samp[v] = desc_key(x[u]);
		}
	}
	__syncthreads();
	const SampBucket B = samp_bisect<T, SAMP_RBS>(
		[&](auto f) {
			for (int v = threadIdx.x; v < m; v += T)
				f(((u64)samp[v] << 32) | (uint32_t)(((v >> 3) << gs) | (v & 7)));
		},
		SampBucket{0, 63, m, 0}, j, jhi, -1, sh.red, par);
	return B.P | low_mask(B.b);
}

// samp_finish: the last block of a row selects the k best of its C
// candidates cb[0..C) and writes them (b + index, ascending) at o.
template <int T>
__device__ void samp_finish(SampSmem<T>& sm, SampShared& sh, int& par, const float* s, int n, int k, int bo, int* o,
			    int* st, int* stats, const u64* cb, int bufcap, int flags) {
	if (threadIdx.x == 0) {
		const int C = __ldcg(st + 1);
		sh.C = C;
		st[0] = 0;  // the row's control words, zero for the next launch
		st[1] = 0;
		sh.nc = 0;
		sh.ns = 0;
		atomicAdd(stats + 4, 1);
		atomicAdd(reinterpret_cast<unsigned long long*>(stats + 2), (unsigned long long)C);
		atomicMax(stats + 6, C);
	}
	__syncthreads();
	const int C = sh.C;
	if ((flags & SAMP_F_FALLBACK) || C < k || C > bufcap) {
		if (threadIdx.x == 0) atomicAdd(stats + 0, 1);
		topk_row(s, n, k, bo, o);
		return;
	}
	const int cap = (flags & SAMP_F_NOSMEM) ? 64 : SAMP_SCAP;
	SampBucket Bk{0, 63, C, 0};  // every candidate
	if (C > cap) {
		if (threadIdx.x == 0) atomicAdd(stats + 1, 1);
		Bk = samp_bisect<T, SAMP_RBF>(
			[&](auto f) {
				for (int i = threadIdx.x; i < C; i += T) f(__ldcg(cb + i));
			},
			Bk, k, k, cap, sh.red, par);
	}
	// Gather: when the bucket's top is the k-th (exact), every candidate
	// up to it is chosen; else those below the bucket are, and the
	// bucket's (at most cap) go to shared memory for an exact select.
	const bool exact = Bk.cu <= k;
	const u64 top = Bk.P | low_mask(Bk.b), bmask = ~low_mask(Bk.b);
	for (int i0 = 0; i0 < C; i0 += T) {
		const int i = i0 + threadIdx.x;
		const bool valid = i < C;
		const u64 cl = valid ? __ldcg(cb + i) : ~0ull;
		const bool chosen = valid && (exact ? cl <= top : cl < Bk.P);
		const bool inb = valid && !exact && (cl & bmask) == Bk.P;
		const int pc = warp_append(chosen, &sh.ns);
		if (chosen) sm.f.sel[pc] = (uint32_t)cl;
		const int pb = warp_append(inb, &sh.nc);
		if (inb) sm.f.c[pb] = cl;
	}
	__syncthreads();
	const int nc = sh.nc, need = k - sh.ns;
	if (nc > 0) {
		u64 th = ~0ull;
		if (need < nc) {
			const SampBucket E = samp_bisect<T, SAMP_RBF>(
				[&](auto f) {
					for (int i = threadIdx.x; i < nc; i += T) f(sm.f.c[i]);
				},
				SampBucket{0, 63, nc, 0}, need, need, -1, sh.red, par);
			th = E.P | low_mask(E.b);
		}
		for (int i0 = 0; i0 < nc; i0 += T) {
			const int i = i0 + threadIdx.x;
			const bool take = i < nc && sm.f.c[i] <= th;
			const int p = warp_append(take, &sh.ns);
			if (take) sm.f.sel[p] = (uint32_t)sm.f.c[i];
		}
		__syncthreads();
	}
	const int tot = min(sh.ns, min(k, SAMP_KMAX));  // == k
	if (tot <= 512) {
		// Rank by counting (indices are distinct); pad to a multiple of 4.
		if (threadIdx.x < 4) sm.f.sel[tot + threadIdx.x] = 0xffffffffu;
		__syncthreads();
		for (int t0 = threadIdx.x; t0 < tot; t0 += T) {
			const unsigned v = sm.f.sel[t0];
			int rank = 0;
			const uint4* s4 = reinterpret_cast<const uint4*>(sm.f.sel);
			for (int q = 0; q < (tot + 3) / 4; q++) {
				const uint4 w = s4[q];
				rank += (w.x < v) + (w.y < v) + (w.z < v) + (w.w < v);
			}
			o[rank] = bo + (int)v;
		}
		return;
	}
	constexpr int IPT = SAMP_KMAX / T;
	unsigned items[IPT];
#pragma unroll
	for (int u = 0; u < IPT; u++) {
		const int q = threadIdx.x * IPT + u;
		items[u] = q < tot ? sm.f.sel[q] : 0xffffffffu;
	}
	__syncthreads();  // sel is dead: the sort's storage overlays it
	const int ib = 32 - __clz(max(n - 1, 1));
	cub::BlockRadixSort<unsigned, T, IPT>(sm.sort).Sort(items, 0, min(32, ib + 1));
#pragma unroll
	for (int u = 0; u < IPT; u++) {
		const int q = threadIdx.x * IPT + u;
		if (q < tot) o[q] = bo + (int)items[u];
	}
}

template <int T>
__device__ __forceinline__ void topk_sample(const float* __restrict__ scores, const int* soff, const int* nn,
					    const int* base, const int* kk, const int* ooff, int* out, int* ctrl, u64* cand,
					    int G, int bufcap, int mmax, int flags) {
	__shared__ SampSmem<T> sm;
	__shared__ SampShared sh;
	const int r = blockIdx.x / G, g = blockIdx.x % G;
	const int n = nn[r], k = kk[r];
	if (k <= 0) return;
	const int lo_r = (int)((i64)n * g / G), hi_r = (int)((i64)n * (g + 1) / G);
	const int bo = base[r];
	int* o = out + ooff[r];
	if (k >= n) {
		for (int i = lo_r + threadIdx.x; i < hi_r; i += T) o[i] = bo + i;
		return;
	}
	const float* s = scores + soff[r];
	int par = 0;
	if (threadIdx.x == 0) sh.nloc = 0;
	__syncthreads();
	// The first batch of this block's share is in flight during the sample.
	float x[SAMP_BATCH];
#pragma unroll
	for (int u = 0; u < SAMP_BATCH; u++) {
		const int i = lo_r + u * T + threadIdx.x;
		x[u] = i < hi_r ? __ldg(s + i) : 0.f;
	}
	const u64 th = n > SAMP_SCAP ? samp_threshold<T>(sm.samp, s, n, k, mmax, sh, par) : ~0ull;
	const uint32_t tk = (uint32_t)(th >> 32), ti = (uint32_t)th;
	int* st = ctrl + SAMP_STATS + r * SAMP_ROW;
	u64* cb = cand + (i64)r * bufcap;
	const bool direct = flags & SAMP_F_DIRECT;
	for (int i0 = lo_r; i0 < hi_r; i0 += T * SAMP_BATCH) {
		if (i0 != lo_r) {
#pragma unroll
			for (int u = 0; u < SAMP_BATCH; u++) {
				const int i = i0 + u * T + threadIdx.x;
				x[u] = i < hi_r ? __ldg(s + i) : 0.f;
			}
		}
#pragma unroll
		for (int u = 0; u < SAMP_BATCH; u++) {
			const int i = i0 + u * T + threadIdx.x;
			const uint32_t key = desc_key(x[u]);
			const bool isc = i < hi_r && (key < tk || (key == tk && (uint32_t)i <= ti));
			const u64 cl = ((u64)key << 32) | (uint32_t)i;
			if (direct) {
				const int pos = warp_append(isc, st + 1);
				if (isc && pos < bufcap) cb[pos] = cl;
			} else {  // staged in shared memory (the sample's, now free); the overflow goes straight out
				const int pos = warp_append(isc, &sh.nloc);
				if (isc && pos < SAMP_SCAP) sm.f.c[pos] = cl;
				if (isc && pos >= SAMP_SCAP) {
					const int gp = atomicAdd(st + 1, 1);
					if (gp < bufcap) cb[gp] = cl;
				}
			}
		}
	}
	if (!direct) {  // one atomic per block for the staged candidates
		__syncthreads();
		const int nl = min(sh.nloc, SAMP_SCAP);
		if (threadIdx.x == 0 && nl > 0) sh.gbase = atomicAdd(st + 1, nl);
		__syncthreads();
		const int gb = sh.gbase;
		for (int i = threadIdx.x; i < nl; i += T)
			if (gb + i < bufcap) cb[gb + i] = sm.f.c[i];
	}
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) sh.last = atomicAdd(st, 1) == G - 1;
	__syncthreads();
	if (!sh.last) return;
	__threadfence();  // the last block of the row: every block's candidates are visible
	samp_finish<T>(sm, sh, par, s, n, k, bo, o, st, ctrl, cb, bufcap, flags);
}

#define SAMP_KERNEL(TT, MINB)                                                                                       \
	extern "C" __global__ void __launch_bounds__(TT, MINB) quest_topk_sample_t##TT(                                  \
		const float* scores, const int* soff, const int* nn, const int* base, const int* kk, const int* ooff,   \
		int* out, int* ctrl, u64* cand, i64 G, i64 bufcap, i64 mmax, i64 flags) {                               \
		topk_sample<TT>(scores, soff, nn, base, kk, ooff, out, ctrl, cand, (int)G, (int)bufcap, (int)mmax,      \
				(int)flags);                                                                            \
	}
SAMP_KERNEL(1024, 1)
SAMP_KERNEL(512, 2)
SAMP_KERNEL(256, 4)

// ---------------------------------------------------------------------------
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

// reduce: merges the partial states of each row's items (in item order) into
// o [seqs][qh][D] and lse [seqs][qh]. One block per (row, head of the row);
// thread j owns dims j, j+blockDim, ...; every thread computes the item
// weights itself (no shared state).
#define REDUCE_CAP 2048
extern "C" __global__ void quest_reduce(const float* part_o, const float* part_lse, const int* row_item,
					float* o, float* lse, i64 nrows, i64 rows, i64 qh, i64 kvh, i64 D, i64 per_head) {
	__shared__ float wsm[REDUCE_CAP];
	__shared__ float red[32];
	const i64 G = qh / kvh;
	const i64 heads = per_head ? 1 : G;
	const i64 b = blockIdx.x;
	if (b >= nrows * heads) return;
	const i64 rr = b / heads, hh = b % heads;
	const i64 seq = rr / rows, row = rr % rows;
	const i64 h = per_head ? row : row * G + hh;
	const i64 i0 = row_item[rr], i1 = row_item[rr + 1];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	// M = max lse over the row's items (block reduction).
	float M = __int_as_float(0xff800000);
	for (i64 it = i0 + threadIdx.x; it < i1; it += blockDim.x) M = fmaxf(M, part_lse[it * heads + hh]);
	M = warp_max(M);
	if (lane == 0) red[warp] = M;
	__syncthreads();
	M = red[0];
	for (int w = 1; w < nw; w++) M = fmaxf(M, red[w]);
	__syncthreads();
	float* oo = o + (seq * qh + h) * D;
	if (M == __int_as_float(0xff800000)) {
		for (i64 j = threadIdx.x; j < D; j += blockDim.x) oo[j] = 0.f;
		if (threadIdx.x == 0) lse[seq * qh + h] = M;
		return;
	}
	float z = 0.f;
	float x[2] = {0.f, 0.f};  // dims threadIdx.x and threadIdx.x + blockDim.x (D <= 2*blockDim)
	for (i64 base = i0; base < i1; base += REDUCE_CAP) {
		const int cnt = (int)min((i64)REDUCE_CAP, i1 - base);
		for (int k = threadIdx.x; k < cnt; k += blockDim.x) wsm[k] = __expf(part_lse[(base + k) * heads + hh] - M);
		__syncthreads();
		for (int k = 0; k < cnt; k++) z += wsm[k];
#pragma unroll
		for (int c = 0; c < 2; c++) {
			const i64 j = threadIdx.x + c * blockDim.x;
			if (j < D) {
				float a = 0.f;
#pragma unroll 8
				for (int k = 0; k < cnt; k++) a = fmaf(wsm[k], part_o[((base + k) * heads + hh) * D + j], a);
				x[c] += a;
			}
		}
		__syncthreads();
	}
#pragma unroll
	for (int c = 0; c < 2; c++) {
		const i64 j = threadIdx.x + c * blockDim.x;
		if (j < D) oo[j] = x[c] / z;
	}
	if (threadIdx.x == 0) lse[seq * qh + h] = M + __logf(z);
}

// merge: folds (o2, lse2) into (o, lse) for n states of D floats.
extern "C" __global__ void quest_merge(float* o, float* lse, const float* o2, const float* lse2, i64 n, i64 D) {
	const i64 s = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
	const int lane = threadIdx.x & 31;
	if (s >= n) return;
	const float a = lse[s], b = lse2[s];
	const float ninf = __int_as_float(0xff800000);
	if (b == ninf) return;
	float* os = o + s * D;
	const float* o2s = o2 + s * D;
	if (a == ninf) {
		for (i64 j = lane; j < D; j += 32) os[j] = o2s[j];
		__syncwarp();
		if (lane == 0) lse[s] = b;
		return;
	}
	const float m = fmaxf(a, b);
	const float wa = __expf(a - m), wb = __expf(b - m), sum = wa + wb;
	for (i64 j = lane; j < D; j += 32) os[j] = (os[j] * wa + o2s[j] * wb) / sum;
	__syncwarp();
	if (lane == 0) lse[s] = m + __logf(sum);
}

// ---------------------------------------------------------------------------
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

// pick_scores writes, for each top-K row r, the score of every page the
// row chose: out_scores[j] = scores[soff[r] + out[j] - base[r]] for j in
// [ooff[r], ooff[r] + min(k[r], n[r])). Grid: rows; threads over j.
extern "C" __global__ void quest_pick_scores(const float* scores, const int* soff, const int* nn, const int* base,
					     const int* kk, const int* ooff, const int* out, float* out_scores) {
	const int r = blockIdx.x;
	const int m = min(kk[r], nn[r]), oo = ooff[r];
	for (int j = threadIdx.x; j < m; j += blockDim.x) out_scores[oo + j] = scores[(i64)soff[r] + out[oo + j] - base[r]];
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

// ---------------------------------------------------------------------------
// Typed entry points.
#define INSTANTIATE(SUF, T)                                                                                      \
	extern "C" __global__ void quest_convert_##SUF(const float* src, T* dst, i64 n) { convert<T>(src, dst, n); } \
	extern "C" __global__ void quest_fill_##SUF(T* dst, i64 n, i64 seed) { fill_random<T>(dst, n, seed); }        \
	extern "C" __global__ void quest_summarize_##SUF(const T* K, T* sum, i64 kvh, i64 D, i64 S, i64 valid) {      \
		summarize<T>(K, sum, nullptr, kvh, D, S, valid);                                                 \
	}                                                                                                        \
	extern "C" __global__ void quest_rescan_##SUF(const T* K, T* sum, const int* list, i64 kvh, i64 D, i64 S,  \
						      i64 valid) {                                                   \
		summarize<T>(K, sum, list, kvh, D, S, valid);                                                    \
	}                                                                                                        \
	extern "C" __global__ void quest_append_##SUF(T* K, T* V, T* sum, const int* pt, const float* k,              \
						      const float* v, i64 pos0, i64 n, i64 kvh, i64 D, i64 S) {      \
		append<T>(K, V, sum, pt, k, v, pos0, n, kvh, D, S);                                              \
	}                                                                                                        \
	extern "C" __global__ void quest_score_##SUF(const T* sum, const int* indptr, const int* pages,             \
						     const float* q, float* out, i64 qh, i64 kvh, i64 D,              \
						     i64 per_head, i64 chunk) {                                       \
		score<T>(sum, indptr, pages, q, out, qh, kvh, D, per_head, chunk);                               \
	}                                                                                                        \
	extern "C" __global__ void __launch_bounds__(1024) quest_attend_##SUF(                                      \
	    const T* K, const T* V, const int* indptr, const int* pages, const int* last_len, const float* q,      \
	    const int* item_seq, const int* item_row, const int* item_lo, const int* item_hi, const int* lists,    \
	    float* part_o, float* part_lse, i64 qh, i64 kvh, i64 D, i64 S, i64 per_head) {                         \
		attend<T>(K, V, indptr, pages, last_len, q, item_seq, item_row, item_lo, item_hi, lists, part_o,  \
			  part_lse, qh, kvh, D, S, per_head);                                                     \
	}

INSTANTIATE(f32, float)
INSTANTIATE(f16, __half)
INSTANTIATE(bf16, __nv_bfloat16)

// ---------------------------------------------------------------------------
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

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
	const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }

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
		asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
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

#define FAST(SUF, T)                                                                                               \
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

FAST(f32, float)
FAST(f16, __half)
FAST(bf16, __nv_bfloat16)

// ---------------------------------------------------------------------------
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
		asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
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

#define FAST2(SUF, T)                                                                                              \
	extern "C" __global__ void quest_score128g4_##SUF(const T* s, const int* a, const int* b, const float* q,     \
							 float* o, i64 qh, i64 kvh, i64 ph, i64 c) {           \
		score_d128_g4<T, 2>(s, a, b, q, o, qh, kvh, ph, c);                                                \
	}                                                                                                          \
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

FAST2(f16, __half)
FAST2(bf16, __nv_bfloat16)

// ---------------------------------------------------------------------------
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
