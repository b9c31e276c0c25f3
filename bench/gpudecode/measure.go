package gpudecode

import (
	"context"
	"fmt"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// Config sizes Measure. Zero fields take the defaults noted.
type Config struct {
	// Contexts are the tokens every sequence holds before the timed
	// steps (random K/V, no prefill) (default 1024 and 32768).
	Contexts []int
	// Batches are the sequences decoded together (default 1).
	Batches []int
	// Warmup and Steps are the untimed and timed decode steps (default
	// 3 and 20).
	Warmup, Steps int
	// Policy is the page policy (default: plan.DefaultPolicy with pages
	// of 16, a budget of 4096 tokens and no dense layers).
	Policy *plan.Policy
	// KVDType is the pages' storage type (the zero value: float32).
	KVDType plan.DType
	// Dense also times every layer dense, after Quest, in the same run
	// (continuing the same sequences).
	Dense bool
	// Seed seeds the random K/V.
	Seed uint64
	// Profile brackets the last warm-up Quest step of each measurement
	// with the device's profiler range (the device must be a Profiler):
	// a profiler started with capture off (ncu --profile-from-start off)
	// records only that step's kernels, and the timed steps are not
	// the profiled one. Off by default.
	Profile bool
	// Phases adds one step after the timed Quest steps of each
	// measurement with marks between its phases (the device must be a
	// gpu.PhaseMarker; gpu.Executor.MarkPhases): the result's Phases and
	// ProjGBps. The marked step is not a timed one. Off by default.
	Phases bool
}

// Profiler is a device whose work a profiler attached with capture off
// records between ProfilerStart and ProfilerStop (the CUDA backend:
// cuProfilerStart and cuProfilerStop).
type Profiler interface {
	ProfilerStart(context.Context) error
	ProfilerStop(context.Context) error
}

// Result is one line of Measure (the fields of the PyTorch anchor's
// decode lines, ../shared/anchors/llama_decode_anchor.py, and more).
type Result struct {
	Runtime string `json:"runtime"`
	Mode    string `json:"mode"` // quest or dense
	// Context is the tokens each sequence held before the mode's first
	// (warm-up) step: the configured context, and more for dense after
	// Quest's steps.
	Context    int     `json:"ctx"`
	Batch      int     `json:"batch"`
	Layers     int     `json:"layers"`
	MsPerStep  float64 `json:"ms_per_step"`
	TokensPerS float64 `json:"tokens_per_s"`
	// EnqueueMs, EndWaitMs and HeadMs split a step's host time
	// (gpu.Executor.LastTiming), means over the timed steps.
	EnqueueMs float64 `json:"enqueue_ms"`
	EndWaitMs float64 `json:"end_wait_ms"`
	HeadMs    float64 `json:"head_ms"`
	// Rho is the K/V bytes read over dense's (summaries included) and
	// RhoFormula 1/S + K/P per sparse layer, averaged over layers, of
	// the last timed step's first row.
	Rho        float64 `json:"rho"`
	RhoFormula float64 `json:"rho_formula"`
	// WeightsGB is the device memory of the weights.
	WeightsGB float64 `json:"weights_GB"`
	// Phases is the device timeline of one marked step after the timed
	// ones (Config.Phases; Quest only), and ProjGBps the decoder
	// layers' weight bytes over its In + Out time (the projections'
	// streaming rate, RoPE and SiLU included).
	Phases   *gpu.Phases `json:"phases_ms,omitempty"`
	ProjGBps float64     `json:"proj_GBps,omitempty"`
}

// Device holds the pages of the benchmark's engine and runs the
// executor's kernels (the CUDA backend, or its CPU twin in tests).
type Device interface {
	kernels.Backend
	kernels.ModelDevice
}

// Measure times x's decode steps over an in-process engine on dev (pages
// device-resident): for each context and batch, sequences holding that
// many tokens of random K/V, then Warmup + Steps greedy steps of all of
// them together, Quest and (with Dense) every layer dense. One result per
// measurement, handed to emit as it is made; progress to logf. A
// configuration x or dev cannot run is refused with gpu.gpu.ErrBadInput
// before anything runs.
func Measure(ctx context.Context, dev Device, x *gpu.Executor, cfg Config, emit func(Result) error, logf func(string, ...any)) error {
	if len(cfg.Contexts) == 0 {
		cfg.Contexts = []int{1024, 32768}
	}
	if len(cfg.Batches) == 0 {
		cfg.Batches = []int{1}
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = 3
	}
	if cfg.Steps == 0 {
		cfg.Steps = 20
	}
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 4096, 0
	if cfg.Policy != nil {
		pol = *cfg.Policy
	}
	c := x.Config()
	steps := cfg.Warmup + cfg.Steps
	if cfg.Dense {
		steps *= 2
	}
	if cfg.Phases {
		steps++ // the marked step
	}
	for _, n := range cfg.Contexts {
		if n < 1 || (c.MaxPositions > 0 && n+steps > c.MaxPositions) {
			return fmt.Errorf("%w: context %d (+%d steps) outside the model's %d positions", gpu.ErrBadInput, n, steps, c.MaxPositions)
		}
	}
	for _, b := range cfg.Batches {
		if b < 1 || b > x.MaxBatch() {
			return fmt.Errorf("%w: batch %d outside 1..%d", gpu.ErrBadInput, b, x.MaxBatch())
		}
	}
	if _, ok := dev.(gpu.PhaseMarker); cfg.Phases && !ok {
		return fmt.Errorf("%w: a phase split needs a device with phase marks (the CUDA backend)", gpu.ErrBadInput)
	}
	if _, ok := dev.(Profiler); cfg.Profile && !ok {
		return fmt.Errorf("%w: a profiled run needs a device with a profiler range (the CUDA backend)", gpu.ErrBadInput)
	}
	if cfg.Steps < 0 || cfg.Warmup < 0 {
		return fmt.Errorf("%w: %d steps after %d warm-up steps", gpu.ErrBadInput, cfg.Steps, cfg.Warmup)
	}
	g := c.Geometry()
	for _, n := range cfg.Contexts {
		for _, bs := range cfg.Batches {
			if err := measureOne(ctx, dev, x, cfg, pol, g, n, bs, emit, logf); err != nil {
				return fmt.Errorf("context %d batch %d: %w", n, bs, err)
			}
		}
	}
	return nil
}

// measureOne runs the modes of one context n and batch bs.
func measureOne(ctx context.Context, dev Device, x *gpu.Executor, cfg Config, pol plan.Policy, g model.Geometry, n, bs int, emit func(Result) error, logf func(string, ...any)) error {
	c := x.Config()
	modes := []bool{false}
	if cfg.Dense {
		modes = append(modes, true)
	}
	total := n + len(modes)*(cfg.Warmup+cfg.Steps)
	if cfg.Phases {
		total++ // the marked step
	}
	ecfg := engine.ModelConfig(g, pol, bs*((total+pol.PageSize-1)/pol.PageSize+2))
	ecfg.Geometry.DType = cfg.KVDType
	ecfg.Backend, ecfg.DeviceResident = dev, true
	if err := gpu.Admit(ctx, dev, mustPages(ecfg), fmt.Sprintf("%d pages of K/V", ecfg.CapacityPages)); err != nil {
		return err
	}
	e, err := engine.New(ecfg)
	if err != nil {
		return err
	}
	defer e.Close()
	t0 := time.Now()
	rows := make([]gpu.Row, bs)
	for i := range rows {
		id, err := e.Create(plan.Striped)
		if err != nil {
			return err
		}
		if err := fillRandom(ctx, dev, e, id, c.Layers, n, c.KVHeads*c.HeadDim, cfg.Seed<<8|uint64(i)); err != nil {
			return err
		}
		rows[i] = gpu.Row{Seq: id, Token: 1 + i%max(c.VocabSize-1, 1), Pos: n}
	}
	logf("context %d batch %d: random K/V of %d tokens in %v", n, bs, n, time.Since(t0).Round(time.Millisecond))
	for _, dense := range modes {
		for i := range rows {
			rows[i].Dense = dense
		}
		var el time.Duration
		var tm gpu.Timing
		held := rows[0].Pos
		for s := range cfg.Warmup + cfg.Steps {
			prof := cfg.Profile && !dense && s == cfg.Warmup-1
			if prof {
				if err := dev.(Profiler).ProfilerStart(ctx); err != nil {
					return err
				}
			}
			t := time.Now()
			next, err := x.Decode(ctx, e, rows)
			if err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
			if prof {
				if err := dev.(Profiler).ProfilerStop(ctx); err != nil {
					return err
				}
			}
			if s >= cfg.Warmup {
				el += time.Since(t)
				lt := x.LastTiming()
				tm.Enqueue += lt.Enqueue
				tm.EndWait += lt.EndWait
				tm.Head += lt.Head
			}
			for i := range rows {
				rows[i].Token, rows[i].Pos = next[i], rows[i].Pos+1
			}
		}
		steps := max(cfg.Steps, 1)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(steps) }
		sm := model.Summarize(x.LastSteps(0), pol.PageSize)
		var ph *gpu.Phases
		if cfg.Phases && !dense {
			p, err := markedStep(ctx, x, e, rows)
			if err != nil {
				return err
			}
			ph = &p
		}
		mode := "quest"
		if dense {
			mode = "dense"
		}
		r := Result{Runtime: "questrt", Mode: mode, Context: held, Batch: bs, Layers: c.Layers,
			MsPerStep: ms(el), EnqueueMs: ms(tm.Enqueue), EndWaitMs: ms(tm.EndWait), HeadMs: ms(tm.Head),
			Rho: sm.Rho, RhoFormula: sm.RhoFormula, WeightsGB: float64(x.WeightBytes()) / 1e9, Phases: ph}
		if ph != nil && ph.In+ph.Out > 0 {
			r.ProjGBps = float64(x.LayerWeightBytes()) / ((ph.In + ph.Out) * 1e6)
		}
		if el > 0 {
			r.TokensPerS = float64(bs*cfg.Steps) / el.Seconds()
		}
		if err := emit(r); err != nil {
			return err
		}
	}
	return nil
}

// markedStep decodes rows once more with phase marks on and returns its
// device timeline; the rows move on by the step.
func markedStep(ctx context.Context, x *gpu.Executor, e *engine.Engine, rows []gpu.Row) (gpu.Phases, error) {
	if err := x.MarkPhases(true); err != nil {
		return gpu.Phases{}, err
	}
	defer x.MarkPhases(false)
	next, err := x.Decode(ctx, e, rows)
	if err != nil {
		return gpu.Phases{}, fmt.Errorf("marked step: %w", err)
	}
	for i := range rows {
		rows[i].Token, rows[i].Pos = next[i], rows[i].Pos+1
	}
	return x.LastPhases(), nil
}

// mustPages is engine.Config.DevicePageBytes of a one-rank config (0 for another layout,
// which engine.New then judges).
func mustPages(ecfg engine.Config) int64 {
	n, err := ecfg.DevicePageBytes()
	if err != nil {
		return 0
	}
	return n
}
