// Prefill kernels of the device executor (model/gpu): the projections of a
// chunk of prompt tokens as a tensor-core GEMM, and the causal attention of
// the chunk's queries over every page of its sequence (FlashAttention-2's
// schedule on mma.sync). Activations are float32 row-major [rows][width],
// weights bf16 [out][in]; counts are i64 parameters.
//
//   prefill_tobf16_<W>    a[r] = bf16(x[r]) or bf16(RMSNorm(x[r]) * nw)  (one row per block)
//   prefill_gemm_bf16_m<BM>n<BN>w<WM>x<WN>s<S>  y = a w^T (+ res), outputs split into up to 3 tensors
//   prefill_attend_<T>_d<D>_m<MT>n<BN>w<W>  o = causal attention of q over the sequence's pages through its page table
//   prefill_attend_fp8_d<D>_m<MT>n<BN>w<W>  the same over fp8 pages (kvfp8.cuh's records), on bf16 tensor cores

#include "common.cuh"
#include "fp8.cuh"
#include "cpasync.cuh"
#include "mma.cuh"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* smem) {
	unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t* r, const void* smem) {
	unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(s));
}

// ---------------------------------------------------------------------
// Rows to bf16, optionally through RMSNorm: grid (rows), block 256.

template <typename W>
__device__ void tobf16(bf16* out, const float* x, const W* nw, i64 k, float eps) {
	__shared__ float part[32];
	__shared__ float scale;
	const float* xr = x + (i64)blockIdx.x * k;
	bf16* yr = out + (i64)blockIdx.x * k;
	float r = 1.f;
	if (nw != nullptr) {
		float ss = 0.f;
		for (i64 i = threadIdx.x; i < k; i += blockDim.x) ss += xr[i] * xr[i];
		ss = warp_sum(ss);
		int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
		if (lane == 0) part[warp] = ss;
		__syncthreads();
		if (warp == 0) {
			float s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.f;
			s = warp_sum(s);
			if (lane == 0) scale = rsqrtf(s / (float)k + eps);
		}
		__syncthreads();
		r = scale;
	}
	for (i64 i = threadIdx.x; i < k; i += blockDim.x) {
		float v = xr[i] * r;
		if (nw != nullptr) v *= to_f(nw[i]);
		yr[i] = __float2bfloat16_rn(v);
	}
}

extern "C" __global__ void prefill_tobf16_bf16(bf16* out, const float* x, const bf16* nw, i64 k, float eps) {
	tobf16<bf16>(out, x, nw, k, eps);
}

// ---------------------------------------------------------------------
// GEMM y[M][N] = a[M][K] w[N][K]^T on the tensor cores (bf16 in, fp32
// accumulation): block tile BM x BN, k step 32, warps of WM x WN, a
// STAGES-deep cp.async pipeline; K a multiple of 8 with 16-byte aligned
// rows. Grid (ceil(M/BM), ceil(N/BN)): blocks next to each other share a
// tile of w (read from memory once, from L2 after). Column c of y goes to
// y0 (c < w0), y1 (c < w0 + w1) or y2, each [M][its width]; res (one
// output only) is added, and may be y0 itself.

#define GEMM_BK 32
#define GEMM_LD 40 // GEMM_BK + 8 bf16: rows 80 bytes apart, ldmatrix without bank conflicts

