// Model kernels: what a Llama-family decoder runs besides attention, for
// the device executor (model/gpu). Activations are float32 row-major
// [rows][width]; weights are float32 or bf16 ([out][in], as checkpoints
// store them). Counts are i64 parameters.
//
//   model_embed_<W>     out[r] = table[ids[r]]
//   model_rmsnorm_<W>   out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w
//   model_gemv_<W>_r<R>_t<T>_u<U>_n<NA>  y[r] = W x[r] (+ res[r]), r < rows <= R (1, 4, 8, 16), outputs split into up to 3 tensors
//   model_gemv..._norm  the same of RMSNorm(x[r]) * nw (the norm fused: x read once, never stored normalised)
//   model_rope          rotate-half RoPE with per-row cos/sin, of q and k in one launch
//   model_silu_mul      g = silu(g) * u
//   model_argmax        out[r] = the first index of the largest logit
//   model_sample        out[r] = kernels.SampleRow(logits[r], params[r]) (temperature, top-p, the caller's uniform draw), greedy[r] its argmax
//   model_fill_<W>      dst[i] = offset + scale * uniform[-1, 1) (random weights)

#include "common.cuh"
#include "mma.cuh"

// Embedding rows: grid (rows), block 256.
template <typename W>
__device__ void embed(float* out, const W* table, const int* ids, i64 h) {
	const W* src = table + (i64)ids[blockIdx.x] * h;
	float* dst = out + (i64)blockIdx.x * h;
	for (i64 i = threadIdx.x; i < h; i += blockDim.x) dst[i] = to_f(src[i]);
}

// RMSNorm of one row per block (block 256): the mean of squares in float,
// as the CPU executor's float64 sum rounded once.
template <typename W>
__device__ void rmsnorm(float* out, const float* x, const W* w, i64 h, float eps) {
	__shared__ float part[32];
	asm volatile("griddepcontrol.wait;\n" ::: "memory"); // a programmatic dependent of the previous kernel
	const float* xr = x + (i64)blockIdx.x * h;
	float* yr = out + (i64)blockIdx.x * h;
	float ss = 0.f;
	for (i64 i = threadIdx.x; i < h; i += blockDim.x) ss += xr[i] * xr[i];
	ss = warp_sum(ss);
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	if (lane == 0) part[warp] = ss;
	__syncthreads();
	if (warp == 0) {
		float t = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.f;
		t = warp_sum(t);
		if (lane == 0) part[0] = t;
	}
	__syncthreads();
	float r = (float)(1.0 / sqrt((double)part[0] / (double)h + (double)eps));
	for (i64 i = threadIdx.x; i < h; i += blockDim.x) yr[i] = to_f(w[i]) * (xr[i] * r);
}

// Eight weights in registers as loaded (16 bytes of bf16, 32 of float),
// converted to float when used, so that more loads fit in flight.
template <typename W> struct wchunk;
template <> struct wchunk<float> { uint4 u[2]; };
template <> struct wchunk<__nv_bfloat16> { uint4 u[1]; };

// ld16 loads 16 bytes of weights at p: through the read-only path, and
// without allocating in L1 when NA (weights are streamed once per token;
// L1 keeps the activations every warp rereads).
template <int NA> __device__ __forceinline__ uint4 ld16(const void* p) {
	return NA ? ldg_nc(p) : __ldg(reinterpret_cast<const uint4*>(p));
}

template <typename W, int NA> __device__ __forceinline__ void ldw(const W* p, wchunk<W>& c) {
#pragma unroll
	for (int i = 0; i < (int)(sizeof(c.u) / 16); i++) c.u[i] = ld16<NA>(reinterpret_cast<const char*>(p) + 16 * i);
}

__device__ __forceinline__ void unpack(const wchunk<float>& c, float* out) {
	const float* f = reinterpret_cast<const float*>(c.u);
#pragma unroll
	for (int i = 0; i < 8; i++) out[i] = f[i];
}
__device__ __forceinline__ void unpack(const wchunk<__nv_bfloat16>& c, float* out) {
	const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(c.u);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 f = __bfloat1622float2(h[i]);
		out[2 * i] = f.x; out[2 * i + 1] = f.y;
	}
}

