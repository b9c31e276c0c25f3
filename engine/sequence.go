package engine

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
)

// Shaper is a model's attention shape: its layer count and the geometry
// of a layer's heads (model.Geometry has one). The page size is the
// policy's, not the shape's.
type Shaper interface {
	Shape() (layers int, g plan.Geometry)
}

// ModelConfig returns an engine configuration for a model of shape m:
// policy p (its page size becomes the engine's), a pool of capacityPages
// pages per shard, one shard (set CP and TP on the result for more).
func ModelConfig(m Shaper, p plan.Policy, capacityPages int) Config {
	c := DefaultConfig()
	c.Layers, c.Geometry = m.Shape()
	c.PageSize = p.PageSize
	c.Policy = p
	c.CapacityPages = capacityPages
	return c
}

// Shape returns the engine's layer count and geometry (the model shape
// it serves, see Shaper).
func (e *Engine) Shape() (layers int, g plan.Geometry) { return e.cfg.Layers, e.cfg.Geometry }

// Sequence is one sequence of an in-process engine as a handle that
// carries its engine: what model.NewAttentionOf and
// model.NewEngineAttention drive. A Sequence is a small value; its
// methods are safe for concurrent use as the engine's are.
type Sequence struct {
	e  *Engine
	id SeqID
}

// NewSequence creates an empty sequence with placement p (CreateContext)
// and returns its handle.
func (e *Engine) NewSequence(ctx context.Context, p plan.Placement) (*Sequence, error) {
	id, err := e.CreateContext(ctx, p)
	if err != nil {
		return nil, err
	}
	return &Sequence{e: e, id: id}, nil
}

// SequenceOf returns the handle of sequence id of e (which need not
// exist yet: its methods then fail with ErrUnknownSequence).
func (e *Engine) SequenceOf(id SeqID) *Sequence { return &Sequence{e: e, id: id} }

// Append appends k and v to layer of the sequence (AppendContext).
func (s *Sequence) Append(ctx context.Context, layer int, k, v []float32) error {
	return s.e.AppendContext(ctx, s.id, layer, k, v)
}

// Stepper returns the engine, which steps the sequence.
func (s *Sequence) Stepper() decode.Stepper { return s.e }

// SeqID returns the sequence's id in its engine.
func (s *Sequence) SeqID() decode.SeqID { return s.id }

// Fork returns a new sequence sharing every page with this one
// (ForkContext).
func (s *Sequence) Fork(ctx context.Context) (*Sequence, error) {
	id, err := s.e.ForkContext(ctx, s.id)
	if err != nil {
		return nil, err
	}
	return &Sequence{e: s.e, id: id}, nil
}

// Rollback drops the sequence's last n tokens of every layer
// (RollbackContext).
func (s *Sequence) Rollback(ctx context.Context, n int) error {
	return s.e.RollbackContext(ctx, s.id, n)
}

// Release frees the sequence on every shard (ReleaseContext).
func (s *Sequence) Release(ctx context.Context) error { return s.e.ReleaseContext(ctx, s.id) }

// StepLayer runs a step of one layer for this sequence alone (Step):
// row's budget, dense layers and, when k and v are set, a new token
// (row.Seq and row.New are ignored). Unlike a step of the engine's
// Stepper, it takes Options.Diagnostics (a measured step: the dense
// pass runs inside the step). res is filled as Step fills a Result
// (see StepInto).
func (s *Sequence) StepLayer(ctx context.Context, layer int, row decode.Row, q, k, v []float32, opt StepOptions, res *decode.Result) error {
	r := Request{Seq: s.id, Q: q, K: k, V: v, BudgetTokens: row.Budget, DenseLayers: row.DenseLayers}
	return StepInto(res, func(er *Result) error { return s.e.Step(ctx, layer, []Request{r}, opt, er) })
}

// StepInto runs step, a step that fills an engine Result (Engine.Step,
// a coordinator's Step), into res: step writes into res's buffers (O on
// the host, LSE, Plans, Diag), which res then holds with the step's
// times. res.Diag is emptied when the step reports no diagnostics. A
// device O is refused with decode.ErrDeviceTensor.
func StepInto(res *decode.Result, step func(*Result) error) error {
	if !res.O.OnHost() {
		return fmt.Errorf("%w: output is on %v", decode.ErrDeviceTensor, res.O.Device)
	}
	er := Result{O: res.O.Data, LSE: res.LSE, Plans: res.Plans, Diag: res.Diag}
	err := step(&er)
	res.O, res.LSE, res.Plans, res.Diag, res.Time = decode.Host(er.O), er.LSE, er.Plans, er.Diag, er.Time
	return err
}
