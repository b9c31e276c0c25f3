// Sample-then-one-pass top-K for long rows (quest.cu); shares u64 and
// warp_append with topk_radix.cuh.
#pragma once

#include <cub/block/block_radix_sort.cuh>

#include "topk_radix.cuh"

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
