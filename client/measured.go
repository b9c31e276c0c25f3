package client

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/decode"
)

// measuredStep is a step with decode.Options.Diagnostics: the Steps
// stream carries no diagnostics, so each Layer is a Step call of its
// own (one layer, its own step on the coordinator, which measures it
// against dense attention). Nothing is held between layers.
type measuredStep struct {
	*clientStep
	opt StepOptions
}

// beginMeasured opens st, checked by Begin, as a measured step of b.
func (c *Client) beginMeasured(st *clientStep, b decode.Batch) (decode.Step, error) {
	for i, r := range b.Rows {
		switch {
		case r.Budget < 0 || (r.Budget > 0 && r.Budget < st.g.PageSize):
			return nil, fmt.Errorf("client: begin step: rows[%d]: %w: budget %d tokens is below one page", i, decode.ErrBadInput, r.Budget)
		case r.DenseLayers != 0:
			return nil, fmt.Errorf("client: begin step: rows[%d]: %w: a step with diagnostics takes no dense layers (set ForceDense)", i, decode.ErrBadInput)
		}
	}
	st.c = c
	return &measuredStep{clientStep: st, opt: StepOptions{ForceDense: b.Options.ForceDense, Phased: b.Options.Phased, Diagnostics: true}}, nil
}

// Layer implements decode.Step: one Step call. A failed call fails the
// step (decode.ErrStepFailed), bad input it found too; the new tokens
// of the layers that ran stay appended.
func (st *measuredStep) Layer(ctx context.Context, layer int, q, k, v decode.Tensor, res *decode.Result) error {
	switch {
	case st.ended:
		return fmt.Errorf("client: layer %d: %w", layer, decode.ErrStepEnded)
	case st.failed != nil:
		return fmt.Errorf("client: layer %d: %w: %w", layer, decode.ErrStepFailed, st.failed)
	case layer >= st.last || layer < st.next:
		return fmt.Errorf("client: layer %d: %w: the step runs layers %d..%d in increasing order, each once; the next may be %d", layer, decode.ErrBadInput, st.next, st.last-1, st.next)
	}
	qd, kd, vd, out, err := st.inputs(layer, q, k, v, res)
	if err != nil {
		return err
	}
	g := st.g
	qr, kr := g.QHeads*g.HeadDim, g.KVHeads*g.HeadDim
	items := make([]Item, len(st.rows))
	j := 0
	for i, r := range st.rows {
		items[i] = Item{Seq: st.ids[i], Q: qd[i*qr : (i+1)*qr], BudgetTokens: r.Budget}
		if r.New {
			items[i].K, items[i].V = kd[j*kr:(j+1)*kr], vd[j*kr:(j+1)*kr]
			j++
		}
	}
	st.next = layer + 1
	r, err := st.c.Step(ctx, layer, items, st.opt)
	if err != nil {
		st.failed = fmt.Errorf("%w: %w", decode.ErrStepFailed, stepErr(fmt.Sprintf("layer %d", layer), err))
		return st.failed
	}
	copy(out, r.O)
	res.LSE = append(res.LSE[:0], r.LSE...)
	res.Plans = append(res.Plans[:0], r.Plans...)
	res.Time = decode.Times{Score: r.Time.Score, TopK: r.Time.TopK, Select: r.Time.Select, Attend: r.Time.Attend,
		Merge: r.Time.Merge, Fused: r.Time.Fused, Total: r.Total}
	res.Diag = res.Diag[:0]
	for _, d := range r.Diag {
		res.Diag = append(res.Diag, d.Diagnostics)
	}
	return nil
}

// End implements decode.Step (nothing is open between layers).
func (st *measuredStep) End(context.Context) error {
	if st.ended {
		return decode.ErrStepEnded
	}
	st.ended = true
	return nil
}
