package model

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// EngineConfig returns an engine configuration for a model's geometry:
// policy p (its page size becomes the engine's), a pool of capacityPages
// pages per shard, one shard (set CP and TP on the result for more).
func EngineConfig(g Geometry, p plan.Policy, capacityPages int) engine.Config {
	c := engine.DefaultConfig()
	c.Layers = g.Layers
	c.Geometry = plan.Geometry{QHeads: g.Heads, KVHeads: g.KVHeads, HeadDim: g.HeadDim, PageSize: p.PageSize, DType: plan.Float32}
	c.Policy = p
	c.CapacityPages = capacityPages
	return c
}

// EngineAttention is one sequence of an in-process engine driven as an
// [Attention]. Prefill of an empty sequence computes causal dense
// attention on the host (the tiled float32 kernel of [Dense]) and appends
// the post-RoPE keys and values to the engine's pages, which builds their
// summaries; every decode step is an engine step (append, then Quest
// selection and sparse paged attention under the engine's policy, or
// dense attention where the plan is dense). Tokens added to a sequence
// that is not empty with Prefill are run as dense engine steps, one
// token at a time.
type EngineAttention struct {
	s    Sequence
	g    Geometry
	lens []int

	// Budget is the token budget of decode steps (0: the policy's).
	Budget int
	// Options are passed to every decode step (Diagnostics for recall
	// and mass recall, ForceDense for a dense baseline on the same pages).
	Options engine.StepOptions
	// Compare runs, after each decode step of a layer, a dense step over
	// the same pages and records the output's per-head cosine and relative
	// L2 error against it (StepInfo.Cosine, RelL2).
	Compare bool
	// Workers is the goroutines of the prefill kernel (0: GOMAXPROCS).
	Workers int

	res, dense engine.Result
	steps      []StepInfo
}

// StepInfo is what one layer of the last decode step did.
type StepInfo struct {
	Layer int
	// Plan is the engine's page plan for the step.
	Plan plan.Plan
	// PagesRead and PagesTotal count (KV head, page) pairs read vs those
	// dense attention reads. Without diagnostics, a per_head policy is
	// counted as if every KV head read Plan.Reads() pages.
	PagesRead, PagesTotal int
	// Time is the engine's phase times.
	Time engine.Times
	// Diag reports the engine's diagnostics (Options.Diagnostics).
	Diag bool
	// Recall of the dense top-R tokens, attention-mass recall 1 - eps
	// (mean and worst query head): valid when Diag.
	Recall, MassRecall, MinMassRecall float64
	// HeadRecall and HeadMassRecall are Recall and MassRecall per query
	// head: valid when Diag.
	HeadRecall, HeadMassRecall []float64
	// SlackP50, SlackP90 and SlackMax summarize the page slack g_p(q) =
	// U_p(q) - max_r q.k_r over the step's (query head, page) pairs, in
	// logit units (shard.PageSlack; every shard.SlackStride-th page of a
	// long sequence): valid when Diag (NaN when the attention cannot
	// compute it).
	SlackP50, SlackP90, SlackMax float64
	// Cosine and RelL2 per query head of the output against dense
	// attention on the same pages: set when Compare.
	Cosine, RelL2 []float64
}

// Sequence is one sequence of an engine as EngineAttention drives it: the
// in-process engine's (NewEngineAttention), or a cluster's through its
// client (model/clusterseq.Sequence). Step runs one layer for this sequence
// alone; r.Seq is ignored.
type Sequence interface {
	Append(ctx context.Context, layer int, k, v []float32) error
	Step(ctx context.Context, layer int, r engine.Request, opt engine.StepOptions, res *engine.Result) error
	ForkSequence(ctx context.Context) (Sequence, error)
	Release(ctx context.Context) error
}

// engineSeq is a sequence of an in-process engine.
type engineSeq struct {
	e  *engine.Engine
	id engine.SeqID
}

func (s engineSeq) Append(ctx context.Context, layer int, k, v []float32) error {
	return s.e.AppendContext(ctx, s.id, layer, k, v)
}

