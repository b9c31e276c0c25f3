// Package evalengine builds the quality harness's runners (eval.Runner)
// as in-process engines: the harness reaches the runtime only through
// the step seam, and its callers (questctl eval, the GPU executor's
// tests) hand it this package's NewRunner.
package evalengine

import (
	"fmt"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
)

// NewRunner builds an in-process engine for c: c.Geometry's shape under
// c.Policy, c.CapacityPages pages per shard, laid out CP x TP with
// c.Selection, pools bounded by c.MemoryLimit, K/V pages of c.KVDType.
// It is an eval.NewRunnerFunc.
func NewRunner(c eval.RunnerConfig) (eval.Runner, error) {
	ec := engine.ModelConfig(c.Geometry, c.Policy, c.CapacityPages)
	ec.CP, ec.TP, ec.Selection = c.CP, c.TP, c.Selection
	ec.MemoryLimit = c.MemoryLimit
	ec.Geometry.DType = c.KVDType
	e, err := engine.New(ec)
	if err != nil {
		return nil, fmt.Errorf("evalengine: %w", err)
	}
	return runner{e}, nil
}

// runner is an engine as an eval.Runner.
type runner struct{ e *engine.Engine }

func (r runner) NewAttention(g model.Geometry) (*model.EngineAttention, error) {
	return model.NewEngineAttention(r.e, g)
}

func (r runner) HierCounts() eval.HierCounts {
	st := r.e.HierStats()
	t := st.Totals
	return eval.HierCounts{Rows: t.Rows, Candidates: t.Candidates, Boxes: t.Boxes, Pages: t.Pages, Flat: t.Flat,
		Fallbacks: t.Fallbacks, Skipped: t.Skipped, Hist: st.Hist[:]}
}

func (r runner) TopPCounts() eval.TopPCounts {
	st := r.e.TopPStats()
	return eval.TopPCounts{Rows: st.Rows, Tokens: st.Tokens, Kept: st.Kept, Hist: st.Hist}
}

func (r runner) Close() error { return r.e.Close() }