template <int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void gemm(float* y0, float* y1, float* y2, const float* res, const bf16* a, const bf16* w, i64 M,
				     i64 N, i64 K, i64 w0, i64 w1) {
	constexpr int WARPS_N = BN / WN, THREADS = (BM / WM) * (BN / WN) * 32;
	constexpr int MI = WM / 16, NI = WN / 8;
	extern __shared__ uint4 gemm_smem[];
	bf16* As = reinterpret_cast<bf16*>(gemm_smem);
	bf16* Bs = As + STAGES * BM * GEMM_LD;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int wm = warp / WARPS_N, wn = warp % WARPS_N;
	const i64 bm = (i64)blockIdx.x * BM, bn = (i64)blockIdx.y * BN;
	const int kt_n = (int)((K + GEMM_BK - 1) / GEMM_BK);

	auto load = [&](int stage, int kt) {
		const i64 k0 = (i64)kt * GEMM_BK;
#pragma unroll
		for (int c = tid; c < BM * 4; c += THREADS) {
			int row = c >> 2, kc = (c & 3) * 8;
			i64 gr = bm + row, gk = k0 + kc;
			bool ok = gr < M && gk < K;
			cp_async16(As + (stage * BM + row) * GEMM_LD + kc, ok ? a + gr * K + gk : a, ok ? 16 : 0);
		}
#pragma unroll
		for (int c = tid; c < BN * 4; c += THREADS) {
			int row = c >> 2, kc = (c & 3) * 8;
			i64 gn = bn + row, gk = k0 + kc;
			bool ok = gn < N && gk < K;
			cp_async16(Bs + (stage * BN + row) * GEMM_LD + kc, ok ? w + gn * K + gk : w, ok ? 16 : 0);
		}
	};

	float acc[MI][NI][4];
#pragma unroll
	for (int i = 0; i < MI; i++)
#pragma unroll
		for (int j = 0; j < NI; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

#pragma unroll
	for (int s = 0; s < STAGES - 1; s++) {
		if (s < kt_n) load(s, s);
		cp_async_commit();
	}
	for (int kt = 0; kt < kt_n; kt++) {
		cp_async_wait<STAGES - 2>();
		__syncthreads();
		int nk = kt + STAGES - 1;
		if (nk < kt_n) load(nk % STAGES, nk);
		cp_async_commit();
		const int st = kt % STAGES;
		const bf16* as = As + st * BM * GEMM_LD;
		const bf16* bs = Bs + st * BN * GEMM_LD;
#pragma unroll
		for (int kk = 0; kk < GEMM_BK / 16; kk++) {
			uint32_t af[MI][4], bfr[NI][2];
#pragma unroll
			for (int mi = 0; mi < MI; mi++)
				ldsm_x4(af[mi], as + (wm * WM + mi * 16 + (lane & 15)) * GEMM_LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
			for (int n2 = 0; n2 < NI / 2; n2++) {
				uint32_t r[4];
				ldsm_x4(r, bs + (wn * WN + n2 * 16 + (lane & 7) + (lane >> 4) * 8) * GEMM_LD + kk * 16 + ((lane >> 3) & 1) * 8);
				bfr[2 * n2][0] = r[0];
				bfr[2 * n2][1] = r[1];
				bfr[2 * n2 + 1][0] = r[2];
				bfr[2 * n2 + 1][1] = r[3];
			}
#pragma unroll
			for (int mi = 0; mi < MI; mi++)
#pragma unroll
				for (int ni = 0; ni < NI; ni++)
					mma<bf16>(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bfr[ni][0], bfr[ni][1]);
		}
	}
	cp_async_wait<0>();

	const i64 w01 = w0 + w1;
#pragma unroll
	for (int mi = 0; mi < MI; mi++)
#pragma unroll
		for (int ni = 0; ni < NI; ni++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				i64 row = bm + wm * WM + mi * 16 + (lane >> 2) + (e >> 1) * 8;
				i64 col = bn + wn * WN + ni * 8 + (lane & 3) * 2 + (e & 1);
				if (row >= M || col >= N) continue;
				float v = acc[mi][ni][e];
				if (col < w0) {
					i64 at = row * w0 + col;
					if (res != nullptr) v += res[at];
					y0[at] = v;
				} else if (col < w01) {
					y1[row * w1 + (col - w0)] = v;
				} else {
					y2[row * (N - w01) + (col - w01)] = v;
				}
			}
}

// prefill_gemm_bf16_m<BM>n<BN>w<WM>x<WN>s<STAGES>; dynamic shared memory
// STAGES * (BM + BN) * 80 bytes.
#define PREFILL_GEMM(BM, BN, WM, WN, ST)                                                                                      \
	extern "C" __global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)                                               \
	    prefill_gemm_bf16_m##BM##n##BN##w##WM##x##WN##s##ST(float* y0, float* y1, float* y2, const float* res, const bf16* a, \
								  const bf16* w, i64 M, i64 N, i64 K, i64 w0, i64 w1) {         \
		gemm<BM, BN, WM, WN, ST>(y0, y1, y2, res, a, w, M, N, K, w0, w1);                                             \
	}
