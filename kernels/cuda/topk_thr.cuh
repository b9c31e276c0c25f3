// Threshold top-K (quest.cu): one block per row, from tile maxima.
#pragma once

#include "topk.cuh"

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
	// Each warp reduces the warps' values with shuffles (one shared load a
	// lane instead of a serial chain of nw).
	mn = red[lane < nw ? lane : 0];
	mx = red[32 + (lane < nw ? lane : 0)];
#pragma unroll
	for (int x = 16; x > 0; x >>= 1) {
		mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, x));
		mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, x));
	}
}

// nanmax is max that propagates NaN (fmaxf drops it).
__device__ __forceinline__ float nanmax(float a, float b) { return (a != a || a > b) ? a : b; }

#define THR_TILES 8192
#define THR_BINS 2048
#define THR_CAND 4096
// topk_thr is quest_topk_thr's body. With PROF, thread 0 writes the SM
// clock at each phase's end to prof[16*r + 0..8] and the row's qualifying
// tiles, candidates and ties at the cut to prof[16*r + 10..12]
// (quest_topk_thr_prof, for BenchmarkTopKThrPhases only).
#define THR_MARK(i) do { if (PROF && threadIdx.x == 0) prof[16 * r + (i)] = clock64(); } while (0)
#define THR_NOTE(i, val) do { if (PROF && threadIdx.x == 0) prof[16 * r + (i)] = (val); } while (0)
template <bool PROF>
__device__ __forceinline__ void topk_thr(const float* scores, const float* tmax, const int* soff, const int* nn,
					 const int* base, const int* kk, const int* ooff, int* out, long long* prof) {
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
	THR_MARK(0);
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
	THR_MARK(1);
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
		tau = red[lane < nw ? lane : 0];
#pragma unroll
		for (int x = 16; x > 0; x >>= 1) tau = fminf(tau, __shfl_xor_sync(0xffffffffu, tau, x));
	}
	THR_MARK(2);
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
	THR_MARK(3);
	THR_NOTE(10, nq);
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
	THR_MARK(4);
	THR_NOTE(11, m);
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
	THR_MARK(5);
	THR_NOTE(12, cnt2);
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
	THR_MARK(6);
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
	THR_MARK(7);
}
#undef THR_MARK
#undef THR_NOTE

extern "C" __global__ void __launch_bounds__(1024) quest_topk_thr(const float* scores, const float* tmax, const int* soff, const int* nn,
					  const int* base, const int* kk, const int* ooff, int* out) {
	topk_thr<false>(scores, tmax, soff, nn, base, kk, ooff, out, nullptr);
}

extern "C" __global__ void __launch_bounds__(1024) quest_topk_thr_prof(const float* scores, const float* tmax, const int* soff, const int* nn,
					       const int* base, const int* kk, const int* ooff, int* out, long long* prof) {
	topk_thr<true>(scores, tmax, soff, nn, base, kk, ooff, out, prof);
}
