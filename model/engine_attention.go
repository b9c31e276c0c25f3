package model

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
)

// Shape returns the model's layer count and the geometry of a layer's
// heads (float32, page size 0: a runner takes the page size of its
// policy), such as engine.ModelConfig builds a runner's configuration
// from.
func (g Geometry) Shape() (layers int, pg plan.Geometry) {
	return g.Layers, plan.Geometry{QHeads: g.Heads, KVHeads: g.KVHeads, HeadDim: g.HeadDim, DType: plan.Float32}
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
	Options decode.Options
	// Compare runs, after each decode step of a layer, a dense step over
	// the same pages and records the output's per-head cosine and relative
	// L2 error against it (StepInfo.Cosine, RelL2).
	Compare bool
	// Workers is the goroutines of the prefill kernel (0: GOMAXPROCS).
	Workers int

	res, dense decode.Result
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
	Time decode.Times
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
	// Stop is the stop-rule replay per query head (Options.StopRule on
	// a sparse step; see decode.StopRow): valid when Diag.
	Stop []decode.StopRow
	// Selected lists, per query head, the logical pages the step
	// attended (selected and forced, ascending): valid when Diag.
	Selected [][]int32
	// Cosine and RelL2 per query head of the output against dense
	// attention on the same pages: set when Compare.
	Cosine, RelL2 []float64
}

// Sequence is one sequence as EngineAttention drives it: appends, and
// steps through its Stepper (the in-process engine, a coordinator, a
// cluster's Go client), in which SeqID names it. Decode steps run
// batched with the other sequences of the Stepper ([BatchAttention]);
// the steps of one layer (diagnostics, dense comparisons, dense steps of
// later prompt tokens) are steps of one layer there (decode.Batch.Layers
// 1), unless the sequence is also a [LayerStepper].
type Sequence interface {
	Append(ctx context.Context, layer int, k, v []float32) error
	Stepper() decode.Stepper
	SeqID() decode.SeqID
	ForkSequence(ctx context.Context) (Sequence, error)
	Release(ctx context.Context) error
}

// LayerStepper is a [Sequence] that runs a step of one layer for itself
// alone, diagnostics included (a measured step): the in-process
// engine's sequences (engine.Sequence), whose Stepper refuses
// diagnostics inside an open step, and completion's sequences of a
// coordinator. row.Seq and row.New are ignored: the sequence is the
// step's one row, with a new token when k and v are set.
type LayerStepper interface {
	StepLayer(ctx context.Context, layer int, row decode.Row, q, k, v []float32, opt decode.Options, res *decode.Result) error
}

// StepperSequence is the old name of [Sequence], whose steps always run
// through its Stepper now.
//
// Deprecated: use Sequence.
type StepperSequence = Sequence

// SequenceOf is a sequence whose forks are of its own type S, such as
// client.Sequence: [NewAttentionOf] drives it as a [Sequence].
type SequenceOf[S any] interface {
	Append(ctx context.Context, layer int, k, v []float32) error
	Stepper() decode.Stepper
	SeqID() decode.SeqID
	Fork(ctx context.Context) (S, error)
	Release(ctx context.Context) error
}

// seqOf is a SequenceOf as a Sequence.
type seqOf[S SequenceOf[S]] struct{ s S }

func (s seqOf[S]) Append(ctx context.Context, layer int, k, v []float32) error {
	return s.s.Append(ctx, layer, k, v)
}
func (s seqOf[S]) Stepper() decode.Stepper           { return s.s.Stepper() }
func (s seqOf[S]) SeqID() decode.SeqID               { return s.s.SeqID() }
func (s seqOf[S]) Release(ctx context.Context) error { return s.s.Release(ctx) }

func (s seqOf[S]) ForkSequence(ctx context.Context) (Sequence, error) {
	f, err := s.s.Fork(ctx)
	if err != nil {
		return nil, err
	}
	return seqOf[S]{f}, nil
}

// Rollback forwards S's, when it has one.
func (s seqOf[S]) Rollback(ctx context.Context, n int) error {
	r, ok := any(s.s).(rollbacker)
	if !ok {
		return fmt.Errorf("roll back %d tokens: the sequence (%T) cannot roll back", n, s.s)
	}
	return r.Rollback(ctx, n)
}

// NewAttentionOf drives sequence s, which must be empty and of geometry
// g (the caller checks), as an [Attention]: a cluster's sequence through
// its Go client, say.
func NewAttentionOf[S SequenceOf[S]](s S, g Geometry) *EngineAttention {
	return NewSequenceAttention(seqOf[S]{s}, g)
}