// Where output o of a GEMV row goes: the outputs are split into up to
// three segments (y0: the first m0, y1: the next m1, y2: the rest), each
// its own [rows][width] tensor, so that one launch over a fused weight
// matrix (q|k|v, gate|up) writes the separate activations. res is added
// to y0 (single-segment launches only; it may alias y0).
struct gemv_out {
	float *y0, *y1, *y2;
	const float* res;
	i64 m, m0, m1;
};

// The RMSNorm a GEMV may fuse in front of itself (NORM variants): x[r] is
// multiplied by the norm's weights w as it is loaded, its mean of squares
// is summed on the way (over the same loads), and the dot products are
// scaled by rsqrt(mean + eps) at the end: W (w * x s) = s W (w * x), so
// the normalised x never goes through memory and no kernel runs for it.
template <typename W> struct gemv_norm {
	const W* w;
	float eps;
};

// norm_scale is rsqrt(ss / k + eps) rounded once from double, as the
// RMSNorm kernel's.
__device__ __forceinline__ float norm_scale(float ss, i64 k, float eps) {
	return (float)(1.0 / sqrt((double)ss / (double)k + (double)eps));
}

__device__ __forceinline__ void gemv_store(const gemv_out& g, i64 r, i64 o, float s) {
	if (o < g.m0) {
		i64 at = r * g.m0 + o;
		g.y0[at] = s + (g.res ? g.res[at] : 0.f);
	} else if (o < g.m0 + g.m1) {
		g.y1[r * g.m1 + (o - g.m0)] = s;
	} else {
		i64 w = g.m - g.m0 - g.m1;
		g.y2[r * w + (o - g.m0 - g.m1)] = s;
	}
}

// y[r][o] = sum_k W[o][k] x[r][k] for r < rows <= R. A warp computes T
// consecutive outputs (register tiling: each x vector loaded serves T
// weight rows), each lane U 16-byte loads per weight row in flight; block
// 256 (8 warps, 8T outputs). k8 is set when k is a multiple of 8 and the
// rows are 16-byte aligned (vector loads). Waits for the previous kernel
// (griddepcontrol.wait: launched as its programmatic dependent) only
// after prefetching its first weights into L2, which never change.
template <typename W, int R, int T, int U, int NA, bool NORM>
__device__ void gemv(gemv_out g, const W* wt, const float* x, i64 k, i64 rows, i64 k8, gemv_norm<W> nm) {
	const i64 o0 = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * T;
	const int lane = threadIdx.x & 31;
	const i64 step = 32 * 8;
	if (o0 < g.m && k8) {
#pragma unroll
		for (int t = 0; t < T; t++)
			if (o0 + t < g.m && (i64)lane * 8 < k)
				asm volatile("prefetch.global.L2 [%0];" ::"l"(wt + (o0 + t) * k + lane * 8));
	}
	asm volatile("griddepcontrol.wait;\n" ::: "memory");
	if (o0 >= g.m) return;
	float acc[T][R], ss[R];
#pragma unroll
	for (int t = 0; t < T; t++)
#pragma unroll
		for (int r = 0; r < R; r++) acc[t][r] = 0.f;
#pragma unroll
	for (int r = 0; r < R; r++) ss[r] = 0.f;
	// Rows past m (the last warp's tile) read row m-1 again and are not stored.
	const W* wr[T];
#pragma unroll
	for (int t = 0; t < T; t++) wr[t] = wt + min(o0 + t, g.m - 1) * k;
	if (k8) {
		for (i64 j0 = (i64)lane * 8; j0 < k; j0 += step * U) {
			wchunk<W> wv[U][T];
#pragma unroll
			for (int u = 0; u < U; u++)
#pragma unroll
				for (int t = 0; t < T; t++)
					if (j0 + u * step < k) ldw<W, NA>(wr[t] + j0 + u * step, wv[u][t]);
#pragma unroll
			for (int u = 0; u < U; u++) {
				const i64 j = j0 + u * step;
				if (j < k) {
					float wf[T][8], nf[8];
#pragma unroll
					for (int t = 0; t < T; t++) unpack(wv[u][t], wf[t]);
					if (NORM) load8(nm.w + j, nf);
#pragma unroll
					for (int r = 0; r < R; r++) {
						if (r < rows) {
							float xv[8];
							load8(x + r * k + j, xv);
							if (NORM) {
#pragma unroll
								for (int i = 0; i < 8; i++) ss[r] += xv[i] * xv[i], xv[i] *= nf[i];
							}
#pragma unroll
							for (int t = 0; t < T; t++)
#pragma unroll
								for (int i = 0; i < 8; i++) acc[t][r] += wf[t][i] * xv[i];
						}
					}
				}
			}
		}
	} else {
		for (i64 j = lane; j < k; j += 32) {
			float xs[R];
			const float nf = NORM ? to_f(nm.w[j]) : 1.f;
#pragma unroll
			for (int r = 0; r < R; r++) {
				xs[r] = r < rows ? x[r * k + j] : 0.f;
				if (NORM) ss[r] += xs[r] * xs[r], xs[r] *= nf;
			}
#pragma unroll
			for (int t = 0; t < T; t++) {
				float wv = to_f(wr[t][j]);
#pragma unroll
				for (int r = 0; r < R; r++)
					if (r < rows) acc[t][r] += wv * xs[r];
			}
		}
	}
	// Every lane's share of each row's squares, summed over the warp
	// (the warp read the whole of x).
	float sc[R];
#pragma unroll
	for (int r = 0; r < R; r++) sc[r] = NORM && r < rows ? norm_scale(warp_sum(ss[r]), k, nm.eps) : 1.f;
#pragma unroll
	for (int t = 0; t < T; t++) {
#pragma unroll
		for (int r = 0; r < R; r++) {
			if (r < rows) {
				float s = warp_sum(acc[t][r]);
				if (NORM) s *= sc[r];
				if (lane == 0 && o0 + t < g.m) gemv_store(g, r, o0 + t, s);
			}
		}
	}
}

