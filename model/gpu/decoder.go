package gpu

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/model"
)

// Decoder runs decode steps of model.Attention sequences on the
// executor, with model.Model.DecodeBatch's contract, so that a serving
// loop written for the CPU executor decodes on the device: every
// sequence must be a model.BatchAttention (an EngineAttention, or a
// wrapper of one) whose pages live on the executor's device, joining a
// batched step (DecodeRow's ok) with default step options. The sequences
// of one Stepper decode in one Decode call of the executor (the weights
// stream once for them), MaxBatch at a time; the batch's Steppers in
// turn. Each sequence's
// BatchAttention.Decoded learns every layer's plan and times (its q, k,
// v and output stay on the device: Decoded gets nil slices), and the
// logits of every row come back to the host (for the caller's sampling).
type Decoder struct {
	X *Executor
}

// DecodeBatch implements the serving loop's decode step (see
// model.Model.DecodeBatch): bad input (ErrBadInput) changes nothing;
// when a Stepper's step fails, its sequences fail (a *model.BatchError
// names them; they hold the step's token in some layers: release them)
// while the other Steppers' complete.
func (d *Decoder) DecodeBatch(ctx context.Context, attns []model.Attention, tokens []int) ([][]float32, error) {
	_, _, logits, err := d.decode(ctx, attns, tokens, nil, nil)
	return logits, err
}

// DecodeSample is DecodeBatch with each sequence's next token picked on
// the device (params[i]: kernels.SampleParams, which model.Sampler.Params
// gives; its Validate errors are ErrBadInput, refused before anything
// runs): it returns the tokens, each sequence's argmax (what a greedy
// pick would have been) and the logits only of the sequences whose
// want[i] is set (logprobs; nil for the others), so that a step copies
// no logits to the host unless asked. The error contract is
// DecodeBatch's.
func (d *Decoder) DecodeSample(ctx context.Context, attns []model.Attention, tokens []int, params []kernels.SampleParams, want []bool) ([]int, []int, [][]float32, error) {
	switch {
	case len(params) != len(attns) || len(want) != len(attns):
		return nil, nil, nil, fmt.Errorf("%w: decode batch of %d sequences with %d sampling parameters and %d logits wanted", ErrBadInput, len(attns), len(params), len(want))
	}
	for i, p := range params {
		if err := p.Validate(); err != nil {
			return nil, nil, nil, fmt.Errorf("%w: decode batch: sequence %d: %v", ErrBadInput, i, err)
		}
	}
	return d.decode(ctx, attns, tokens, params, want)
}

