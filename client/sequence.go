package client

import (
	"context"

	"github.com/questrt/questrt/decode"
)

// Sequence is one sequence of a cluster as the model drives it
// (model.NewAttentionOf): appends, and steps through the client's
// Stepper, batched with other sequences, or of one layer
// (decode.Batch.Layers) for diagnostics and dense comparisons.
type Sequence struct {
	C  *Client
	ID string
}

// Append appends tokens to one layer.
func (s Sequence) Append(ctx context.Context, layer int, k, v []float32) error {
	return s.C.Append(ctx, s.ID, layer, k, v)
}

// Stepper is the client (the sequence's steps run through its Steps
// stream); SeqID its handle there.
func (s Sequence) Stepper() decode.Stepper { return s.C }

// SeqID returns the sequence's handle in the client's Stepper.
func (s Sequence) SeqID() decode.SeqID { return s.C.Handle(s.ID) }

// Fork makes a child sharing the parent's pages.
func (s Sequence) Fork(ctx context.Context) (Sequence, error) {
	id, err := s.C.Fork(ctx, s.ID)
	return Sequence{s.C, id}, err
}

// Release frees the sequence.
func (s Sequence) Release(ctx context.Context) error { return s.C.Release(ctx, s.ID) }