// dst[i] = offset + scale * u with u uniform in [-1, 1) from a splitmix64
// hash of (seed, i) (convert.cuh's fill_random, scaled): random weights
// generated on the device.
template <typename W>
__device__ void fill(W* dst, i64 n, i64 seed, float scale, float offset) {
	for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
		unsigned long long z = (unsigned long long)seed * 0x9e3779b97f4a7c15ull + (unsigned long long)i;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		dst[i] = from_f<W>(offset + scale * ((float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f));
	}
}

// Tensor-core GEMV of bf16 weights for up to 8 rows: y^T = W x^T as
// m16n8k16 mma tiles (16 outputs x 8 rows, k 16 at a time). A block of 8
// warps computes 16 T outputs; its warps split k (warp w takes the 32-wide
// k steps w, w + 8, ...) and sum through shared memory, so that small
// matrices still spread over the GPU and each block reads x once. Each
// lane loads 16 contiguous bytes of two weight rows (g and g + 8) per k
// step: since a dot product may sum k in any order, the lane's 8 weights
// are the k slots of its A fragment in two mmas (slots 2c, 2c+1, 2c+8,
// 2c+9 of mma h hold k = 8c + 4h + 0..3), and its B fragment takes x at
// the same 8 k. x (float) is split into three bf16 terms (hi, mid, lo:
// 24 significant bits, x exactly) multiplied in turn, so the result is
// the fp32 sum of exact products, as the CUDA-core GEMV's. k must be a
// multiple of 8 with 16-byte aligned rows (k8; the host checks).
#define TC_WARPS 8
template <int T, int U, bool NORM>
__device__ void gemv_tc(gemv_out g, const __nv_bfloat16* wt, const float* x, i64 k, i64 rows, gemv_norm<__nv_bfloat16> nm) {
	__shared__ float red[TC_WARPS - 1][T][4][32];
	__shared__ float ssw[TC_WARPS][8]; // NORM: each warp's sum of squares per row
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int gq = lane >> 2, c = lane & 3;
	const i64 o0 = (i64)blockIdx.x * 16 * T;
	const __nv_bfloat16* lo[T];
	const __nv_bfloat16* hi[T];
#pragma unroll
	for (int t = 0; t < T; t++) {
		lo[t] = wt + min(o0 + 16 * t + gq, g.m - 1) * k;
		hi[t] = wt + min(o0 + 16 * t + gq + 8, g.m - 1) * k;
		i64 j = (i64)warp * 32 + 8 * c;
		if (j < k) {
			asm volatile("prefetch.global.L2 [%0];" ::"l"(lo[t] + j));
			asm volatile("prefetch.global.L2 [%0];" ::"l"(hi[t] + j));
		}
	}
	asm volatile("griddepcontrol.wait;\n" ::: "memory");
	const float* xr = gq < rows ? x + gq * k : nullptr;
	float acc[T][4], ss = 0.f;
#pragma unroll
	for (int t = 0; t < T; t++)
#pragma unroll
		for (int i = 0; i < 4; i++) acc[t][i] = 0.f;
	const i64 stride = 32 * TC_WARPS;
	// The loop runs on the warp's k (jb): every lane of the warp takes the
	// same trips, as mma.sync needs; lanes past k load zeros.
	for (i64 jb = (i64)warp * 32; jb < k; jb += stride * U) {
		const i64 j0 = jb + 8 * c;
		uint4 wl[U][T], wh[U][T];
#pragma unroll
		for (int u = 0; u < U; u++) {
			const i64 j = j0 + u * stride;
#pragma unroll
			for (int t = 0; t < T; t++) {
				if (j < k) {
					wl[u][t] = ldg_nc(lo[t] + j);
					wh[u][t] = ldg_nc(hi[t] + j);
				} else {
					wl[u][t] = wh[u][t] = make_uint4(0, 0, 0, 0);
				}
			}
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			const i64 j = j0 + u * stride;
			float xv[8];
#pragma unroll
			for (int i = 0; i < 8; i++) xv[i] = 0.f;
			if (xr && j < k) {
				load8(xr + j, xv);
				if (NORM) {
					float nf[8];
					load8(nm.w + j, nf);
#pragma unroll
					for (int i = 0; i < 8; i++) ss += xv[i] * xv[i], xv[i] *= nf[i];
				}
			}
			// b[s][p]: term s (hi, mid, lo) of the pair (xv[2p], xv[2p+1]).
			uint32_t b[3][4];
#pragma unroll
			for (int p = 0; p < 4; p++) {
				b[0][p] = pack2<__nv_bfloat16>::from(xv[2 * p], xv[2 * p + 1]);
				const float2 h2 = pack2<__nv_bfloat16>::to(b[0][p]);
				split<__nv_bfloat16>(xv[2 * p] - h2.x, xv[2 * p + 1] - h2.y, b[1][p], b[2][p]);
			}
#pragma unroll
			for (int t = 0; t < T; t++) {
				const uint4 a = wl[u][t], e = wh[u][t];
#pragma unroll
				for (int s = 0; s < 3; s++) {
					mma<__nv_bfloat16>(acc[t], a.x, e.x, a.y, e.y, b[s][0], b[s][1]);
					mma<__nv_bfloat16>(acc[t], a.z, e.z, a.w, e.w, b[s][2], b[s][3]);
				}
			}
		}
	}
	if (warp > 0) {
#pragma unroll
		for (int t = 0; t < T; t++)
#pragma unroll
			for (int i = 0; i < 4; i++) red[warp - 1][t][i][lane] = acc[t][i];
	}
	if (NORM) {
		// Row gq's squares of this warp: its four lanes (c = 0..3).
		ss += __shfl_xor_sync(0xffffffffu, ss, 1);
		ss += __shfl_xor_sync(0xffffffffu, ss, 2);
		if (c == 0) ssw[warp][gq] = ss;
	}
	__syncthreads();
	if (warp != 0) return;
	float sc[2] = {1.f, 1.f}; // rows 2c, 2c+1
	if (NORM) {
#pragma unroll
		for (int i = 0; i < 2; i++) {
			float t = 0.f;
#pragma unroll
			for (int w = 0; w < TC_WARPS; w++) t += ssw[w][2 * c + i];
			sc[i] = norm_scale(t, k, nm.eps);
		}
	}
#pragma unroll
	for (int t = 0; t < T; t++) {
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float s = acc[t][i];
#pragma unroll
			for (int w = 0; w < TC_WARPS - 1; w++) s += red[w][t][i][lane];
			if (NORM) s *= sc[i & 1];
			// c0, c1: output g, rows 2c, 2c+1; c2, c3: output g + 8.
			const i64 o = o0 + 16 * t + gq + (i >= 2 ? 8 : 0);
			const i64 r = 2 * c + (i & 1);
			if (o < g.m && r < rows) gemv_store(g, r, o, s);
		}
	}
}