// layerStepperOf returns the sequence's LayerStepper, when it has one
// (a SequenceOf's S, when S has one).
func layerStepperOf(s Sequence) (LayerStepper, bool) {
	if w, ok := s.(interface{ layerStepper() (LayerStepper, bool) }); ok {
		return w.layerStepper()
	}
	ls, ok := s.(LayerStepper)
	return ls, ok
}

func (s seqOf[S]) layerStepper() (LayerStepper, bool) {
	ls, ok := any(s.s).(LayerStepper)
	return ls, ok
}

// layerStep runs one layer of a step of its own for this sequence
// alone: its LayerStepper's StepLayer when it has one, else a step of one
// layer through its Stepper (Begin, Layer, End). k and v nil: no new
// token. It fills res (O, LSE, Plans, Time; Diag, emptied without
// opt.Diagnostics).
func (a *EngineAttention) layerStep(ctx context.Context, layer int, q, k, v []float32, budget int, opt decode.Options, res *decode.Result) error {
	if ls, ok := layerStepperOf(a.s); ok {
		return ls.StepLayer(ctx, layer, decode.Row{Seq: a.s.SeqID(), New: k != nil, Budget: budget}, q, k, v, opt, res)
	}
	st, err := a.s.Stepper().Begin(ctx, decode.Batch{Rows: []decode.Row{{Seq: a.s.SeqID(), New: k != nil, Budget: budget}},
		FirstLayer: layer, Layers: 1, Options: opt})
	if err != nil {
		return err
	}
	err = st.Layer(ctx, layer, decode.Host(q), decode.Host(k), decode.Host(v), res)
	if eerr := st.End(ctx); err == nil && eerr != nil {
		err = eerr
	}
	if err != nil {
		return err
	}
	if !opt.Diagnostics {
		res.Diag = res.Diag[:0]
	}
	return nil
}

// DecodeRow implements [BatchAttention]: the sequence joins a batched
// step of its Stepper when it has one (a [StepperSequence]) and neither
// Options.Diagnostics nor Compare asks for a step of its own per layer.
// Options.ForceDense makes every layer of the row dense.
func (a *EngineAttention) DecodeRow() (decode.Stepper, decode.Row, decode.Options, bool) {
	ss := a.s
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

// SequenceMaker is an in-process runner that creates empty sequences
// of its own type S (engine.Engine, whose sequences are
// *engine.Sequence) and tells the model shape it serves.
type SequenceMaker[S SequenceOf[S]] interface {
	NewSequence(ctx context.Context, p plan.Placement) (S, error)
	Shape() (layers int, g plan.Geometry)
}

// NewEngineAttention creates an empty sequence in e (striped placement)
// for a model of geometry g, which must match the runner's.
func NewEngineAttention[S SequenceOf[S]](e SequenceMaker[S], g Geometry) (*EngineAttention, error) {
	layers, c := e.Shape()
	if layers != g.Layers || c.QHeads != g.Heads || c.KVHeads != g.KVHeads || c.HeadDim != g.HeadDim {
		return nil, fmt.Errorf("engine attention: engine of %d layers, %d/%d heads of %d for a model of %d layers, %d/%d heads of %d",
			layers, c.QHeads, c.KVHeads, c.HeadDim, g.Layers, g.Heads, g.KVHeads, g.HeadDim)
	}
	s, err := e.NewSequence(context.Background(), plan.Striped)
	if err != nil {
		return nil, fmt.Errorf("engine attention: %w", err)
	}
	return NewAttentionOf(s, g), nil
}

// Sequence returns the sequence a drives (the caller must not step it
// behind a's back: a counts the tokens of every layer).
func (a *EngineAttention) Sequence() Sequence { return a.s }

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
			if err := a.layerStep(ctx, layer, q[t*qd:(t+1)*qd], k[t*kvd:(t+1)*kvd], v[t*kvd:(t+1)*kvd], 0, decode.Options{ForceDense: true}, &a.res); err != nil {
				return err
			}
			a.lens[layer]++
			copy(out[t*qd:(t+1)*qd], a.res.O.Data)
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
	if err := a.layerStep(ctx, layer, q, k, v, a.Budget, a.Options, &a.res); err != nil {
		return err
	}
	a.lens[layer]++
	copy(out, a.res.O.Data)
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
		st.Stop = dg.Stop
		st.Selected = dg.Selected
	}
	if a.Compare {
		if err := a.layerStep(ctx, layer, q, nil, nil, 0, decode.Options{ForceDense: true}, &a.dense); err != nil {
			return fmt.Errorf("dense comparison: %w", err)
		}
		d := a.g.HeadDim
		st.Cosine = make([]float64, a.g.Heads)
		st.RelL2 = make([]float64, a.g.Heads)
		for h := range a.g.Heads {
			st.Cosine[h], st.RelL2[h] = compare(out[h*d:(h+1)*d], a.dense.O.Data[h*d:(h+1)*d])
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
