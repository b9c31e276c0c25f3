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
//
// The kernels are grouped by concept in headers, FlashInfer style; this file
// is the translation unit gen.sh compiles into the one module quest.ptx
// (one module keeps the loading in backend.go one cu.LoadData and one lookup
// table of kernel names):
//   common.cuh       types, storage-type conversions, warp reductions, loads
//   convert.cuh      float32 -> storage type, device-generated data
//   page.cuh         append (K/V and summaries), summary rescans, page tables
//   score.cuh        page scores from summaries (CUDA cores)
//   topk.cuh         one-block and two-stage top-K, picked scores
//   topk_thr.cuh     threshold top-K (tile maxima)
//   topk_radix.cuh   multi-block radix top-K for long rows
//   topk_sample.cuh  sample-then-one-pass top-K for long rows
//   attend.cuh       split-K sparse paged attention (CUDA cores)
//   merge.cuh        reduce of partial attention states, merge of two states
//   fp8.cuh          fp8 summaries: encoding and scoring
//   kvfp8.cuh        fp8 K/V records: quantizing append, rescan, attention
// The tensor-core kernels are mma.cu (module mma.ptx), the offload kernels
// slots.cu (slots.ptx).

#include "common.cuh"
#include "convert.cuh"
#include "page.cuh"
#include "score.cuh"
#include "topk.cuh"
#include "topk_thr.cuh"
#include "topk_radix.cuh"
#include "topk_sample.cuh"
#include "attend.cuh"
#include "merge.cuh"
#include "fp8.cuh"
#include "kvfp8.cuh"
