package model

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	"github.com/questrt/questrt/internal/memlimit"
)

// BatchError reports the sequences of a [Model.DecodeBatch] whose
// attention failed; the other sequences decoded.
type BatchError struct {
	// Errs has one entry per sequence of the batch: nil for those that
	// decoded, the attention's error (with its layer) for those that
	// did not.
	Errs []error
}

// Error names how many sequences failed and the first failure.
func (e *BatchError) Error() string {
	var first error
	n := 0
	for _, err := range e.Errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	return fmt.Sprintf("decode batch: %d of %d sequences failed: %v", n, len(e.Errs), first)
}

// Unwrap returns the failures, for errors.Is and errors.As.
func (e *BatchError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// DecodeBatch runs one decode step for several sequences at once:
// tokens[i] goes through the model after the attns[i].Len() tokens that
// sequence i holds (its position), and its key and value are appended
// to attns[i]. The embeddings, norms, RoPE, Linear layers, MLP and LM
// head run over the batch as one [n] token matrix. Attention runs per
// Stepper: the sequences that are [BatchAttention]s of one
// decode.Stepper form one step, opened once before the first layer
// (Begin), run once per layer with all of their rows (Step.Layer) and
// closed after the last (End). Each other sequence runs through its own
// Attention.Decode, in batch order: those of no Stepper, and every
// sequence of a Stepper where one of them needs a step per layer or
// their options differ, or whose Begin refused the batch (the per-layer
// calls then name the sequence at fault). It
// returns every sequence's logits ([VocabSize] each).
//
// Each sequence's logits are bit for bit those of Forward of its one
// token on its own: every row of the batch goes through the same
// float32 operations in the same order as a one-token pass (the matrix
// products compute each output element as one dot product of a token's
// row and a weight row, whatever the number of tokens).
//
// Bad input (ErrBadInput: no sequences, a token outside the vocabulary,
// a position beyond max_position_embeddings, one Attention twice) and a
// batch over the memory limit change nothing. When the attention of
// sequence i fails (for a batched step: of any sequence of its step,
// which fails them all), that sequence leaves the rest of the pass (its
// logits are nil; it holds the step's token in some layers and not in
// others: release it) while the others complete, and the error is a
// *BatchError. A context done between layers fails the whole batch
// (every sequence then holds some layers' tokens; release them).
func (m *Model) DecodeBatch(ctx context.Context, attns []Attention, tokens []int) ([][]float32, error) {
	c := m.Config
	n := len(attns)
	switch {
	case n == 0:
		return nil, fmt.Errorf("%w: decode batch of no sequences", ErrBadInput)
	case len(tokens) != n:
		return nil, fmt.Errorf("%w: decode batch of %d sequences and %d tokens", ErrBadInput, n, len(tokens))
	}
	pos := make([]int, n)
	seen := make(map[Attention]int, n)
	for i, a := range attns {
		if a == nil {
			return nil, fmt.Errorf("%w: decode batch: no attention at index %d", ErrBadInput, i)
		}
		if t := tokens[i]; t < 0 || t >= c.VocabSize {
			return nil, fmt.Errorf("%w: decode batch: token %d at index %d outside the vocabulary of %d", ErrBadInput, t, i, c.VocabSize)
		}
		pos[i] = a.Len()
		if c.MaxPositions > 0 && pos[i]+1 > c.MaxPositions {
			return nil, fmt.Errorf("%w: decode batch: index %d: position %d exceeds max_position_embeddings %d", ErrBadInput, i, pos[i], c.MaxPositions)
		}
		if reflect.TypeOf(a).Comparable() {
			if j, dup := seen[a]; dup {
				return nil, fmt.Errorf("%w: decode batch: indices %d and %d are the same sequence", ErrBadInput, j, i)
			}
			seen[a] = i
		}
	}
	if err := memlimit.Check(fmt.Sprintf("model: activations of a decode batch of %d", n), c.ActivationBytes(n), m.MemoryLimit); err != nil {
		return nil, err
	}
	a := m.newPass(tokens)
	qd, kvd := a.qd, a.kvd
	errs := make([]error, n)
	failed := 0
	groups, alone := m.groupRows(attns)
	fail := func(i int, li int, err error) {
		if errs[i] == nil {
			errs[i] = fmt.Errorf("sequence %d layer %d attention: %w", i, li, err)
			failed++
		}
	}
	defer func() {
		for _, g := range groups {
			g.end(ctx)
		}
	}()
	groups, alone = beginGroups(ctx, groups, alone)
	for li := range m.layers {
		q, k, v := m.attnIn(a, li)
		rows(m.workers, n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				m.rope.apply(q[i*qd:(i+1)*qd], 1, c.Heads, pos[i])
				m.rope.apply(k[i*kvd:(i+1)*kvd], 1, c.KVHeads, pos[i])
			}
		})
		kept := groups[:0]
		for _, g := range groups {
			err := g.layer(ctx, li, q, k, v, a.o, qd, kvd)
			if err != nil && refusedAhead(err) {
				// Begin's refusal, learnt now: the rows go alone from
				// this layer (the step's first) on, which names the rows
				// at fault.
				alone = append(alone, g.idx...)
				slices.Sort(alone)
				continue
			}
			kept = append(kept, g)
			if err != nil {
				for _, i := range g.idx {
					fail(i, li, err)
					clear(a.o[i*qd : (i+1)*qd]) // the row runs on harmlessly; its logits are dropped
				}
			}
		}
		groups = kept
		for _, i := range alone {
			if errs[i] != nil {
				continue
			}
			qi, oi := q[i*qd:(i+1)*qd], a.o[i*qd:(i+1)*qd]
			if err := attns[i].Decode(ctx, li, qi, k[i*kvd:(i+1)*kvd], v[i*kvd:(i+1)*kvd], oi); err != nil {
				fail(i, li, err)
				clear(oi)
			}
		}
		if failed == n {
			return nil, &BatchError{Errs: errs}
		}
		m.attnOut(a, li)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	for _, g := range groups {
		if err := g.end(ctx); err != nil {
			for _, i := range g.idx {
				fail(i, len(m.layers)-1, err)
			}
		}
	}
	vs := c.VocabSize
	logits := m.head(a, 0)
	out := make([][]float32, n)
	for i := range out {
		if errs[i] == nil {
			out[i] = logits[i*vs : (i+1)*vs : (i+1)*vs]
		}
	}
	if failed > 0 {
		return out, &BatchError{Errs: errs}
	}
	return out, nil
}

// FailedIndices returns the batch indices whose attention failed.
func (e *BatchError) FailedIndices() []int {
	var idx []int
	for i, err := range e.Errs {
		if err != nil {
			idx = append(idx, i)
		}
	}
	return idx
}