// model_gemv_<W>_r<R>_t<T>_u<U>_n<NA>[_norm]: up to R rows, T outputs a
// warp, U loads in flight a lane and weight row, L1::no_allocate when NA;
// _norm with the RMSNorm of x (weights nw, eps) fused (the variants that
// modelnames.go lists; the host picks one by shape). Every variant takes
// nw and eps; those without _norm ignore them.
#define GEMV_ENTRY_AS(W, NAME, R, T, U, NA, NORM, SUFFIX)                                                    \
	extern "C" __global__ void model_gemv_##NAME##_r##R##_t##T##_u##U##_n##NA##SUFFIX(                    \
	    float* y0, float* y1, float* y2, const float* res, const W* wt, const float* x, i64 m, i64 m0, i64 m1, \
	    i64 k, i64 rows, i64 k8, const W* nw, float eps) {                                                   \
		gemv<W, R, T, U, NA, NORM>(gemv_out{y0, y1, y2, res, m, m0, m1}, wt, x, k, rows, k8, gemv_norm<W>{nw, eps}); \
	}
#define GEMV_ENTRY(W, NAME, R, T, U, NA) GEMV_ENTRY_AS(W, NAME, R, T, U, NA, false, )
#define GEMV_ENTRY_NORM(W, NAME, R, T, U, NA) GEMV_ENTRY_AS(W, NAME, R, T, U, NA, true, _norm)

