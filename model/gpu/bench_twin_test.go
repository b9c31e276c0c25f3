package gpu

import (
	"context"
	"errors"
	"testing"

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
