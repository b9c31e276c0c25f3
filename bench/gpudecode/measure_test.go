package gpudecode

import (
	"context"
	"errors"
	"testing"

	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/model/gpu"
)

// TestBenchTwin runs Measure on the CPU twin with a small random model:
// one result per context, batch and mode, in order, each with the
// context it started from, positive speeds, and rho equal to its formula
// for a sparse policy (1/S + K/P per sparse layer; dense reads it all).
func TestBenchTwin(t *testing.T) {
	ctx := context.Background()
	dev := twin(t)
	x := tinyExecutor(t, dev)
	pol := tinyPolicy()
	var got []Result
	cfg := Config{Contexts: []int{100, 400}, Batches: []int{1, 2}, Warmup: 1, Steps: 3, Policy: &pol, Dense: true}
	if err := Measure(ctx, dev, x, cfg, func(r Result) error { got = append(got, r); return nil }, t.Logf); err != nil {
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
	w, a := gpu.Need(tinyConfig(t), gpu.Options{MaxBatch: 2})
	small := twin(t)
	small.Capacity = w + a + gpu.Reserve + 1<<20
	xs := tinyExecutor(t, small)
	if err := Measure(ctx, small, xs, Config{Contexts: []int{3000}, Batches: []int{2}}, func(Result) error { t.Fatal("emitted"); return nil }, t.Logf); !errors.Is(err, gpu.ErrNoMemory) {
		t.Errorf("pages past the device: %v, want gpu.ErrNoMemory", err)
	}
	for name, cfg := range map[string]Config{
		"batch past MaxBatch":    {Contexts: []int{100}, Batches: []int{3}},
		"context past positions": {Contexts: []int{4096}},
		"context zero":           {Contexts: []int{0}},
		"negative steps":         {Contexts: []int{100}, Steps: -1},
	} {
		if err := Measure(ctx, dev, x, cfg, func(Result) error { t.Fatal("emitted"); return nil }, t.Logf); !errors.Is(err, gpu.ErrBadInput) {
			t.Errorf("%s: %v, want gpu.ErrBadInput", name, err)
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
	x := tinyExecutor(t, dev)
	pol := tinyPolicy()
	cfg := Config{Contexts: []int{100, 400}, Batches: []int{1}, Warmup: 2, Steps: 2, Policy: &pol, Dense: true, Profile: true}
	n := 0
	if err := Measure(ctx, dev, x, cfg, func(Result) error { n++; return nil }, t.Logf); err != nil {
		t.Fatal(err)
	}
	if n != 4 || dev.starts != 2 || dev.stops != 2 || dev.on {
		t.Fatalf("%d results, %d starts, %d stops, open %v; want 4 results and 2 closed ranges", n, dev.starts, dev.stops, dev.on)
	}
	cfg.Warmup = 0
	if err := Measure(ctx, dev, x, cfg, func(Result) error { return nil }, t.Logf); err != nil || dev.starts != 2+2 {
		// Warmup 0 means the default 3 warm-up steps.
		t.Fatalf("warm-up 0: %v, %d starts", err, dev.starts)
	}
	plain := twin(t)
	px := tinyExecutor(t, plain)
	n = 0
	err := Measure(ctx, plain, px, cfg, func(Result) error { n++; return nil }, t.Logf)
	if !errors.Is(err, gpu.ErrBadInput) || n != 0 {
		t.Fatalf("no profiler: %v after %d results, want gpu.ErrBadInput before any", err, n)
	}
}

// markingTwin is the CPU twin with phase marks: interval j between marks
// j and j+1 of a step lasts j+1 ms, so that each phase's sum says which
// intervals it took.
type markingTwin struct {
	*backendtest.QueuedDevice
	marks, total int // queued since PhaseTimes, and in all
}

func (m *markingTwin) MarkPhase(context.Context) error { m.marks++; m.total++; return nil }

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
	x := tinyExecutor(t, dev)
	pol := tinyPolicy()
	cfg := Config{Contexts: []int{100}, Batches: []int{1, 2}, Warmup: 1, Steps: 2, Policy: &pol, Dense: true, Phases: true}
	var got []Result
	if err := Measure(ctx, dev, x, cfg, func(r Result) error { got = append(got, r); return nil }, t.Logf); err != nil {
		t.Fatal(err)
	}
	L := cfgm.Layers
	in, attn, out := 0.0, 0.0, 0.0
	for l := range L {
		in += float64(3*l + 1)
		attn += float64(3*l + 2)
		out += float64(3*l + 3)
	}
	want := gpu.Phases{In: in, Attention: attn, Out: out, EndGap: float64(3*L + 1), Head: float64(3*L + 2)}
	if len(got) != 4 {
		t.Fatalf("%d results, want 4", len(got))
	}
	layerBytes := x.LayerWeightBytes()
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
	// Marks are off after the bench: a run without the split marks nothing.
	total := dev.total
	plainCfg := cfg
	plainCfg.Phases = false
	if err := Measure(ctx, dev, x, plainCfg, func(Result) error { return nil }, t.Logf); err != nil || dev.total != total {
		t.Errorf("marks left on after the bench: %v, %d marks in a run without the split", err, dev.total-total)
	}
	plain := twin(t)
	px := tinyExecutor(t, plain)
	err := Measure(ctx, plain, px, cfg, func(Result) error { t.Error("a result without marks"); return nil }, t.Logf)
	if !errors.Is(err, gpu.ErrBadInput) {
		t.Fatalf("no marks: %v, want gpu.ErrBadInput", err)
	}
	if err := px.MarkPhases(true); !errors.Is(err, gpu.ErrBadInput) {
		t.Fatalf("MarkPhases on a device without marks: %v", err)
	}
}
