// Merges of partial attention states (quest.cu): the reduce of each row's
// split-K items (after attend.cuh's kernels) and the merge of two states
// (o, lse), e.g. of two shards.
#pragma once

#include "common.cuh"

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
