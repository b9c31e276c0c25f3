package tier

import (
	"context"

	"github.com/questrt/questrt/plan"
)

// Tier holds fixed-size page payloads in slots 0 .. Slots()-1. See the
// package documentation for the slot states, the threading contract
// (safe for concurrent use; calls on one slot are linearizable), contexts
// and errors.
type Tier interface {
	// Slots returns the number of slots.
	Slots() int
	// PayloadBytes returns the size of every payload in bytes.
	PayloadBytes() int
	// Write stores payload (exactly PayloadBytes() bytes) in slot,
	// replacing what the slot held. It does not keep payload.
	Write(ctx context.Context, slot int, payload []byte) error
	// Read copies slot's payload into dst (exactly PayloadBytes() bytes).
	// It returns an error wrapping ErrEmpty for an empty slot and
	// ErrCorrupt for a payload that fails its checks; on error dst holds
	// no payload bytes (unchanged or zeroed).
	Read(ctx context.Context, slot int, dst []byte) error
	// Free empties slot; a later Read returns ErrEmpty until the next
	// Write. Freeing an empty slot returns ErrEmpty and changes nothing.
	Free(ctx context.Context, slot int) error
	// Close releases the tier's resources after the calls in flight;
	// every later call returns ErrClosed. Calls of Close after the first
	// return nil.
	Close() error
}

// PagePayloadBytes returns the payload of one physical page whose K and V
// span layers layers of geometry g:
// layers x 2 x KVHeads x PageSize x HeadDim x g.DType.Bytes(), plus, for
// plan.FP8, the float32 scale of every (layer, K or V, KV head) record
// (layers x 2 x KVHeads x 4). It returns 0 when layers < 1 or g has a
// non-positive size or an unknown type.
//
// For Llama-3.1-8B (32 layers, 8 KV heads, S = 16, D = 128, bf16) it is
// 2 MiB.
func PagePayloadBytes(layers int, g plan.Geometry) int {
	if layers < 1 || g.KVHeads < 1 || g.PageSize < 1 || g.HeadDim < 1 || g.DType.Bytes() == 0 {
		return 0
	}
	if g.DType == plan.FP8 {
		return layers * 2 * (g.PageElems() + 4*g.KVHeads)
	}
	return layers * 2 * g.PageElems() * g.DType.Bytes()
}