func (s engineSeq) Step(ctx context.Context, layer int, r engine.Request, opt engine.StepOptions, res *engine.Result) error {
	r.Seq = s.id
	return s.e.Step(ctx, layer, []engine.Request{r}, opt, res)
}

func (s engineSeq) ForkSequence(ctx context.Context) (Sequence, error) {
	id, err := s.e.ForkContext(ctx, s.id)
	return engineSeq{s.e, id}, err
}

func (s engineSeq) Release(context.Context) error { return s.e.Release(s.id) }

func (s engineSeq) Stepper() decode.Stepper { return s.e }

func (s engineSeq) SeqID() decode.SeqID { return s.id }

// StepperSequence is a [Sequence] whose decode steps can run batched
// with other sequences of its Stepper (see [BatchAttention]).
type StepperSequence interface {
	Sequence
	// Stepper is the runner of the sequence's steps; SeqID its id there.
	Stepper() decode.Stepper
	SeqID() decode.SeqID
}

// DecodeRow implements [BatchAttention]: the sequence joins a batched
// step of its Stepper when it has one (a [StepperSequence]) and neither
// Options.Diagnostics nor Compare asks for a step of its own per layer.
// Options.ForceDense makes every layer of the row dense.
func (a *EngineAttention) DecodeRow() (decode.Stepper, decode.Row, decode.Options, bool) {
	ss, ok := a.s.(StepperSequence)
	if !ok {
		return nil, decode.Row{}, decode.Options{}, false
	}
	if a.Options.Diagnostics || a.Compare {
		// Steps of its own per layer, on the same Stepper.
		return ss.Stepper(), decode.Row{}, decode.Options{}, false
	}
	row := decode.Row{Seq: ss.SeqID(), New: true, Budget: a.Budget}
	if a.Options.ForceDense {
		row.DenseLayers = a.g.Layers
	}
	return ss.Stepper(), row, decode.Options{Phased: a.Options.Phased}, true
}

// Decoded implements [BatchAttention]: the layer holds one more token,
// and Steps reports the layer's plan and times.
func (a *EngineAttention) Decoded(layer int, q, k, v, out []float32, pl plan.Plan, t decode.Times) {
	a.lens[layer]++
	a.steps[layer] = StepInfo{Layer: layer, Plan: pl, Time: t, PagesRead: pl.Reads() * a.g.KVHeads, PagesTotal: pl.Pages * a.g.KVHeads}
}

// NewSequenceAttention drives sequence s, which must be empty and of
// geometry g (the caller checks), as an [Attention].
func NewSequenceAttention(s Sequence, g Geometry) *EngineAttention {
	return &EngineAttention{s: s, g: g, lens: make([]int, g.Layers), steps: make([]StepInfo, g.Layers)}
}

// NewEngineAttention creates an empty sequence in e (striped placement)
// for a model of geometry g, which must match the engine's.
func NewEngineAttention(e *engine.Engine, g Geometry) (*EngineAttention, error) {
	c := e.Config()
	if c.Layers != g.Layers || c.QHeads != g.Heads || c.KVHeads != g.KVHeads || c.HeadDim != g.HeadDim {
		return nil, fmt.Errorf("engine attention: engine of %d layers, %d/%d heads of %d for a model of %d layers, %d/%d heads of %d",
			c.Layers, c.QHeads, c.KVHeads, c.HeadDim, g.Layers, g.Heads, g.KVHeads, g.HeadDim)
	}
	id, err := e.Create(plan.Striped)
	if err != nil {
		return nil, fmt.Errorf("engine attention: %w", err)
	}
	return NewSequenceAttention(engineSeq{e, id}, g), nil
}

// Len returns the tokens of the last layer.
func (a *EngineAttention) Len() int { return a.lens[len(a.lens)-1] }

// Fork returns a new sequence sharing every page with this one
// (copy-on-write tail), with the same settings.
func (a *EngineAttention) Fork() (*EngineAttention, error) {
	s, err := a.s.ForkSequence(context.Background())
	if err != nil {
		return nil, fmt.Errorf("engine attention: %w", err)
	}
	b := &EngineAttention{s: s, g: a.g, lens: append([]int(nil), a.lens...), steps: make([]StepInfo, a.g.Layers),
		Budget: a.Budget, Options: a.Options, Compare: a.Compare, Workers: a.Workers}
	return b, nil
}

