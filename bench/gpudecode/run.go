package gpudecode

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// Spec is one run of the benchmark: the model, the executor's options,
// the decode measurements and the prompts whose prefill is timed.
type Spec struct {
	// Model is the model's config: the shape of random weights, and
	// ModelDir's config when set.
	Model model.Config
	// ModelDir is a checkpoint whose weights are loaded (empty: random
	// weights of Model from Measure.Seed).
	ModelDir string
	// Executor are the executor's options; a zero MaxBatch is the
	// largest of Measure.Batches.
	Executor gpu.Options
	// Measure sizes the decode measurements.
	Measure Config
	// Prefill are prompt lengths whose time to first token is timed
	// after the decode measurements (empty: none), in pages of
	// PrefillDType.
	Prefill      []int
	PrefillDType plan.DType
}

// Run puts the spec's weights on dev, then writes one JSON line to out
// per measurement (Measure's Result, then MeasurePrefill's
// PrefillResult); progress goes to logf. The weights and activations
// are admitted against dev's free memory before a checkpoint is read.
func Run(ctx context.Context, dev Device, s Spec, out io.Writer, logf func(string, ...any)) error {
	opt := s.Executor
	if opt.MaxBatch == 0 {
		for _, n := range s.Measure.Batches {
			opt.MaxBatch = max(opt.MaxBatch, n)
		}
	}
	t0 := time.Now()
	var x *gpu.Executor
	w, a := gpu.Need(s.Model, opt)
	if err := gpu.Admit(ctx, dev, w+a, fmt.Sprintf("the weights (%.2f GB) and activations (%.2f GB)", float64(w)/1e9, float64(a)/1e9)); err != nil {
		return err // before a checkpoint is read
	}
	if s.ModelDir != "" {
		logf("weights: loading %s ...", s.ModelDir)
		m, err := model.Load(s.ModelDir, model.LoadOptions{})
		if err != nil {
			return err
		}
		x, err = gpu.New(ctx, dev, m, opt)
		m.Close()
		if err != nil {
			return err
		}
	} else {
		logf("weights: %d random parameters on the GPU ...", s.Model.Params())
		var err error
		if x, err = gpu.NewRandom(ctx, dev, s.Model, s.Measure.Seed, opt); err != nil {
			return err
		}
	}
	defer x.Close(ctx)
	logf("weights: %.2f GB on the GPU in %v", float64(x.WeightBytes())/1e9, time.Since(t0).Round(time.Millisecond))
	if err := Measure(ctx, dev, x, s.Measure, func(r Result) error { return bench.WriteJSONLine(out, r) }, logf); err != nil {
		return err
	}
	if len(s.Prefill) == 0 {
		return nil
	}
	if ge, ok := dev.(gemmEngine); ok {
		if g, why := ge.GemmEngine(ctx); why != nil {
			logf("prefill projections on %s (%v)", g, why)
		}
	}
	return MeasurePrefill(ctx, dev, x, s.Prefill, s.PrefillDType, 2, s.Measure.Phases, func(r PrefillResult) error { return bench.WriteJSONLine(out, r) })
}

// gemmEngine is a device that says what runs the prefill's projections,
// and why not the tensor cores when they do not (the CUDA backend).
type gemmEngine interface {
	GemmEngine(context.Context) (string, error)
}
