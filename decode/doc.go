// Package decode is the one vocabulary of a decode step and the seam every
// runner of steps implements: the in-process engine (one grid), the cluster
// coordinator, the Go client of a questd, and the host reference of the
// tests.
//
// A step is one token of a batch of sequences through every layer of a
// model. The caller owns the layer loop, as with FlashInfer's plan/run and
// etcd raft's Ready/Advance: Stepper.Begin validates the batch and plans
// it once (one message per worker carrying the plan), Step.Layer runs one
// layer for the whole batch (the query heads and new tokens in, the
// merged attention output out), Step.End closes the step. There is no
// callback: the model computes the next layer's inputs between two Layer
// calls.
//
//	st, err := stepper.Begin(ctx, decode.Batch{Rows: rows})
//	if err != nil { ... }
//	defer st.End(ctx)
//	for layer := range layers {
//		q, k, v := ...                  // the model's projections and RoPE
//		res.O = decode.Host(out)
//		if err := st.Layer(ctx, layer, decode.Host(q), decode.Host(k), decode.Host(v), &res); err != nil { ... }
//	}
//
// Tensors are views (Tensor) that live in host memory or in the memory of
// a named device, ordered on a stream. A runner whose data is on the
// caller's device takes device tensors in place: Layer queues the layer
// there and returns, End waits once for the whole step (the in-process
// engine of one rank on a kernels.TensorStepper does). Every other runner
// refuses them with ErrDeviceTensor, changing nothing, and its caller
// copies to the host.
//
// The package imports only plan: every layer of the runtime may import it.
// Its conformance suite is decode/decodetest.
package decode
