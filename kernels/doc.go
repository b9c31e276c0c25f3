// Package kernels owns the compute of a Quest decode step: page scoring from
// min/max summaries, per-row top-K selection, sparse paged attention that
// produces partial states (o, lse), and the merge of partial states.
//
// Kernels never allocate K/V buffers of their own and never gather pages:
// they read the page pools of one layer in place through a page table, the
// way FlashInfer's paged decode does. Inputs are described in CSR form
// (Batch: indptr, physical page ids, last-page lengths) so a ragged batch of
// sequences is one call, with no padding to the longest sequence.
//
// The CPU backend in this package implements Backend (the default, used by
// CI and every test): Go with small AVX2/FMA assembly kernels for dot
// products and axpy, chosen at start-up from CPUID, and portable Go loops
// under the purego build tag or on other CPUs. The same assembly file
// holds the loops of CausalAttention, the dense causal prefill of the CPU
// model (package model). The CUDA backend (package
// kernels/cuda, build tag cuda) implements the same interface. Every
// backend follows these conventions:
//
//   - Query head h belongs to KV head h/G, G = QHeads/KVHeads (Llama GQA).
//   - A page's summary record for one KV head is 2*D floats, D mins then D
//     maxes; the score U_p(q) = sum_j max(q_j*min_j, q_j*max_j) is computed
//     as the dot product of [min(q,0); max(q,0)] with that record.
//   - Scores are float32 and unscaled (no 1/sqrt(D)).
//   - With fp8 summaries (plan.SummaryFP8: CPUConfig.SummaryDType, the
//     CUDA backend's Config.SummaryDType) the score reads each record as
//     package kernels/fp8 stores it: E4M3 codes rounded outward and a
//     power-of-two scale per (page, KV head), score = scale times the dot
//     product with the code values. It is still an upper bound of q.k
//     over the page's keys, only looser.
//   - Top-K orders by score descending, ties to the lower logical page index,
//     and returns the chosen logical page indices in ascending order.
//   - Attention scales logits by 1/sqrt(D) and returns, per query head, the
//     normalized output o and lse = log(sum exp(scaled logits)) (natural log).
//     An empty page list yields the empty state (0, -Inf).
//
// The package knows nothing about sequences' ownership, shards or networks.
package kernels
