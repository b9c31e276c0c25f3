package gpu

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// TestBenchTwin runs Bench on the CPU twin with a small random model:
// one result per context, batch and mode, in order, each with the
// context it started from, positive speeds, and rho equal to its formula
// for a sparse policy (1/S + K/P per sparse layer; dense reads it all).
func TestBenchTwin(t *testing.T) {
	ctx := context.Background()
	dev := twin(t)
	x, err := NewRandom(ctx, dev, tinyConfig(t), 3, Options{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 64, 0
	var got []BenchResult
	cfg := BenchConfig{Contexts: []int{100, 400}, Batches: []int{1, 2}, Warmup: 1, Steps: 3, Policy: &pol, Dense: true}
	if err := Bench(ctx, dev, x, cfg, func(r BenchResult) error { got = append(got, r); return nil }, t.Logf); err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("%d results, want 8", len(got))
	}
	i := 0
	for _, n := range cfg.Contexts {
		for _, b := range cfg.Batches {
			for _, mode := range []string{"quest", "dense"} {
				r := got[i]
				i++
				start := n
				if mode == "dense" {
					start += cfg.Warmup + cfg.Steps
				}
				if r.Mode != mode || r.Context != start || r.Batch != b || r.Layers != 2 || !(r.TokensPerS > 0) || !(r.MsPerStep > 0) {
					t.Fatalf("result %+v: want %s from %d tokens, batch %d", r, mode, start, b)
				}
				// The last timed step attends start + warmup + steps tokens.
				pages := (start + cfg.Warmup + cfg.Steps + pol.PageSize - 1) / pol.PageSize
				k := pol.BudgetTokens / pol.PageSize
				want := 1.0
				if mode == "quest" && k < pages {
					want = 1/float64(pol.PageSize) + float64(k)/float64(pages)
				}
				if d := r.RhoFormula - want; d > 1e-9 || d < -1e-9 {
					t.Errorf("%s ctx %d batch %d: rho formula %v, want %v", mode, n, b, r.RhoFormula, want)
				}
				if d := r.Rho - r.RhoFormula; d > 1e-9 || d < -1e-9 {
					t.Errorf("%s ctx %d batch %d: rho %v, formula %v", mode, n, b, r.Rho, r.RhoFormula)
				}
			}
		}
	}
	// A device with room for the model but not the pages of a long
	// context refuses the measurement before any page is allocated.
	w, a := Need(tinyConfig(t), Options{MaxBatch: 2})
	small := twin(t)
	small.Capacity = w + a + Reserve + 1<<20
	xs, err := NewRandom(ctx, small, tinyConfig(t), 3, Options{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer xs.Close(ctx)
	if err := Bench(ctx, small, xs, BenchConfig{Contexts: []int{3000}, Batches: []int{2}}, func(BenchResult) error { t.Fatal("emitted"); return nil }, t.Logf); !errors.Is(err, ErrNoMemory) {
		t.Errorf("pages past the device: %v, want ErrNoMemory", err)
	}
	for name, cfg := range map[string]BenchConfig{
		"batch past MaxBatch":    {Contexts: []int{100}, Batches: []int{3}},
		"context past positions": {Contexts: []int{4096}},
		"context zero":           {Contexts: []int{0}},
		"negative steps":         {Contexts: []int{100}, Steps: -1},
	} {
		if err := Bench(ctx, dev, x, cfg, func(BenchResult) error { t.Fatal("emitted"); return nil }, t.Logf); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
}

// TestAppendTensorEqualsAppend: random K/V made on the twin and appended
// through engine.AppendTensor (the benchmark's fill) leave a sequence
// whose steps are bit for bit those of the same values appended from
// the host (engine.Append), in chunks that end inside a page; refused
// calls (host tensors, a shape that is not whole tokens, a layer out of
// range, memory the device never gave) change nothing.
func TestAppendTensorEqualsAppend(t *testing.T) {
	ctx := context.Background()
	dev := twin(t)
	e, id := appendTensorEngine(t, dev, plan.Float32)
	row := appendGeometry.KVHeads * appendGeometry.HeadDim
	d := dev.Device()
	bad := decode.OnDevice(d, 1<<40, row, 0)
	for name, call := range map[string]func() error{
		"host tensors": func() error {
			return e.AppendTensor(ctx, id, 0, decode.Host(make([]float32, row)), decode.Host(make([]float32, row)))
		},
		"not whole": func() error {
			return e.AppendTensor(ctx, id, 0, decode.OnDevice(d, 1<<40, row+1, 0), decode.OnDevice(d, 1<<40, row+1, 0))
		},
		"layer past":      func() error { return e.AppendTensor(ctx, id, 2, bad, bad) },
		"unknown pointer": func() error { return e.AppendTensor(ctx, id, 0, bad, bad) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if n, err := e.Len(id); err != nil || n != 0 {
			t.Fatalf("%s: the sequence holds %d tokens (%v) after a refused append", name, n, err)
		}
	}
	checkAppendTensor(t, dev, e, id, twin(t), plan.Float32)
}

// appendGeometry is the model shape of the AppendTensor tests.
var appendGeometry = model.Geometry{Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16}

// appendTensorEngine is an engine of 64 device-resident pages of dt on
// dev and an empty sequence in it, closed with the test.
func appendTensorEngine(t *testing.T, dev BenchDevice, dt plan.DType) (*engine.Engine, decode.SeqID) {
	t.Helper()
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 64, 0
	cfg := engine.ModelConfig(appendGeometry, pol, 64)
	cfg.Geometry.DType = dt
	cfg.Backend, cfg.DeviceResident = dev, true
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	id, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	return e, id
}

// checkAppendTensor appends random K/V made on dev to sequence id of e
// through appendRandomOn and the same values (downloaded) to a sequence
// of an engine on ref from the host, in chunks that end inside a page,
// then runs three steps of both: outputs equal bit for bit.
func checkAppendTensor(t *testing.T, dev BenchDevice, e *engine.Engine, id decode.SeqID, ref BenchDevice, dt plan.DType) {
	t.Helper()
	ctx := context.Background()
	g := appendGeometry
	row := g.KVHeads * g.HeadDim
	re, rid := appendTensorEngine(t, ref, dt)
	for l := range g.Layers {
		for i, n := range []int{37, 16, 100} {
			seed := uint64(10*l + i)
			if err := appendRandomOn(ctx, dev, e, id, l, n, row, seed, seed+100); err != nil {
				t.Fatal(err)
			}
			var kv [2][]float32
			for j, s := range []uint64{seed, seed + 100} {
				m, err := dev.RandomMatrix(ctx, n, row, plan.Float32, s, 1, 0)
				if err != nil {
					t.Fatal(err)
				}
				if kv[j], err = dev.DownloadTensor(ctx, decode.OnDevice(dev.Device(), m.Ptr, n*row, 0)); err != nil {
					t.Fatal(err)
				}
				dev.FreeMatrix(ctx, m)
			}
			if err := re.Append(rid, l, kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, err := e.Len(id); err != nil || n != 153 {
		t.Fatalf("the device-appended sequence holds %d tokens (%v), want 153", n, err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	vec := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	for s := range 3 {
		for l := range g.Layers {
			q, k, v := vec(g.Heads*g.HeadDim), vec(row), vec(row)
			var got, want engine.Result
			if err := e.Step(ctx, l, []engine.Request{{Seq: id, Q: q, K: k, V: v}}, engine.StepOptions{}, &got); err != nil {
				t.Fatal(err)
			}
			if err := re.Step(ctx, l, []engine.Request{{Seq: rid, Q: q, K: k, V: v}}, engine.StepOptions{}, &want); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.O, want.O) || !slices.Equal(got.LSE, want.LSE) || len(got.O) != g.Heads*g.HeadDim {
				t.Fatalf("%v pages, step %d layer %d: the device-appended sequence attends differently from the host-appended one", dt, s, l)
			}
		}
	}
}

// profilingTwin is the CPU twin with a profiler range that counts its
// brackets and the decode steps the device saw inside them.
type profilingTwin struct {
	*backendtest.QueuedDevice
	starts, stops int
	on            bool
}

func (p *profilingTwin) ProfilerStart(context.Context) error {
	if p.on {
		return errors.New("range started twice")
	}
	p.starts++
	p.on = true
	return nil
}

func (p *profilingTwin) ProfilerStop(context.Context) error {
	if !p.on {
		return errors.New("range stopped before it started")
	}
	p.stops++
	p.on = false
	return nil
}

// TestBenchProfileRange: a profiled run brackets one Quest step per
// measurement (none of dense's) and leaves the range closed; a device
// without a profiler range is refused before anything runs.
func TestBenchProfileRange(t *testing.T) {
	ctx := context.Background()
	dev := &profilingTwin{QueuedDevice: twin(t)}
	x, err := NewRandom(ctx, dev, tinyConfig(t), 3, Options{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 64, 0
	cfg := BenchConfig{Contexts: []int{100, 400}, Batches: []int{1}, Warmup: 2, Steps: 2, Policy: &pol, Dense: true, Profile: true}
	n := 0
	if err := Bench(ctx, dev, x, cfg, func(BenchResult) error { n++; return nil }, t.Logf); err != nil {
		t.Fatal(err)
	}
	if n != 4 || dev.starts != 2 || dev.stops != 2 || dev.on {
		t.Fatalf("%d results, %d starts, %d stops, open %v; want 4 results and 2 closed ranges", n, dev.starts, dev.stops, dev.on)
	}
	cfg.Warmup = 0
	if err := Bench(ctx, dev, x, cfg, func(BenchResult) error { return nil }, t.Logf); err != nil || dev.starts != 2+2 {
		// Warmup 0 means the default 3 warm-up steps.
		t.Fatalf("warm-up 0: %v, %d starts", err, dev.starts)
	}
	plain := twin(t)
	px, err := NewRandom(ctx, plain, tinyConfig(t), 3, Options{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close(ctx)
	n = 0
	err = Bench(ctx, plain, px, cfg, func(BenchResult) error { n++; return nil }, t.Logf)
	if !errors.Is(err, ErrBadInput) || n != 0 {
		t.Fatalf("no profiler: %v after %d results, want ErrBadInput before any", err, n)
	}
}

// markingTwin is the CPU twin with phase marks: interval j between marks
// j and j+1 of a step lasts j+1 ms, so that each phase's sum says which
// intervals it took.
type markingTwin struct {
	*backendtest.QueuedDevice
	marks int
}

func (m *markingTwin) MarkPhase(context.Context) error { m.marks++; return nil }

func (m *markingTwin) PhaseTimes(context.Context) ([]float64, error) {
	var ts []float64
	for j := 0; j+1 < m.marks; j++ {
		ts = append(ts, float64(j+1))
	}
	m.marks = 0
	return ts, nil
}

// TestBenchPhases: a phase split marks one step per Quest measurement
// (one before the layers, three a layer, two around the head), its
// intervals summed per phase: In takes intervals 1, 4, 7, ... (1-based),
// Attention 2, 5, ..., Out 3, 6, ..., then the end gap and the head; the
// projections' rate is the layers' weight bytes over In + Out. A device
// without marks is refused before anything runs.
func TestBenchPhases(t *testing.T) {
	ctx := context.Background()
	dev := &markingTwin{QueuedDevice: twin(t)}
	cfgm := tinyConfig(t)
	x, err := NewRandom(ctx, dev, cfgm, 3, Options{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 64, 0
	cfg := BenchConfig{Contexts: []int{100}, Batches: []int{1, 2}, Warmup: 1, Steps: 2, Policy: &pol, Dense: true, Phases: true}
	var got []BenchResult
	if err := Bench(ctx, dev, x, cfg, func(r BenchResult) error { got = append(got, r); return nil }, t.Logf); err != nil {
		t.Fatal(err)
	}
	L := cfgm.Layers
	in, attn, out := 0.0, 0.0, 0.0
	for l := range L {
		in += float64(3*l + 1)
		attn += float64(3*l + 2)
		out += float64(3*l + 3)
	}
	want := Phases{In: in, Attention: attn, Out: out, EndGap: float64(3*L + 1), Head: float64(3*L + 2)}
	if len(got) != 4 {
		t.Fatalf("%d results, want 4", len(got))
	}
	var layerBytes int64
	for i := range x.layers {
		for _, m := range x.layers[i].matrices() {
			layerBytes += int64(m.Rows) * int64(m.Cols) * int64(m.DType.Bytes())
		}
	}
	for _, r := range got {
		if r.Mode == "dense" {
			if r.Phases != nil || r.ProjGBps != 0 {
				t.Errorf("dense batch %d: phases %+v, %v GB/s; want none", r.Batch, r.Phases, r.ProjGBps)
			}
			continue
		}
		if r.Phases == nil || *r.Phases != want {
			t.Fatalf("quest batch %d: phases %+v, want %+v", r.Batch, r.Phases, want)
		}
		if g := float64(layerBytes) / ((in + out) * 1e6); r.ProjGBps != g {
			t.Errorf("quest batch %d: %v GB/s, want %v", r.Batch, r.ProjGBps, g)
		}
	}
	if dev.marks != 0 {
		t.Errorf("%d marks left queued", dev.marks)
	}
	if err := x.MarkPhases(false); err != nil || x.marker != nil {
		t.Errorf("marks left on after the bench: %v", err)
	}
	plain := twin(t)
	px, err := NewRandom(ctx, plain, tinyConfig(t), 3, Options{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close(ctx)
	err = Bench(ctx, plain, px, cfg, func(BenchResult) error { t.Error("a result without marks"); return nil }, t.Logf)
	if !errors.Is(err, ErrBadInput) {
		t.Fatalf("no marks: %v, want ErrBadInput", err)
	}
	if err := px.MarkPhases(true); !errors.Is(err, ErrBadInput) {
		t.Fatalf("MarkPhases on a device without marks: %v", err)
	}
}
