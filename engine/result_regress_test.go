package engine

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// TestRegressFailedStepKeepsResult: a step that fails on one TP group must
// not leave a half-new output behind. The TP groups run independently, so
// CP rank 0 of a healthy group copies its heads into res.O/res.LSE while
// the step as a whole returns an error (the collective layer's contract:
// outputs are written only on success).
func TestRegressFailedStepKeepsResult(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	bad := &faultyBackend{Backend: cpu}
	cfg := reviewCfg()
	cfg.CP, cfg.TP, cfg.CapacityPages = 2, 2, 64
	cfg.Backends = func(tp, cp int) kernels.Backend {
		if tp == 1 && cp == 1 {
			return bad
		}
		return cpu
	}
	e := newEngine(t, cfg)
	id, _ := e.Create(plan.Striped)
	tok := cfg.KVHeads * cfg.HeadDim
	if err := e.Append(id, 0, randVec(rng, 200*tok), randVec(rng, 200*tok)); err != nil {
		t.Fatal(err)
	}
	res := Result{O: make([]float32, cfg.QHeads*cfg.HeadDim), LSE: make([]float32, cfg.QHeads)}
	for i := range res.O {
		res.O[i] = float32(math.NaN())
	}
	bad.mode.Store(1)
	q := randVec(rng, cfg.QHeads*cfg.HeadDim)
	if err := e.Step(context.Background(), 0, []Request{{Seq: id, Q: q, BudgetTokens: 32}}, StepOptions{}, &res); err == nil {
		t.Fatal("step with a failing shard succeeded")
	}
	if i := slices.IndexFunc(res.O, func(x float32) bool { return !math.IsNaN(float64(x)) }); i >= 0 {
		t.Fatalf("failed step wrote res.O[%d] = %v (head %d)", i, res.O[i], i/cfg.HeadDim)
	}
}
