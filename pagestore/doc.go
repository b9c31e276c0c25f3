// Package pagestore is the paged KV store of one device partition: the page
// pool, the per-sequence page tables, the per-page key summaries (element-wise
// min and max, Quest eq. 1 and 8), tail lengths (last_page_len), reference
// counts, fork with copy-on-write, rollback with a rescan of the tail page,
// and recycling of physical pages with a fresh summary.
//
// It knows nothing about shards, networks or the kernels' internals: kernels
// receive the whole pool arrays (see [Store.Layer]) plus a page table
// ([Store.AppendPageTable]) and a [SeqView], and read K, V and summaries in
// place. This CPU store holds float32 data; plan.Float16 and plan.BFloat16
// are reserved for the GPU backend.
//
// # Pages span all layers
//
// A physical page id names S (= [Config.PageSize]) consecutive token slots of
// one sequence in every layer at once, as in vLLM and FlashInfer: each layer
// has its own pool arrays, indexed by the same physical page id. Consequences:
//
//   - one page table per sequence, shared by all layers;
//   - one allocation, refcount, fork and rollback decision per S tokens, not
//     per S tokens per layer;
//   - the per-step plan (page table, page count, last_page_len) is built once
//     per decode step and reused by every layer.
//
// Summaries are kept per layer, per page, per KV head and are never merged
// across layers: each layer projects keys into its own space.
//
// Layers advance independently (a model executor appends layer by layer
// inside a step), so a sequence keeps one length per layer. A page is
// allocated when any layer first needs a slot beyond the allocated pages.
// [Store.Fork] and [Store.Rollback] need all layers at the same length.
//
// # Memory layout (per layer, float32, page-major)
//
//	K, V     [Capacity][KVHeads][PageSize][HeadDim]
//	Summary  [Capacity][KVHeads][2][HeadDim]
//
// One (page, KV head) block of K or V is PageSize*HeadDim contiguous floats,
// token-major, so attention over one head of one page is a single contiguous
// read. One (page, KV head) summary record is 2*HeadDim contiguous floats:
// the HeadDim minima, then the HeadDim maxima. The score kernel computes
//
//	U_p(q) = sum_j max(q_j*min_j, q_j*max_j) = dot([min(q,0); max(q,0)], record)
//
// which is one contiguous 2*HeadDim-float dot product per (page, head); the
// records of all KV heads of a page sit next to each other.
//
// A freshly allocated (or recycled) page has min = +Inf and max = -Inf in
// every layer and head; every appended key widens its page's record
// incrementally (eq. 8). Padding slots (beyond a layer's length) never enter a
// summary, and their K/V contents are unspecified: kernels must honour
// [SeqView.LastPageLen]. A page that is full in a layer is sealed for that
// layer: its keys, values and summary are read-only from then on, unless a
// [Store.Rollback] reopens it as the tail page (its summary is then rescanned
// from the remaining keys, eq. 14).
//
// # Fork and copy-on-write
//
// [Store.Fork] shares every page with the child (refcount+1), the partially
// filled tail page included. The first write into a page whose refcount is
// above one (an append, or the rescan of a rollback) first copies the page to
// a new physical page (the valid K/V of every layer and the summaries), drops
// one reference to the old page and updates that branch's page table. A
// write in one branch therefore never changes the other's keys or summaries.
//
// # Concurrency
//
//   - Operations on different sequences may run in parallel.
//   - Each sequence has one writer at a time: every operation on a sequence
//     takes its mutex, so operations on the same sequence serialize.
//   - The free list and refcounts are guarded by their own mutex, the
//     sequence map by an RWMutex; the lock order is sequence, map, pool.
//   - Readers of page contents (kernels reading the arrays returned by
//     [Store.Layer]) are not synchronized by the store. They must not run
//     concurrently with writers (Append, Rollback, Release) of the same
//     sequence; the shard serializes the decode step of a sequence with its
//     appends. Sealed shared pages are never written, so a forked sibling may
//     be read while the other branch appends (the writer copies the shared
//     tail before touching it).
//   - The read API ([Store.AppendPageTable], [Store.View], [Store.Layer],
//     [Store.PageKV], [Store.PageSummary]) does not allocate.
package pagestore
