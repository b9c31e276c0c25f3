// Model kernels: what a Llama-family decoder runs besides attention, for
// the device executor (model/gpu). Activations are float32 row-major
// [rows][width]; weights are float32 or bf16 ([out][in], as checkpoints
// store them). Counts are i64 parameters.
//
//   model_embed_<W>     out[r] = table[ids[r]]
//   model_rmsnorm_<W>   out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w
//   model_gemv_<W>_r<R> y[r] = W x[r] (+ res[r]), r < rows <= R (1, 4, 16)
//   model_rope          rotate-half RoPE with per-row cos/sin
//   model_silu_mul      g = silu(g) * u
//   model_argmax        out[r] = the first index of the largest logit
//   model_fill_<W>      dst[i] = offset + scale * uniform[-1, 1) (random weights)

#include "common.cuh"

#define GEMV_ROWS 16 // the most rows one gemv launch serves (the largest R)

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

// Loads 8 weights at p through the read-only, no-L1-allocate path
// (streamed once per token) as floats.
template <typename W> __device__ __forceinline__ void ldw8(const W* p, float* out);
template <> __device__ __forceinline__ void ldw8<float>(const float* p, float* out) {
	float4 a = __ldg(reinterpret_cast<const float4*>(p));
	float4 b = __ldg(reinterpret_cast<const float4*>(p + 4));
	out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
	out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
template <> __device__ __forceinline__ void ldw8<__nv_bfloat16>(const __nv_bfloat16* p, float* out) {
	uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
	const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 f = __bfloat1622float2(h[i]);
		out[2 * i] = f.x; out[2 * i + 1] = f.y;
	}
}

// y[r][m] = sum_k W[m][k] x[r][k] (+ res[r][m]) for r < rows <= R: one
// warp per output m (block 256: 8 outputs), the weight row streamed once
// for all rows, GEMV_UNROLL vector loads in flight per lane. k8 is set
// when k is a multiple of 8 and the rows are 16-byte aligned (vector
// loads); y may alias res.
#define GEMV_UNROLL 4
template <typename W, int R>
__device__ void gemv(float* y, const W* wt, const float* x, const float* res, i64 m, i64 k, i64 rows, i64 k8) {
	i64 o = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	if (o >= m) return;
	const W* wr = wt + o * k;
	float acc[R];
#pragma unroll
	for (int r = 0; r < R; r++) acc[r] = 0.f;
	if (k8) {
		const i64 step = 32 * 8;
		for (i64 j0 = (i64)lane * 8; j0 < k; j0 += step * GEMV_UNROLL) {
			float wv[GEMV_UNROLL][8];
#pragma unroll
			for (int u = 0; u < GEMV_UNROLL; u++)
				if (j0 + u * step < k) ldw8(wr + j0 + u * step, wv[u]);
#pragma unroll
			for (int u = 0; u < GEMV_UNROLL; u++) {
				i64 j = j0 + u * step;
				if (j < k) {
#pragma unroll
					for (int r = 0; r < R; r++) {
						if (r < rows) {
							float xv[8];
							load8(x + r * k + j, xv);
#pragma unroll
							for (int i = 0; i < 8; i++) acc[r] += wv[u][i] * xv[i];
						}
					}
				}
			}
		}
	} else {
		for (i64 j = lane; j < k; j += 32) {
			float wv = to_f(wr[j]);
#pragma unroll
			for (int r = 0; r < R; r++)
				if (r < rows) acc[r] += wv * x[r * k + j];
		}
	}
#pragma unroll
	for (int r = 0; r < R; r++) {
		if (r < rows) {
			float s = warp_sum(acc[r]);
			if (lane == 0) y[r * m + o] = s + (res ? res[r * m + o] : 0.f);
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

// model_gemv_<W>_r<R> serves up to R rows (R = 1, 4, 16).
#define GEMV_ENTRY(W, NAME, R)                                                                                \
	extern "C" __global__ void model_gemv_##NAME##_r##R(float* y, const W* wt, const float* x, const float* res, \
							    i64 m, i64 k, i64 rows, i64 k8) {                  \
		gemv<W, R>(y, wt, x, res, m, k, rows, k8);                                                            \
	}

#define MODEL_KERNELS(W, NAME)                                                                              \
	extern "C" __global__ void model_embed_##NAME(float* out, const W* table, const int* ids, i64 h) {      \
		embed<W>(out, table, ids, h);                                                                         \
	}                                                                                                         \
	extern "C" __global__ void model_rmsnorm_##NAME(float* out, const float* x, const W* w, i64 h, float eps) { \
		rmsnorm<W>(out, x, w, h, eps);                                                                        \
	}                                                                                                         \
	GEMV_ENTRY(W, NAME, 1)                                                                                    \
	GEMV_ENTRY(W, NAME, 4)                                                                                    \
	GEMV_ENTRY(W, NAME, 16)                                                                                   \
	extern "C" __global__ void model_fill_##NAME(W* dst, i64 n, i64 seed, float scale, float offset) {      \
		fill<W>(dst, n, seed, scale, offset);                                                                 \
	}

MODEL_KERNELS(float, f32)
MODEL_KERNELS(__nv_bfloat16, bf16)

// Rotate-half RoPE in place on x [rows][heads][d]: dimension i < d/2
// pairs with i + d/2 and turns by the angle whose cosine and sine are
// cs[r][i][0..1] (computed on the host as the CPU executor computes
// them). Grid (heads, rows), block d/2.
extern "C" __global__ void model_rope(float* x, const float* cs, i64 heads, i64 d) {
	i64 r = blockIdx.y, h = blockIdx.x, i = threadIdx.x, half = d / 2;
	if (i >= half) return;
	float* v = x + (r * heads + h) * d;
	float c = cs[(r * half + i) * 2], s = cs[(r * half + i) * 2 + 1];
	float a = v[i], b = v[i + half];
	v[i] = a * c - b * s;
	v[i + half] = b * c + a * s;
}

// g[i] = silu(g[i]) * u[i] for i < n.
extern "C" __global__ void model_silu_mul(float* g, const float* u, i64 n) {
	for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
		float x = g[i];
		g[i] = x / (1.f + expf(-x)) * u[i];
	}
}

// out[r] = the first index of the largest of logits[r][0..v): grid
// (rows), block 1024.
extern "C" __global__ void model_argmax(int* out, const float* logits, i64 v) {
	__shared__ float bv[32];
	__shared__ int bi[32];
	const float* l = logits + (i64)blockIdx.x * v;
	float best = -INFINITY;
	int idx = 0; // a row of NaN or -inf gives 0, as the CPU's argmax
	for (i64 i = threadIdx.x; i < v; i += blockDim.x) {
		float x = l[i];
		if (x > best) best = x, idx = (int)i; // strided: the first of a thread's ties
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
		if (lane == 0) out[blockIdx.x] = idx;
	}
}
