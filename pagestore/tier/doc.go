// Package tier defines where the K/V payload of a page lives when it is not
// on the device: a [Tier] holds fixed-size page payloads in numbered slots.
// Host memory ([Memory], and later pinned RAM) and disk
// (pagestore/disktier) are tiers; summaries never enter one, they stay
// resident on the primary tier so that scoring never waits for a tier.
//
// A tier knows nothing about sequences, page tables or which page sits in
// which slot: the page store's residency map owns that and hands a tier
// opaque bytes. Slots are allocated by the caller (see [Allocator]).
//
// # Payloads
//
// A payload is one physical page's K and V of every layer: a fixed size
// given by the geometry ([PagePayloadBytes]),
//
//	layers x 2 x KVHeads x PageSize x HeadDim x bytes per element
//
// (2 MiB for a Llama-3.1-8B page of 16 bf16 tokens). The tier never looks
// inside a payload. The layout the page store is expected to pack is
// layer-major, K before V in each layer, each one the page's
// [KVHeads][PageSize][HeadDim] block of the pool arrays as stored
// (little-endian elements); padding slots of a tail page are copied as they
// are. Every Write and Read moves exactly [Tier.PayloadBytes] bytes.
//
// # Slot states
//
// A slot is empty or holds one payload. Write fills it (replacing what it
// held), Free empties it. Reading an empty slot (never written, or freed)
// returns [ErrEmpty] and never bytes of an earlier payload, so a slot
// recycled through Free cannot leak stale data.
//
// # Threading contract
//
// Every method of a Tier is safe for concurrent use by any number of
// goroutines:
//
//   - Calls on distinct slots are independent: neither waits for the other
//     beyond the limits of the medium (and implementation locks striped by
//     slot), and neither changes what the other slot holds.
//   - Calls on the same slot are linearizable: each takes effect at one
//     instant between its start and its return. A Read that overlaps Writes
//     of its slot returns one whole payload (that of the last Write before
//     it took effect) or ErrEmpty, never a mix of two.
//   - Write copies (or persists) payload before it returns and does not keep
//     it; Read fills dst before it returns and does not keep it. The caller
//     must not change payload, or use dst, while the call runs.
//   - Close waits for calls in flight; calls that start after Close has
//     started return [ErrClosed]. Close may be called more than once: calls
//     after the first return nil. Slots and PayloadBytes work after Close.
//
// # Contexts
//
// A call whose ctx is already done returns an error wrapping ctx.Err() and
// changes nothing. Once started, a call runs to completion (disk I/O cannot
// be interrupted halfway without leaving a slot undefined); waits that are
// not I/O, such as [Faulty]'s delays, end early when ctx ends.
//
// # Errors
//
// Every error wraps a sentinel of this package ([ErrEmpty], [ErrCorrupt],
// [ErrClosed], [ErrSlot], [ErrSize], [ErrInjected]), a context error, or an
// I/O error of the medium, with the operation and the slot (and for files,
// the path) as context; test with errors.Is. Calls that fail with ErrSlot,
// ErrSize, ErrClosed or a context error change nothing. When a Read fails,
// dst holds no payload bytes: it is unchanged or zeroed. When a Write fails
// for any other reason (an I/O error), the slot's content is undefined until
// the next successful Write or Free: a Read returns the old payload, the new
// one or an error, never a mix without an error.
//
// # Conformance
//
// Package tiertest is the suite every Tier passes ([Memory] and [Faulty]
// here, the disk tier in pagestore/disktier), in the style of
// testing/fstest.
package tier