// Release frees the sequence in the engine.
func (a *EngineAttention) Release() error { return a.s.Release(context.Background()) }

// Steps returns, per layer, what the last decode step did (valid until
// the next step; zero before the first).
func (a *EngineAttention) Steps() []StepInfo { return a.steps }

// KVSource is a cache whose keys and values can be read back, such as
// [Dense] and [Reference].
type KVSource interface {
	Len() int
	KV(layer int) (k, v []float32)
}

// Load appends every token of src to the empty sequence: the keys and
// values a dense prefill recorded, so one prefill serves several engines.
func (a *EngineAttention) Load(src KVSource) error {
	if a.Len() != 0 {
		return errors.New("engine attention: load into a sequence that is not empty")
	}
	for l := range a.g.Layers {
		k, v := src.KV(l)
		if len(k) == 0 {
			continue
		}
		if err := a.s.Append(context.Background(), l, k, v); err != nil {
			return fmt.Errorf("engine attention: load layer %d: %w", l, err)
		}
		a.lens[l] = len(k) / (a.g.KVHeads * a.g.HeadDim)
	}
	return nil
}

// Prefilled records n tokens appended to every layer of the sequence by
// a prefill that ran elsewhere (the device executor's, on the engine
// directly), so that Len and the next steps count them.
func (a *EngineAttention) Prefilled(n int) {
	for l := range a.lens {
		a.lens[l] += n
	}
}

// Prefill attends densely and appends the tokens to the engine.
func (a *EngineAttention) Prefill(ctx context.Context, layer int, q, k, v, out []float32) error {
	n := a.g.tokens(q)
	if err := a.g.check(layer, n, q, k, v, out); err != nil {
		return err
	}
	if a.lens[layer] > 0 {
		// Later tokens of a sequence: dense engine steps.
		qd, kvd := a.g.Heads*a.g.HeadDim, a.g.KVHeads*a.g.HeadDim
		for t := range n {
			req := engine.Request{Q: q[t*qd : (t+1)*qd], K: k[t*kvd : (t+1)*kvd], V: v[t*kvd : (t+1)*kvd]}
			if err := a.s.Step(ctx, layer, req, engine.StepOptions{ForceDense: true}, &a.res); err != nil {
				return err
			}
			a.lens[layer]++
			copy(out[t*qd:(t+1)*qd], a.res.O)
		}
		return nil
	}
	if err := causalAttention(ctx, a.Workers, a.g, q, n, k, v, 0, out); err != nil {
		return err
	}
	if err := a.s.Append(ctx, layer, k, v); err != nil {
		return err
	}
	a.lens[layer] = n
	return nil
}

// Decode runs one engine step: append k, v, select pages, attend.
func (a *EngineAttention) Decode(ctx context.Context, layer int, q, k, v, out []float32) error {
	if err := a.g.check(layer, 1, q, k, v, out); err != nil {
		return err
	}
	req := engine.Request{Q: q, K: k, V: v, BudgetTokens: a.Budget}
	if err := a.s.Step(ctx, layer, req, a.Options, &a.res); err != nil {
		return err
	}
	a.lens[layer]++
	copy(out, a.res.O)
	pl := a.res.Plans[0]
	st := StepInfo{Layer: layer, Plan: pl, Time: a.res.Time,
		PagesRead: pl.Reads() * a.g.KVHeads, PagesTotal: pl.Pages * a.g.KVHeads}
	if len(a.res.Diag) > 0 {
		dg := a.res.Diag[0]
		st.Diag = true
		st.Recall, st.MassRecall, st.MinMassRecall = dg.Recall, dg.MassRecall, dg.MinMassRecall
		st.HeadRecall, st.HeadMassRecall = dg.HeadRecall, dg.HeadMassRecall
		st.SlackP50, st.SlackP90, st.SlackMax = dg.SlackP50, dg.SlackP90, dg.SlackMax
		st.PagesRead, st.PagesTotal = dg.PagesRead, dg.PagesTotal
	}
	if a.Compare {
		dreq := engine.Request{Q: q}
		if err := a.s.Step(ctx, layer, dreq, engine.StepOptions{ForceDense: true}, &a.dense); err != nil {
			return fmt.Errorf("dense comparison: %w", err)
		}
		d := a.g.HeadDim
		st.Cosine = make([]float64, a.g.Heads)
		st.RelL2 = make([]float64, a.g.Heads)
		for h := range a.g.Heads {
			st.Cosine[h], st.RelL2[h] = compare(out[h*d:(h+1)*d], a.dense.O[h*d:(h+1)*d])
		}
	}
	a.steps[layer] = st
	return nil
}