PREFILL_GEMM(128, 128, 64, 64, 4)

// ---------------------------------------------------------------------
// Causal attention of a prefill chunk. The chunk's n tokens sit at
// positions start .. start+n-1 of a sequence whose K/V pages (pool layout
// [page][kvh][S][D], type T) are listed in pages (the sequence's page
// table); token i attends to positions 0 .. start+i. q and o are float32
// [n][qh][D]. Grid (ceil(n / (16 MT W / G)), kvh), W warps: a block
// serves the G = qh / kvh query heads of one KV head for 16 MT W / G
// consecutive tokens (rows past a whole number of tokens stay idle), so
// that each K/V tile is loaded once for the whole group; MT m tiles of 16
// rows a warp, so that every K and V fragment loaded from shared memory
// feeds MT mma (q fragments are loaded from shared memory per k step);
// K/V tiles of BN positions, double-buffered with cp.async, gathered page
// by page through the table (shift is log2(S) when S is a power of two,
// else -1). FlashAttention-2's schedule: the scores are scaled by
// log2(e) / sqrt(D) (folded into q), exponentiated with ex2 (mma.cuh), the
// running maximum and sum kept per row; positions past the diagonal, and
// rows past the chunk, are -inf.
//
// KV8: the pages are fp8 records (plan.FP8: E4M3fn codes [page][kvh][S][D]
// with a float32 scale per (page, KV head) in ks and vs, kvfp8.cuh). Each
// element is decoded as the CPU store decodes it (code value times scale,
// rounded to float32) and rounded to T (bf16) in shared memory: the codes
// and each position's two scales are copied with cp.async into staging
// buffers of their own (double-buffered like the 16-bit tiles, so the next
// tile's copies fly during the current tile's products), and the block
// converts the current tile into the T tiles before its products.
template <typename T, int D, int MT, int BN, int W, bool KV8>
__device__ void prefill_attend_m(float* o, const float* q, const void* Kp, const void* Vp, const float* ks, const float* vs,
				 const int* pages, i64 start, i64 n, i64 qh, i64 kvh, i64 S, i64 shift) {
	const T* K = reinterpret_cast<const T*>(Kp);
	const T* V = reinterpret_cast<const T*>(Vp);
	const unsigned char* K8 = reinterpret_cast<const unsigned char*>(Kp);
	const unsigned char* V8 = reinterpret_cast<const unsigned char*>(Vp);
	constexpr int BM = 16 * MT * W;
	constexpr int DP = D + 8;
	constexpr int KS = D / 16;
	constexpr int DT = D / 8;
	extern __shared__ uint4 attend_smem[];
	T* Qs = reinterpret_cast<T*>(attend_smem);
	T* Ks = Qs + BM * DP;	     // [2][BN][DP]
	T* Vs = Ks + 2 * BN * DP; // [2][BN][DP]
	// KV8 staging: codes [2][BN][D] of K, then of V; scales [2][2][BN]
	// (buffer, K or V, position).
	unsigned char* K8s = reinterpret_cast<unsigned char*>(Vs + 2 * BN * DP);
	unsigned char* V8s = K8s + 2 * BN * D;
	float* Scs = reinterpret_cast<float*>(V8s + 2 * BN * D);

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int G = (int)(qh / kvh);
	const int tok = BM / G;
	const i64 t0 = (i64)blockIdx.x * tok;
	const i64 h = blockIdx.y;
	const float qscale = rsqrtf((float)D) * 1.4426950408889634f;

	for (int c = tid; c < BM * (D / 4); c += blockDim.x) {
		int r = c / (D / 4), d = (c % (D / 4)) * 4;
		i64 t = t0 + r / G;
		float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
		if (r < tok * G && t < n) v = *reinterpret_cast<const float4*>(q + (t * qh + h * G + r % G) * D + d);
		uint32_t* dst = reinterpret_cast<uint32_t*>(Qs + r * DP + d);
		dst[0] = pack2<T>::from(v.x * qscale, v.y * qscale);
		dst[1] = pack2<T>::from(v.z * qscale, v.w * qscale);
	}

	const i64 t_last = min(n, t0 + tok) - 1;
	const i64 kv_end = start + t_last + 1;
	const int tiles = (int)((kv_end + BN - 1) / BN);
	const i64 hs = h * S;
	const int s32 = (int)S, sh = (int)shift;

	// load8 is load for fp8 pages: the tile's codes (16 a copy) and, with
	// each position's first chunk, its record's two scales, into the
	// staging buffers (zeros past kv_end).
	auto load8 = [&](int buf, int tile) {
		const int p0 = tile * BN;
		for (int c = tid; c < BN * (D / 16); c += blockDim.x) {
			int j = c / (D / 16), d = (c % (D / 16)) * 16;
			const int pos = p0 + j;
			const bool ok = pos < kv_end;
			i64 off = 0, rec = 0;
			if (ok) {
				const int pg = sh >= 0 ? pos >> sh : pos / s32;
				rec = (i64)pages[pg] * kvh + h;
				off = (rec * S + (pos - pg * s32)) * D + d;
			}
			cp_async16(K8s + (buf * BN + j) * D + d, K8 + off, ok ? 16 : 0);
			cp_async16(V8s + (buf * BN + j) * D + d, V8 + off, ok ? 16 : 0);
			if (d == 0) {
				cp_async4(Scs + (buf * 2) * BN + j, ks + rec, ok ? 4 : 0);
				cp_async4(Scs + (buf * 2 + 1) * BN + j, vs + rec, ok ? 4 : 0);
			}
		}
	};
	// convert8 decodes the staged tile buf into the T tiles: each element
	// as the CPU decodes it, rounded to T.
	auto convert8 = [&](int buf) {
		for (int c = tid; c < BN * (D / 8); c += blockDim.x) {
			int j = c / (D / 8), d = (c % (D / 8)) * 8;
			const uint2 kc = *reinterpret_cast<const uint2*>(K8s + (buf * BN + j) * D + d);
			const uint2 vc = *reinterpret_cast<const uint2*>(V8s + (buf * BN + j) * D + d);
			const float ksc = Scs[(buf * 2) * BN + j], vsc = Scs[(buf * 2 + 1) * BN + j];
			uint32_t* kd = reinterpret_cast<uint32_t*>(Ks + (buf * BN + j) * DP + d);
			uint32_t* vd = reinterpret_cast<uint32_t*>(Vs + (buf * BN + j) * DP + d);
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const uint32_t kw = e < 2 ? kc.x : kc.y, vw = e < 2 ? vc.x : vc.y;
				const int sh8 = 16 * (e & 1);
				kd[e] = pack2<T>::from(__fmul_rn(fp8_value((kw >> sh8) & 0xffu), ksc), __fmul_rn(fp8_value((kw >> (sh8 + 8)) & 0xffu), ksc));
				vd[e] = pack2<T>::from(__fmul_rn(fp8_value((vw >> sh8) & 0xffu), vsc), __fmul_rn(fp8_value((vw >> (sh8 + 8)) & 0xffu), vsc));
			}
		}
	};
	auto load = [&](int buf, int tile) {
		if (KV8) {
			load8(buf, tile);
			return;
		}
		const int p0 = tile * BN;
		for (int c = tid; c < BN * (D / 8); c += blockDim.x) {
			int j = c / (D / 8), d = (c % (D / 8)) * 8;
			const int pos = p0 + j;
			bool ok = pos < kv_end;
			i64 off = 0;
			if (ok) {
				const int pg = sh >= 0 ? pos >> sh : pos / s32;
				off = (((i64)pages[pg] * kvh) * S + hs + (pos - pg * s32)) * D + d;
			}
			cp_async16(Ks + (buf * BN + j) * DP + d, K + off, ok ? 16 : 0);
			cp_async16(Vs + (buf * BN + j) * DP + d, V + off, ok ? 16 : 0);
		}
	};
	load(0, 0);
	cp_async_commit();
	__syncthreads();

	int qpos[MT][2]; // positions fit an int
	bool live[MT][2];
	bool all_live = true;
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < 2; i++) {
			int r = warp * 16 * MT + mt * 16 + (lane >> 2) + i * 8;
			i64 t = t0 + r / G;
			live[mt][i] = r < tok * G && t < n;
			qpos[mt][i] = live[mt][i] ? (int)(start + t) : -1;
			all_live = all_live && live[mt][i];
		}
	const int qmin = (int)(start + t0);

	float oacc[MT][DT][4];
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < DT; i++)
#pragma unroll
			for (int e = 0; e < 4; e++) oacc[mt][i][e] = 0.f;
	float m[MT][2], l[MT][2];
