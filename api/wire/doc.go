// Package wire converts between Go values and the messages that the
// worker API (api/worker/v1) and the client API (api/decode/v1) share:
// tensors (workerv1.Tensor: raw little-endian bytes with a dtype and a
// shape) and the selection policy of a grid config (workerv1.Policy as
// plan.Policy).
//
// It is a leaf: it imports the generated messages and plan, nothing of
// the runtime, so that the Go client (client) decodes what the
// nodes send without importing them. worker/remote builds its message
// codecs on it.
//
// A nil slice travels as an absent Tensor (nil, or an empty message) and
// comes back nil from the Decode functions; an empty one travels with a
// zero in its shape and comes back empty. Decoders refuse what does not
// fit the wanted shape, naming the reason; [Float32s] and [Int32s] also
// name the field and wrap [ErrBadTensor].
package wire
