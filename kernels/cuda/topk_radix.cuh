// Multi-block radix top-K for long rows (quest.cu).
#pragma once

#include <cub/block/block_radix_sort.cuh>

#include "topk.cuh"

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