#pragma unroll
	for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

	for (int tile = 0; tile < tiles; tile++) {
		if (tile + 1 < tiles) load((tile + 1) & 1, tile + 1);
		cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();
		if (KV8) {
			convert8(tile & 1);
			__syncthreads();
		}
		const T* ks = Ks + (tile & 1) * BN * DP;
		const T* vs = Vs + (tile & 1) * BN * DP;

		float s[MT][BN / 8][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int i = 0; i < BN / 8; i++)
#pragma unroll
				for (int e = 0; e < 4; e++) s[mt][i][e] = 0.f;
#pragma unroll
		for (int kk = 0; kk < KS; kk++) {
			uint32_t qf[MT][4];
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
				ldsm_x4(qf[mt], Qs + (warp * 16 * MT + mt * 16 + (lane & 15)) * DP + kk * 16 + (lane >> 4) * 8);
#pragma unroll
			for (int n2 = 0; n2 < BN / 16; n2++) {
				uint32_t r[4];
				ldsm_x4(r, ks + (n2 * 16 + (lane & 7) + (lane >> 4) * 8) * DP + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					mma<T>(s[mt][2 * n2], qf[mt][0], qf[mt][1], qf[mt][2], qf[mt][3], r[0], r[1]);
					mma<T>(s[mt][2 * n2 + 1], qf[mt][0], qf[mt][1], qf[mt][2], qf[mt][3], r[2], r[3]);
				}
			}
		}
		const int p0 = tile * BN;
		if (p0 + BN - 1 > qmin || !all_live) {
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int i = 0; i < BN / 8; i++)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						int pos = p0 + i * 8 + (lane & 3) * 2 + (e & 1);
						if (pos > qpos[mt][e >> 1]) s[mt][i][e] = -INFINITY;
					}
		}
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			float scale_old[2];
#pragma unroll
			for (int r = 0; r < 2; r++) {
				float mx = -INFINITY;
#pragma unroll
				for (int i = 0; i < BN / 8; i++) mx = fmaxf(mx, fmaxf(s[mt][i][2 * r], s[mt][i][2 * r + 1]));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
				float mn = fmaxf(m[mt][r], mx);
				float base = mn == -INFINITY ? 0.f : mn;
				scale_old[r] = ex2(m[mt][r] - base);
				m[mt][r] = mn;
				float sum = 0.f;
#pragma unroll
				for (int i = 0; i < BN / 8; i++) {
					s[mt][i][2 * r] = ex2(s[mt][i][2 * r] - base);
					s[mt][i][2 * r + 1] = ex2(s[mt][i][2 * r + 1] - base);
					sum += s[mt][i][2 * r] + s[mt][i][2 * r + 1];
				}
				sum += __shfl_xor_sync(0xffffffffu, sum, 1);
				sum += __shfl_xor_sync(0xffffffffu, sum, 2);
				l[mt][r] = l[mt][r] * scale_old[r] + sum;
			}