// The variants kept after measuring 21 (bench/results/2026-12-06-gemv-h100.md):
// the best at one row, the fallbacks for k not a multiple of 8, and 9-16
// rows; f32 weights (tests) one a row count. The defaults (gemvDefault)
// also with the norm fused.
GEMV_ENTRY(__nv_bfloat16, bf16, 1, 1, 4, 1)
GEMV_ENTRY(__nv_bfloat16, bf16, 1, 2, 2, 1)
GEMV_ENTRY(__nv_bfloat16, bf16, 4, 2, 2, 1)
GEMV_ENTRY(__nv_bfloat16, bf16, 8, 2, 2, 1)
GEMV_ENTRY(__nv_bfloat16, bf16, 16, 4, 1, 1)
GEMV_ENTRY(float, f32, 1, 1, 4, 1)
GEMV_ENTRY(float, f32, 4, 2, 2, 1)
GEMV_ENTRY(float, f32, 8, 2, 2, 1)
GEMV_ENTRY(float, f32, 16, 2, 2, 1)
GEMV_ENTRY_NORM(__nv_bfloat16, bf16, 1, 2, 2, 1)
GEMV_ENTRY_NORM(__nv_bfloat16, bf16, 4, 2, 2, 1)
GEMV_ENTRY_NORM(__nv_bfloat16, bf16, 8, 2, 2, 1)
GEMV_ENTRY_NORM(__nv_bfloat16, bf16, 16, 4, 1, 1)
GEMV_ENTRY_NORM(float, f32, 1, 1, 4, 1)
GEMV_ENTRY_NORM(float, f32, 4, 2, 2, 1)
GEMV_ENTRY_NORM(float, f32, 8, 2, 2, 1)
GEMV_ENTRY_NORM(float, f32, 16, 2, 2, 1)