// decode runs the batch's steps: with params nil every row is greedy and
// every row's logits come back (DecodeBatch), else as DecodeSample.
func (d *Decoder) decode(ctx context.Context, attns []model.Attention, tokens []int, params []kernels.SampleParams, want []bool) ([]int, []int, [][]float32, error) {
	x := d.X
	c := x.cfg
	n := len(attns)
	switch {
	case n == 0:
		return nil, nil, nil, fmt.Errorf("%w: decode batch of no sequences", ErrBadInput)
	case len(tokens) != n:
		return nil, nil, nil, fmt.Errorf("%w: decode batch of %d sequences and %d tokens", ErrBadInput, n, len(tokens))
	}
	type group struct {
		st   decode.Stepper
		idx  []int
		rows []Row
	}
	var groups []*group
	by := map[decode.Stepper]*group{}
	seen := map[model.Attention]int{}
	bas := make([]model.BatchAttention, n)
	for i, a := range attns {
		ba, ok := a.(model.BatchAttention)
		if !ok || a == nil {
			return nil, nil, nil, fmt.Errorf("%w: decode batch: sequence %d is not a batch attention (%T)", ErrBadInput, i, a)
		}
		st, row, opt, ok := ba.DecodeRow()
		switch {
		case !ok || st == nil:
			return nil, nil, nil, fmt.Errorf("%w: decode batch: sequence %d asks for steps of its own per layer (diagnostics or a dense comparison run on the CPU executor)", ErrBadInput, i)
		case opt != decode.Options{}:
			return nil, nil, nil, fmt.Errorf("%w: decode batch: sequence %d asks for step options %+v (the executor runs the fused step)", ErrBadInput, i, opt)
		case !reflect.TypeOf(st).Comparable():
			return nil, nil, nil, fmt.Errorf("%w: decode batch: sequence %d's stepper %T is not comparable", ErrBadInput, i, st)
		}
		if reflect.TypeOf(a).Comparable() {
			if j, dup := seen[a]; dup {
				return nil, nil, nil, fmt.Errorf("%w: decode batch: indices %d and %d are the same sequence", ErrBadInput, j, i)
			}
			seen[a] = i
		}
		g := by[st]
		if g == nil || len(g.rows) == x.opt.MaxBatch {
			// A new group: the Stepper's first rows, or the next
			// MaxBatch of them (one more executor step).
			g = &group{st: st}
			by[st] = g
			groups = append(groups, g)
		}
		bas[i] = ba
		g.idx = append(g.idx, i)
		g.rows = append(g.rows, Row{Seq: row.Seq, Token: tokens[i], Pos: a.Len(), Budget: row.Budget, DenseLayers: row.DenseLayers})
	}
	// Check every row before any group runs, so that bad input changes
	// nothing (Decode checks its own rows again).
	for i, t := range tokens {
		if t < 0 || t >= c.VocabSize {
			return nil, nil, nil, fmt.Errorf("%w: decode batch: token %d at index %d outside the vocabulary of %d", ErrBadInput, t, i, c.VocabSize)
		}
		if p := attns[i].Len(); c.MaxPositions > 0 && p+1 > c.MaxPositions {
			return nil, nil, nil, fmt.Errorf("%w: decode batch: index %d: position %d exceeds max_position_embeddings %d", ErrBadInput, i, p, c.MaxPositions)
		}
	}
	out := make([][]float32, n)
	ids, greedy := make([]int, n), make([]int, n)
	errs := make([]error, n)
	failed := false
	for _, g := range groups {
		wantAny := params == nil
		if params != nil {
			for k, i := range g.idx {
				g.rows[k].Sample = params[i]
				wantAny = wantAny || want[i]
			}
		}
		next, err := x.Decode(ctx, g.st, g.rows)
		var logits []float32
		if err == nil && wantAny {
			logits, err = x.Logits(ctx, len(g.rows))
		}
		if err != nil {
			if errors.Is(err, ErrBadInput) && !failed && len(groups) == 1 {
				return nil, nil, nil, err // nothing ran
			}
			for _, i := range g.idx {
				errs[i] = fmt.Errorf("sequence %d: %w", i, err)
			}
			failed = true
			continue
		}
		v := c.VocabSize
		for k, i := range g.idx {
			for li, st := range x.LastSteps(k) {
				bas[i].Decoded(li, nil, nil, nil, nil, st.Plan, st.Time)
			}
			ids[i], greedy[i] = next[k], x.LastGreedy()[k]
			if params == nil || want[i] {
				out[i] = logits[k*v : (k+1)*v]
			}
		}
	}
	if failed {
		return ids, greedy, out, &model.BatchError{Errs: errs}
	}
	return ids, greedy, out, nil
}

// Prefill runs tokens, the next tokens of a's sequence, through the
// executor on the device (Executor.Prefill: its chunks, the attention
// where the pages are) and returns the last token's logits. a must be a
// model.BatchAttention whose Stepper takes device prefills (Prefiller:
// an in-process engine whose pages are on the executor's device) and
// that learns of the tokens (Prefilled, as model.EngineAttention). Bad
// input (ErrBadInput) changes nothing; a failure after the first layer
// ran leaves the sequence with the tokens in some layers: release it.
func (d *Decoder) Prefill(ctx context.Context, a model.Attention, tokens []int) ([]float32, error) {
	ba, ok := a.(model.BatchAttention)
	if !ok || a == nil {
		return nil, fmt.Errorf("%w: prefill: the sequence is not a batch attention (%T)", ErrBadInput, a)
	}
	pr, ok := a.(interface{ Prefilled(n int) })
	if !ok {
		return nil, fmt.Errorf("%w: prefill: the sequence (%T) cannot record a device prefill", ErrBadInput, a)
	}
	st, row, _, ok := ba.DecodeRow()
	if !ok || st == nil {
		return nil, fmt.Errorf("%w: prefill: the sequence has no engine row", ErrBadInput)
	}
	pf, ok := st.(Prefiller)
	if !ok {
		return nil, fmt.Errorf("%w: prefill: the sequence's stepper %T runs no device prefill", ErrBadInput, st)
	}
	logits, err := d.X.Prefill(ctx, pf, row.Seq, tokens, a.Len())
	if err != nil {
		return nil, err
	}
	pr.Prefilled(len(tokens))
	return logits, nil
}
