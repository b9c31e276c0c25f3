package eval

import (
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
)

// newEngineRunner is the tests' NewRunnerFunc: an in-process engine as
// internal/evalengine builds it for questctl (which imports this
// package, so the tests cannot import it).
func newEngineRunner(c RunnerConfig) (Runner, error) {
	ec := engine.ModelConfig(c.Geometry, c.Policy, c.CapacityPages)
	ec.CP, ec.TP, ec.Selection = c.CP, c.TP, c.Selection
	ec.MemoryLimit = c.MemoryLimit
	ec.Geometry.DType = c.KVDType
	e, err := engine.New(ec)
	if err != nil {
		return nil, err
	}
	return engineRunner{e}, nil
}

type engineRunner struct{ e *engine.Engine }

func (r engineRunner) NewAttention(g model.Geometry) (*model.EngineAttention, error) {
	return model.NewEngineAttention(r.e, g)
}

func (r engineRunner) HierCounts() HierCounts {
	st := r.e.HierStats()
	t := st.Totals
	return HierCounts{Rows: t.Rows, Candidates: t.Candidates, Boxes: t.Boxes, Pages: t.Pages, Flat: t.Flat,
		Fallbacks: t.Fallbacks, Skipped: t.Skipped, Hist: st.Hist[:]}
}

func (r engineRunner) TopPCounts() TopPCounts {
	st := r.e.TopPStats()
	return TopPCounts{Rows: st.Rows, Tokens: st.Tokens, Kept: st.Kept, Hist: st.Hist}
}

func (r engineRunner) Close() error { return r.e.Close() }