// model_gemvtc_bf16_t<T>_u<U>[_norm]: the tensor-core GEMV (up to 8 rows,
// k8 only), T 16-output tiles a block, U k steps in flight a lane.
#define GEMV_TC_ENTRY_AS(T, U, NORM, SUFFIX)                                                                  \
	extern "C" __global__ void model_gemvtc_bf16_t##T##_u##U##SUFFIX(                                      \
	    float* y0, float* y1, float* y2, const float* res, const __nv_bfloat16* wt, const float* x, i64 m,     \
	    i64 m0, i64 m1, i64 k, i64 rows, i64 k8, const __nv_bfloat16* nw, float eps) {                         \
		gemv_tc<T, U, NORM>(gemv_out{y0, y1, y2, res, m, m0, m1}, wt, x, k, rows,                           \
				    gemv_norm<__nv_bfloat16>{nw, eps});                                             \
	}
GEMV_TC_ENTRY_AS(1, 2, false, )
GEMV_TC_ENTRY_AS(1, 4, false, )
GEMV_TC_ENTRY_AS(2, 2, false, )
GEMV_TC_ENTRY_AS(1, 4, true, _norm)

#define MODEL_KERNELS(W, NAME)                                                                              \
	extern "C" __global__ void model_embed_##NAME(float* out, const W* table, const int* ids, i64 h) {      \
		embed<W>(out, table, ids, h);                                                                         \
	}                                                                                                         \
	extern "C" __global__ void model_rmsnorm_##NAME(float* out, const float* x, const W* w, i64 h, float eps) { \
		rmsnorm<W>(out, x, w, h, eps);                                                                        \
	}                                                                                                         \
	extern "C" __global__ void model_fill_##NAME(W* dst, i64 n, i64 seed, float scale, float offset) {      \
		fill<W>(dst, n, seed, scale, offset);                                                                 \
	}

MODEL_KERNELS(float, f32)
MODEL_KERNELS(__nv_bfloat16, bf16)

// Rotate-half RoPE in place on q [rows][qh][d] and k [rows][kh][d] (one
// launch for both): dimension i < d/2 pairs with i + d/2 and turns by the
// angle whose cosine and sine are cs[r][i][0..1] (computed on the host as
// the CPU executor computes them). Grid (qh + kh, rows), block d/2; k may
// be null with kh 0.
extern "C" __global__ void model_rope(float* q, float* k, const float* cs, i64 qh, i64 kh, i64 d) {
	asm volatile("griddepcontrol.wait;\n" ::: "memory"); // a programmatic dependent of the previous kernel
	i64 r = blockIdx.y, h = blockIdx.x, i = threadIdx.x, half = d / 2;
	if (i >= half) return;
	float* v = h < qh ? q + (r * qh + h) * d : k + (r * kh + (h - qh)) * d;
	float c = cs[(r * half + i) * 2], s = cs[(r * half + i) * 2 + 1];
	float a = v[i], b = v[i + half];
	v[i] = a * c - b * s;
	v[i + half] = b * c + a * s;
}

// g[i] = silu(g[i]) * u[i] for i < n.
extern "C" __global__ void model_silu_mul(float* g, const float* u, i64 n) {
	asm volatile("griddepcontrol.wait;\n" ::: "memory"); // a programmatic dependent of the previous kernel
	for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
		float x = g[i];
		g[i] = x / (1.f + expf(-x)) * u[i];
	}
}