// compare returns the cosine of o and ref and ||o - ref|| / ||ref||, in
// float64 (cosine 1 and error 0 when both are zero).
func compare(o, ref []float32) (cos, rel float64) {
	var oo, rr, or, dd float64
	for i, r := range ref {
		x, y := float64(o[i]), float64(r)
		oo += x * x
		rr += y * y
		or += x * y
		dd += (x - y) * (x - y)
	}
	switch {
	case oo == 0 && rr == 0:
		return 1, 0
	case oo == 0 || rr == 0:
		return 0, math.Inf(1)
	}
	return or / math.Sqrt(oo*rr), math.Sqrt(dd / rr)
}

// rollbacker is a [Sequence] that can drop its last tokens (the
// in-process engine's).
type rollbacker interface {
	Rollback(ctx context.Context, n int) error
}

func (s engineSeq) Rollback(ctx context.Context, n int) error {
	return s.e.RollbackContext(ctx, s.id, n)
}

// ForkPrefix returns a new sequence holding the first tokens tokens of
// this one (every layer at the same length), with the same settings: a
// fork (pages shared, copy-on-write tail) rolled back to tokens. At a
// page boundary it shares the pages it holds, summaries included, and
// the next token starts a page of its own. A sequence that cannot roll
// back (a cluster's) refuses a prefix shorter than itself.
func (a *EngineAttention) ForkPrefix(tokens int) (*EngineAttention, error) {
	n := a.Len()
	for _, l := range a.lens {
		if l != n {
			return nil, errors.New("engine attention: fork prefix of a sequence whose layers differ in length")
		}
	}
	if tokens < 0 || tokens > n {
		return nil, fmt.Errorf("engine attention: fork prefix of %d tokens of a sequence of %d", tokens, n)
	}
	if _, ok := a.s.(rollbacker); tokens < n && !ok {
		return nil, fmt.Errorf("engine attention: fork prefix: the sequence (%T) cannot roll back", a.s)
	}
	b, err := a.Fork()
	if err != nil {
		return nil, err
	}
	if tokens < n {
		if err := b.s.(rollbacker).Rollback(context.Background(), n-tokens); err != nil {
			_ = b.Release()
			return nil, fmt.Errorf("engine attention: fork prefix: %w", err)
		}
		for l := range b.lens {
			b.lens[l] = tokens
		}
	}
	return b, nil
}

// Extend appends to every layer the tokens src holds beyond the
// sequence's: the keys and values a dense prefill recorded on top of
// this sequence's own (src's first tokens must be this sequence's, as
// from [NewDenseFrom]).
func (a *EngineAttention) Extend(src KVSource) error {
	kvd := a.g.KVHeads * a.g.HeadDim
	for l := range a.g.Layers {
		k, v := src.KV(l)
		have := a.lens[l] * kvd
		if len(k) < have {
			return fmt.Errorf("engine attention: extend layer %d: the source holds %d tokens, the sequence %d", l, len(k)/kvd, a.lens[l])
		}
		if len(k) == have {
			continue
		}
		if err := a.s.Append(context.Background(), l, k[have:], v[have:]); err != nil {
			return fmt.Errorf("engine attention: extend layer %d: %w", l, err)
		}
		a.lens[l] = len(k) / kvd
	}
	return nil
}