#pragma unroll
			for (int i = 0; i < DT; i++) {
				oacc[mt][i][0] *= scale_old[0];
				oacc[mt][i][1] *= scale_old[0];
				oacc[mt][i][2] *= scale_old[1];
				oacc[mt][i][3] *= scale_old[1];
			}
		}
#pragma unroll
		for (int kk = 0; kk < BN / 16; kk++) {
			uint32_t a[MT][4];
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				a[mt][0] = pack2<T>::from(s[mt][2 * kk][0], s[mt][2 * kk][1]);
				a[mt][1] = pack2<T>::from(s[mt][2 * kk][2], s[mt][2 * kk][3]);
				a[mt][2] = pack2<T>::from(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
				a[mt][3] = pack2<T>::from(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
			}
#pragma unroll
			for (int d2 = 0; d2 < D / 16; d2++) {
				uint32_t r[4];
				ldsm_x4_t(r, vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + d2 * 16 + (lane >> 4) * 8);
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					mma<T>(oacc[mt][2 * d2], a[mt][0], a[mt][1], a[mt][2], a[mt][3], r[0], r[1]);
					mma<T>(oacc[mt][2 * d2 + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], r[2], r[3]);
				}
			}
		}
		__syncthreads();
	}
	cp_async_wait<0>();