// out[r] = the first index of the largest of logits[r][0..v): grid
// (rows), block 1024.
// The first index of the largest of l[0..v) and its value to every thread
// of the block (blockDim a multiple of 32, at most 1024): idx 0 for a
// row without one (NaN or -inf throughout), as the CPU's argmax.
__device__ void block_argmax(const float* l, i64 v, float* best_out, int* idx_out) {
	__shared__ float bv[32];
	__shared__ int bi[32];
	float best = -INFINITY;
	int idx = 0;
	// Eight loads in flight a thread (one at a time, a row of 128K
	// logits took ~125 dependent load latencies: 31 us on an H200);
	// each thread still visits its indices in increasing order.
	const i64 nb = blockDim.x;
	i64 i = threadIdx.x;
	for (; i + 7 * nb < v; i += 8 * nb) {
		float x[8];
#pragma unroll
		for (int k = 0; k < 8; k++) x[k] = l[i + k * nb];
#pragma unroll
		for (int k = 0; k < 8; k++)
			if (x[k] > best) best = x[k], idx = (int)(i + k * nb); // strided: the first of a thread's ties
	}
	for (; i < v; i += nb) {
		float x = l[i];
		if (x > best) best = x, idx = (int)i;
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		float ob = __shfl_xor_sync(0xffffffffu, best, o);
		int oi = __shfl_xor_sync(0xffffffffu, idx, o);
		if (ob > best || (ob == best && oi < idx)) best = ob, idx = oi;
	}
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	if (lane == 0) bv[warp] = best, bi[warp] = idx;
	__syncthreads();
	if (warp == 0) {
		best = lane < (int)(blockDim.x >> 5) ? bv[lane] : -INFINITY;
		idx = lane < (int)(blockDim.x >> 5) ? bi[lane] : 0;
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) {
			float ob = __shfl_xor_sync(0xffffffffu, best, o);
			int oi = __shfl_xor_sync(0xffffffffu, idx, o);
			if (ob > best || (ob == best && oi < idx)) best = ob, idx = oi;
		}
		if (lane == 0) bv[0] = best, bi[0] = idx;
	}
	__syncthreads();
	*best_out = bv[0];
	*idx_out = bi[0];
}

extern "C" __global__ void model_argmax(int* out, const float* logits, i64 v) {
	asm volatile("griddepcontrol.wait;\n" ::: "memory"); // a programmatic dependent of the previous kernel
	float best;
	int idx;
	block_argmax(logits + (i64)blockIdx.x * v, v, &best, &idx);
	if (threadIdx.x == 0) out[blockIdx.x] = idx;
}

// Sampling, one row per block of 1024 threads: kernels.SampleRow's rule
// without a sort. Each token's probability is held as the integer
// floor(p * 2^62), so that every sum is exact in any order; "the first
// token in the rule's order (largest logit first, ties by lower index)
// at which the cumulative mass exceeds t" is found by a radix search over
// the 64-bit rank (~key(logit) << 32 | index), eight bits a pass,
// histograms of mass in shared memory.
#define SAMPLE_HISTS 16 // copies of the histogram, two warps each (less contention)

