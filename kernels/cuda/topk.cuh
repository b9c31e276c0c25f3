// Top-K page selection, one block per row (quest.cu): the radix select
// every top-K falls back to (topk_row), the two-stage top-K for long rows,
// and the pick of the chosen pages' scores (Rank). The threshold, radix
// and sample top-Ks for long rows are in topk_thr.cuh, topk_radix.cuh and
// topk_sample.cuh.
#pragma once

#include "common.cuh"

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

// pick_scores writes, for each top-K row r, the score of every page the
// row chose: out_scores[j] = scores[soff[r] + out[j] - base[r]] for j in
// [ooff[r], ooff[r] + min(k[r], n[r])). Grid: rows; threads over j.
extern "C" __global__ void quest_pick_scores(const float* scores, const int* soff, const int* nn, const int* base,
					     const int* kk, const int* ooff, const int* out, float* out_scores) {
	const int r = blockIdx.x;
	const int m = min(kk[r], nn[r]), oo = ooff[r];
	for (int j = threadIdx.x; j < m; j += blockDim.x) out_scores[oo + j] = scores[(i64)soff[r] + out[oo + j] - base[r]];
}
