package kernels

import (
	"context"

	"github.com/questrt/questrt/decode"
)

// TensorStepper is a QueuedStepper whose pools live in the memory of one
// device, and which takes a caller's tensors in that memory in place: a
// model executor on the same device hands over q and the new tokens'
// k and v, and gets o back, without copies through the host and without
// a host synchronisation per layer (decode.Tensor says how a device view
// is ordered on its stream).
type TensorStepper interface {
	QueuedStepper
	// Device is the device whose memory the backend's pools live in.
	Device() decode.Device
	// CheckTensor reports whether t is a view of n floats this backend
	// can read and write in place (its device, a stream it orders its
	// work on, an address it can use): nil, or an error wrapping
	// decode.ErrDeviceTensor (or naming the length). Callers check every
	// tensor of a call with it before they change any state.
	CheckTensor(what string, t decode.Tensor, n int) error
	// StepTensor queues the step of StepQueued with q read from, and o
	// and lse written to, device tensors on Device: after what was
	// queued on q's stream, and ordered before what is queued on o's
	// stream after it returns. It checks shapes and devices, not
	// values. lse may be the zero Tensor: the caller does not want it.
	// b, plan and lists are read before it returns, as for StepQueued;
	// a failure of the queued work surfaces at Sync.
	StepTensor(ctx context.Context, s Shape, l Layer, b *Batch, q decode.Tensor, plan *TopKPlan, lists *Lists, o, lse decode.Tensor) error
	// WriteTokensTensor is DeviceStore.WriteTokens with the tokens'
	// k and v in device tensors on Device, read in their stream's order;
	// it widens the summaries on the device as WriteTokens does.
	WriteTokensTensor(ctx context.Context, pool any, pages []int32, slot int, k, v decode.Tensor) error
}

// PrefillAttender is implemented by TensorSteppers that run the causal
// attention of a prefill chunk over a sequence's pages on their device.
type PrefillAttender interface {
	// PrefillTensor queues o = the causal attention of the n queries q
	// (device tensors on Device, [n][QHeads][HeadDim]), those of the
	// sequence's tokens at positions start .. start+n-1, over its keys
	// and values at positions 0 .. start+i for query i: pages of pool
	// (a DeviceStore pool of s's KV heads) listed by sequence seq's
	// table in set (DeviceStore.WriteTable), which must cover start+n
	// positions. The chunk's own keys and values must be written before
	// (WriteTokensTensor, in stream order). It checks shapes and the
	// table's length, not values; a failure of the queued work surfaces
	// at Sync.
	PrefillTensor(ctx context.Context, s Shape, pool, set any, seq uint64, start, n int, q, o decode.Tensor) error
}
