// Asynchronous global -> shared copies (cp.async, sm_80+), shared by every
// kernel that stages pages through shared memory: the CUDA-core attention
// (attend.cuh), the tensor-core score and attention (mma.cu) and the
// prefill attention (prefill.cu). A copy of bytes < its size zero-fills
// the rest of the destination (bytes 0: all of it, nothing read).
#pragma once

// cp_async16 copies 16 bytes, bypassing L1 (.cg).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int bytes = 16) {
	const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
// cp_async4 copies 4 bytes through L1 (.ca: 4-byte copies cannot bypass it).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int bytes = 4) {
	const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// cp_async_wait waits until at most N of this thread's committed groups
// are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
