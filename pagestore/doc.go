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
// With [Config.SubBoxes] = c > 1 (multi-box summaries) a layer also has
//
//	Sub      [Capacity][KVHeads][c][2][HeadDim]
//
// c records per (page, KV head), record i the box of the slots [i*S/c,
// (i+1)*S/c) that hold valid keys (empty when none does), kept by every
// change that keeps Summary (append, recycle, copy-on-write, rescan); the
// page record stays the union of its sub-boxes.
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
// # Offload
//
// With [Config.DeviceBudget] > 0 the pool arrays hold the K/V of at most
// DeviceBudget pages (the device pool; host memory for this CPU store)
// and the others live in a [tier.Tier] ([Config.Tier]; a host
// tier.Memory by default, or a pagestore/disktier.Tier). Three index
// spaces, kept apart:
//
//   - physical page ids [0, Capacity): page tables, refcounts, summaries
//     (every page's summaries always stay in the pool, so scoring never
//     waits for a tier) and the tier (page p's payload in tier slot p);
//   - device slots [0, DeviceBudget): the K/V pool arrays
//     ([Store.Layer]'s K and V), reached through the page -> slot map
//     ([Store.DeviceSlot], [Store.AppendSlots]; -1 when not resident) and
//     its reverse;
//   - logical pages of a sequence: what the kernels' lists name, read
//     through the page table, unchanged by offload.
//
// A page is resident (it holds a slot), offloaded (only the tier holds
// its K/V) or empty (allocated, nothing written yet). A resident page
// whose tier copy is current is clean: evicting it writes nothing, so a
// sealed page pays one write to the tier in its life, however often it
// comes and goes. Every write of K/V (append, copy-on-write copy) makes
// the page dirty.
//
// fp8 pages (plan.FP8) offload as their stored records, codes and
// scales byte for byte (see fp8.go), from host pools and from a device's
// slot pools alike ([NewWithSlots]).
//
// Pins: each sequence pins its first PinFirst and last PinLast (at least
// one: the tail page appends write) pages; eviction never takes a pinned
// page. Appends, copies and rescans bring the pages they touch in first
// (a write spanning more pages than the device holds goes page by page),
// and [Store.Recall] brings in the pages a step is about to attend,
// evicting unpinned pages that the step does not need, chosen by the
// [Eviction] policy: least recently used, or lowest decayed selection
// count. Recycling a page drops its slot and its tier copy from the maps,
// so a page handed out again starts empty with a fresh summary and can
// never read a previous owner's payload.
//
// On a device ([NewWithSlots]) the same bookkeeping drives a [SlotData]:
// the device holds the summaries of every page and the K/V of the
// DeviceBudget slots, the tier is host memory the device maps, and the
// payload moves are queued device copies (every save, then every load,
// issued at the end of each operation, in stream order with the kernels
// that read the slots), not copies through the host arrays.
//
// An operation that needs a slot when every slot is pinned (or needed by
// the same operation) fails with [ErrDeviceFull] before changing
// anything; the caller sizes the budget for the pinned pages of all live
// sequences plus what one step attends. A tier failure fails the
// operation that needed the page with the tier's error wrapped (Recall,
// Rollback: before any change; Append: as any [ErrData]); the residency
// maps stay consistent ([Store.CheckResidency]). [Store.ResidencyStats]
// counts residents, hits, misses, bytes moved each way, evictions and the
// time spent in recalls.
//
// Prefetch: [Store.ReservePrefetch] reserves device slots for pages a
// coming step is expected to attend (free slots, or slots of clean
// unpinned pages that neither the caller's step nor the prediction
// needs: a prefetch never writes to the tier), and [Store.LoadPrefetch]
// reads a reservation from the tier into its slot without holding the
// residency lock, then publishes it; until then the page is not
// resident and nobody reads the slot. An operation that needs a
// reserved page waits for a read in flight or, when the read has not
// started, reads the page itself into the reserved slot; one that lacks
// room gives back reservations whose read has not started and waits for
// reads in flight. So a page is read into one slot, once, and a
// reservation never makes an operation fail with ErrDeviceFull. A page
// recycled while its prefetch is in flight is discarded when the read
// ends. ResidencyStats counts reservations, reads, hits, waste and the
// time operations waited.
//
// With DeviceBudget 0 none of this exists: the arrays are indexed by
// physical page id and no operation does any residency work.
//
// # Persistence
//
// With [Config.DataDir] set the store persists its sequences and [New]
// recovers them. Layout of the directory:
//
//	DIR/store.db       bbolt, the store's metadata (small values only):
//	                   meta/format (Layers, KVHeads, HeadDim, PageSize),
//	                   meta/next_id; seqs/<id> a manifest per sequence
//	                   (per-layer lengths, page count, length record);
//	                   tables/<id><chunk> its page -> slot list, 1024
//	                   slots per value; slots/<slot> the CRC32C of the
//	                   payload in that slot; sums/<slot> the page's
//	                   summaries (every layer's records, float32 LE)
//	                   with the payload CRC32C they describe (absent in
//	                   directories written before them: the first open
//	                   reads those pages and writes the records). Every
//	                   value carries a CRC32C of its key and bytes.
//	DIR/index.db       the disk tier's own bbolt index (its CRC32C per slot)
//	DIR/slab-NNNNNN    the disk tier's slab files (pagestore/disktier),
//	                   2 x Capacity slots of one page payload each
//	DIR/lengths        format 2: a header (magic, format, layers) and a
//	                   record per live sequence: its id and each layer's
//	                   length, every part with its CRC32C; an append
//	                   writes (not syncs) its layer's 8 bytes. Format 1
//	                   (older directories: the longest layer only) is
//	                   read at open and rewritten in format 2
//
// A second bbolt file, rather than buckets in the disk tier's index,
// keeps disktier unchanged; the disk tier's index must commit a slot
// before a manifest names it, which the order of writes below ensures.
// One store per directory: both bbolt files are locked, and a second open
// fails with [ErrInUse].
//
// What is persisted is, per sequence, its pages sealed in every layer (a
// page whose S slots are full): each one's K/V are written once, to a
// fresh slab slot, when it seals; a sequence's manifest names the slots
// of its sealed pages, so pages shared by a fork or [Store.ForkPrefix]
// are named by every sharer and their refcount after recovery is the
// number of recovered manifests naming them (refcounts are derived, not
// stored: no second copy that can disagree). A slot is never
// overwritten while a committed manifest names it: a rewritten page (a
// rollback into a sealed page, a recovered tail that fills up) goes to a
// new slot and the old one is freed after the commit that stops naming
// it, so a crash at any point leaves a consistent state. A page's
// summaries are committed with its slot record (sums/<slot>); they are
// what recomputing them from the page's keys in slot order gives, bit
// for bit (min and max are exact), which every read of the payload
// checks, so the bound (invariant 1) holds over the stored keys. The tail page (not sealed) is written only by a graceful
// [Store.Close], which persists every sequence in full.
//
// Durability ([Config.Durability]): SyncOnWrite writes and fdatasyncs the
// slabs and commits the manifest (bbolt fsyncs) inside every Create,
// Fork, Append that seals a page, Rollback and Release; SyncPeriodic
// marks the sequence dirty, and a flusher owned by the store (stopped by
// Close) writes the newly sealed pages (write-behind), syncs the slabs
// and commits every dirty manifest in one transaction every
// [Config.SyncInterval], or at [Store.Sync] or Close. A crash loses the
// changes since the last commit: the tokens past the sealed pages (or
// past the tail a Close persisted), and in periodic mode whatever the
// flusher had not committed. The lengths file is written at every append
// without a sync: after a process crash (kill -9) it says exactly how
// many tokens each layer of each sequence lost ([RecoveredSeq.HadLens]);
// after a power loss it may say fewer. A record that fails its check is
// reported ([RecoveryReport.Lengths]) and its losses are unknown.
// Without DataDir nothing of this runs.
//
// Errors: a failed operation on a file of the directory is an
// [*IOError], whose message names the operation and the condition but
// no file (it may reach a client) and which wraps [ErrPersist] and, by
// its operating system error, [ErrDiskFull] (ENOSPC, EDQUOT) or [ErrIO];
// [Config.OnPersistError] gets each one with the file, including the
// periodic flusher's and a Close's ([IOError.Closing]: the tails it
// could not save are lost at a restart, reported as lost tokens). The
// operation took effect in memory; with SyncOnWrite the sequence's next
// append persists again (what failed included), with SyncPeriodic the
// next flush does. The lengths file is best effort: its failures fail
// nothing and are reported once until a write succeeds.
//
// Recovery ([Store.Recovery], a [RecoveryReport]): every sequence whose
// manifest, table chunks, slot records and slab payloads (the disk tier's
// CRC32C and the record's) pass their checks comes back with its id, its
// per-layer lengths, its page table (new physical page ids; sharing
// kept), summaries and the number of tokens it lost (to re-append from
// position Len). A sequence with a failed check is reported damaged with
// its error (wrapping tier.ErrCorrupt) and its last known length, and
// never used; the others are unaffected unless they share the bad page.
// Recovery then rewrites the directory to what it recovered: damaged
// manifests are deleted and slab slots no manifest names (written after
// the last commit, or of freed pages) are freed, so recycled pages never
// bring stale data back. With offload on, recovered pages start in the
// tier (page p in tier slot p), not resident.
//
// [Config.Verify] says when the payloads are read. VerifyAtOpen (the
// default) reads every page at open, as above, and checks a summary
// record where one exists against the keys (a bad one is reported in
// [RecoveryReport.BadSummaries] and rewritten); such a store writes no
// summary records. A VerifyOnRead store writes one with every slot
// record (mapping its metadata file for them at open, so that their
// commits do not remap it as it grows) and, at open, reads the
// metadata and the summary records only (a page without a valid record
// is read at open as above, and its record written): the pool
// holds every recovered page's summaries, and its payload is read,
// checked (checksum, summaries recomputed bit for bit) and put in
// place at the first operation on a sequence naming it that reads its
// pages (not [Store.Len] or [Store.LayerLen]: lengths are metadata),
// or before by the background scrub, owned by the store, paced to
// [Config.ScrubRate] bytes per second and stopped by Close
// ([Store.Scrub] reports it). A
// page that fails then damages only the sequences naming it: each is
// released (its manifest deleted) and its operations return an error
// wrapping [ErrDamaged] and tier.ErrCorrupt. A sequence never used
// since the open is left as committed by Close (its pages unread).
//
// # Concurrency
//
//   - Operations on different sequences may run in parallel.
//   - Each sequence has one writer at a time: every operation on a sequence
//     takes its mutex, so operations on the same sequence serialize.
//   - The free list and refcounts are guarded by their own mutex, the
//     sequence map by an RWMutex, the residency maps of an offloading
//     store by a fourth mutex, held across tier I/O (so residency
//     changes, and the K/V writes of an offloading store, serialize)
//     except a prefetch read ([Store.LoadPrefetch]), which runs
//     without any of the store's locks into its reserved slot; the lock
//     order is sequence, map, pool, residency, persistence. An operation waiting for
//     a prefetch read in flight releases the residency lock meanwhile
//     (it keeps its sequence's lock): a prefetch read must not wait for
//     the store.
//   - Readers of page contents (kernels reading the arrays returned by
//     [Store.Layer]) are not synchronized by the store. They must not run
//     concurrently with writers (Append, Rollback, Release) of the same
//     sequence; the shard serializes the decode step of a sequence with its
//     appends. Sealed shared pages are never written, so a forked sibling may
//     be read while the other branch appends (the writer copies the shared
//     tail before touching it).
//   - The read API ([Store.AppendPageTable], [Store.View], [Store.Layer],
//     [Store.PageKV], [Store.PageSummary], [Store.AppendSlots]) does not
//     allocate.
//   - On an offloading store, kernels reading the K/V pool must also not
//     run concurrently with a [Store.Recall] or a write of another
//     sequence (either may evict what they read); the shard holds its
//     lock from a step's Recall to the end of its attention.
package pagestore