#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int r = 0; r < 2; r++) {
			if (!live[mt][r]) continue;
			int row = warp * 16 * MT + mt * 16 + (lane >> 2) + r * 8;
			i64 t = t0 + row / G;
			float inv = l[mt][r] > 0.f ? 1.f / l[mt][r] : 0.f;
			float* dst = o + (t * qh + h * G + row % G) * D;
#pragma unroll
			for (int i = 0; i < DT; i++) {
				int d = i * 8 + (lane & 3) * 2;
				*reinterpret_cast<float2*>(dst + d) = make_float2(oacc[mt][i][2 * r] * inv, oacc[mt][i][2 * r + 1] * inv);
			}
		}
}

// ks and vs are the fp8 variants' scales (null for 16-bit pages).
#define PREFILL_ATTEND_M(T, SUF, D, MT, BN, W, KV8)                                                                                \
	extern "C" __global__ void __launch_bounds__(32 * W) prefill_attend_##SUF##_d##D##_m##MT##n##BN##w##W(                    \
	    float* o, const float* q, const void* K, const void* V, const float* ks, const float* vs, const int* pages, i64 start,   \
	    i64 n, i64 qh, i64 kvh, i64 S, i64 shift) {                                                                                 \
		prefill_attend_m<T, D, MT, BN, W, KV8>(o, q, K, V, ks, vs, pages, start, n, qh, kvh, S, shift);                  \
	}
PREFILL_ATTEND_M(__nv_bfloat16, bf16, 32, 2, 64, 4, false)
PREFILL_ATTEND_M(__nv_bfloat16, bf16, 64, 2, 64, 4, false)
PREFILL_ATTEND_M(__half, f16, 32, 2, 64, 4, false)
PREFILL_ATTEND_M(__half, f16, 64, 2, 64, 4, false)
PREFILL_ATTEND_M(__half, f16, 128, 2, 32, 4, false)

PREFILL_ATTEND_M(__nv_bfloat16, bf16, 128, 2, 64, 8, false)

PREFILL_ATTEND_M(__nv_bfloat16, fp8, 32, 2, 64, 4, true)
PREFILL_ATTEND_M(__nv_bfloat16, fp8, 64, 2, 64, 4, true)
PREFILL_ATTEND_M(__nv_bfloat16, fp8, 128, 2, 64, 8, true)