__device__ __forceinline__ unsigned sample_key(float x) {
	if (x != x) return 0u;
	if (x == 0.f) return 0x80000000u; // -0 as +0
	unsigned b = __float_as_uint(x);
	return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ unsigned long long sample_rank(float x, i64 i) {
	return ((unsigned long long)(~sample_key(x)) << 32) | (unsigned long long)i;
}

__device__ __forceinline__ double sample_exp(float x, double m, double t) {
	if (x != x || x == -INFINITY) return 0.0;
	return exp(((double)x - m) / t);
}

// sample_first returns the rank of the first token whose cumulative
// mass exceeds t (t below the row's total) and that cumulative mass.
__device__ unsigned long long sample_first(const float* l, const unsigned long long* q, i64 v, int idbits, unsigned long long t,
					   unsigned long long* cum, unsigned long long* hist, unsigned long long* sh) {
	unsigned long long fixed = 0, below = 0, qsel = 0;
	int shifts[8], ns = 0;
	for (int sft = 56; sft >= 32; sft -= 8) shifts[ns++] = sft;
	for (int sft = ((idbits - 1) / 8) * 8; sft >= 0; sft -= 8) shifts[ns++] = sft;
	for (int k = 0; k < ns; k++) {
		const int sft = shifts[k];
		const unsigned long long mask = sft + 8 >= 64 ? 0ull : (~0ull << (sft + 8));
		for (int j = threadIdx.x; j < SAMPLE_HISTS * 256; j += blockDim.x) hist[j] = 0;
		__syncthreads();
		unsigned long long* h = hist + ((threadIdx.x >> 6) % SAMPLE_HISTS) * 256;
		for (i64 i = threadIdx.x; i < v; i += blockDim.x) {
			const unsigned long long r = sample_rank(l[i], i);
			if (((r ^ fixed) & mask) != 0) continue;
			const unsigned long long m = q[i];
			if (m) atomicAdd(h + ((r >> sft) & 255), m);
		}
		__syncthreads();
		if (threadIdx.x < 256) {
			unsigned long long c = 0;
			for (int j = 0; j < SAMPLE_HISTS; j++) c += hist[j * 256 + threadIdx.x];
			hist[threadIdx.x] = c;
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			unsigned long long c = below;
			int d = 255;
			for (int dd = 0; dd < 256; dd++) {
				if (c + hist[dd] > t) {
					d = dd;
					break;
				}
				c += hist[dd];
			}
			sh[0] = c, sh[1] = (unsigned long long)d, sh[2] = hist[d];
		}
		__syncthreads();
		below = sh[0], fixed |= sh[1] << sft, qsel = sh[2];
		__syncthreads();
	}
	*cum = below + qsel;
	return fixed;
}

// model_sample: params [rows][3] (temperature, top-p, u); q scratch of
// [rows][v] 64-bit words; idbits the bits of v - 1 (at least 1); greedy
// gets each row's argmax too.
extern "C" __global__ void __launch_bounds__(1024) model_sample(int* out, int* greedy, const float* logits, unsigned long long* qbuf, const double* params, i64 v,
								      i64 idbits) {
	__shared__ unsigned long long hist[SAMPLE_HISTS * 256];
	__shared__ unsigned long long sh[4];
	__shared__ double dpart[32];
	__shared__ unsigned long long upart[32];
	asm volatile("griddepcontrol.wait;\n" ::: "memory"); // a programmatic dependent of the previous kernel
	const float* l = logits + (i64)blockIdx.x * v;
	unsigned long long* q = qbuf + (i64)blockIdx.x * v;
	const double temp = params[3 * blockIdx.x], topp = params[3 * blockIdx.x + 1], u = params[3 * blockIdx.x + 2];
	float best;
	int idx;
	block_argmax(l, v, &best, &idx);
	if (threadIdx.x == 0) greedy[blockIdx.x] = idx;
	if (temp == 0.0 || isinf(best)) {
		if (threadIdx.x == 0) out[blockIdx.x] = idx;
		return;
	}
	const double m = (double)best;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	// The softmax's sum, in a fixed order (each thread's strided share,
	// then a fixed tree); p kept in q's words until it is scaled.
	double* pd = reinterpret_cast<double*>(q);
	double s = 0.0;
	for (i64 i = threadIdx.x; i < v; i += blockDim.x) {
		const double e = sample_exp(l[i], m, temp);
		pd[i] = e;
		s += e;
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
	if (lane == 0) dpart[warp] = s;
	__syncthreads();
	if (warp == 0) {
		s = lane < (int)(blockDim.x >> 5) ? dpart[lane] : 0.0;
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
		if (lane == 0) dpart[0] = s;
	}
	__syncthreads();
	const double total = dpart[0];
	unsigned long long qs = 0;
	for (i64 i = threadIdx.x; i < v; i += blockDim.x) {
		const unsigned long long w = (unsigned long long)(pd[i] / total * 0x1p62);
		q[i] = w;
		qs += w;
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) qs += __shfl_xor_sync(0xffffffffu, qs, o);
	if (lane == 0) upart[warp] = qs;
	__syncthreads();
	if (threadIdx.x == 0) {
		unsigned long long c = 0;
		for (int w = 0; w < (int)(blockDim.x >> 5); w++) c += upart[w];
		upart[0] = c;
	}
	__syncthreads();
	unsigned long long kept = upart[0];
	const int ib = (int)idbits;
	if (topp > 0.0 && topp < 1.0) {
		unsigned long long tp = (unsigned long long)(topp * 0x1p62);
		if (tp < 1) tp = 1;
		if (tp <= kept) sample_first(l, q, v, ib, tp - 1, &kept, hist, sh);
	}
	unsigned long long t = (unsigned long long)(u * (double)kept);
	if (t > kept - 1) t = kept - 1;
	unsigned long long cum;
	const unsigned long long r = sample_first(l, q, v, ib, t, &cum, hist, sh);
	if (threadIdx.x == 0) out[blockIdx.x] = (int)(r & 0xffffffffull);
}
