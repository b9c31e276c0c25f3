package bench

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/questrt/questrt/internal/memlimit"
)

// tinyAttention is a configuration that runs in milliseconds but still
// ranks pages: 2048 tokens = 128 pages, K = 16.
func tinyAttention() AttentionConfig {
	c := DefaultAttentionConfig()
	c.Contexts, c.Budgets = []int{2048}, []int{256}
	c.QHeads, c.KVHeads, c.HeadDim, c.Iters = 4, 2, 32, 3
	return c
}

func runAttention(t *testing.T, c AttentionConfig) []AttentionResult {
	t.Helper()
	var out []AttentionResult
	if err := Attention(context.Background(), c, func(r AttentionResult) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAttentionPhaseTimes: the phase times come from a run of their own
// and are never 0 when the step ranks pages (they were 0 on the CPU once
// the Quest step became one fused backend call).
func TestAttentionPhaseTimes(t *testing.T) {
	rs := runAttention(t, tinyAttention())
	if len(rs) != 1 {
		t.Fatalf("%d results, want 1", len(rs))
	}
	r := rs[0]
	for name, v := range map[string]float64{
		"dense_us": r.DenseUS, "quest_us": r.QuestUS, "phased_us": r.PhasedUS,
		"score_us": r.ScoreUS, "topk_us": r.TopKUS, "attend_us": r.AttendUS,
	} {
		if !(v > 0) {
			t.Errorf("%s = %v, want > 0 (%+v)", name, v, r)
		}
	}
	if sum := r.ScoreUS + r.TopKUS + r.AttendUS; sum > 1.5*r.PhasedUS+50 {
		t.Errorf("phases sum to %.1f us, more than the phased step's %.1f us", sum, r.PhasedUS)
	}
	if r.Pages != 128 || r.KPages != 16 || r.BudgetCapped {
		t.Errorf("pages %d, k %d, capped %v; want 128, 16, false", r.Pages, r.KPages, r.BudgetCapped)
	}
	if want := 1.0/16 + 16.0/128; r.RhoFormula != want || r.RhoBytes != want {
		t.Errorf("rho formula %v, measured %v, want %v", r.RhoFormula, r.RhoBytes, want)
	}
}

// TestAttentionBudgetCapped: a budget above the context caps K at P, says
// so, and never reports a rho formula above 1 + 1/S.
func TestAttentionBudgetCapped(t *testing.T) {
	c := tinyAttention()
	c.Contexts, c.Budgets, c.Iters = []int{1000}, []int{16, 1024, 1 << 20}, 1
	rs := runAttention(t, c)
	if len(rs) != 3 {
		t.Fatalf("%d results, want 3", len(rs))
	}
	// 1000 tokens = 63 pages.
	for i, want := range []struct {
		k      int
		capped bool
	}{{1, false}, {63, true}, {63, true}} {
		r := rs[i]
		if r.Pages != 63 || r.KPages != want.k || r.BudgetCapped != want.capped {
			t.Errorf("budget %d: pages %d, k %d, capped %v; want 63, %d, %v", r.Budget, r.Pages, r.KPages, r.BudgetCapped, want.k, want.capped)
		}
		if r.RhoFormula > 1+1.0/16 {
			t.Errorf("budget %d: rho formula %v above 1 + 1/S", r.Budget, r.RhoFormula)
		}
		if want.capped && (r.RhoFormula != 1+1.0/16 || r.RhoBytes != 1) {
			t.Errorf("budget %d: rho formula %v, measured %v; want 1 + 1/16 and 1 (dense)", r.Budget, r.RhoFormula, r.RhoBytes)
		}
	}
}

func TestRhoFormula(t *testing.T) {
	for _, c := range []struct {
		n, budget, s int
		pages, k     int
		capped       bool
		rho          float64
	}{
		{4096, 256, 16, 256, 16, false, 1.0/16 + 16.0/256},
		{4096, 4095, 16, 256, 255, false, 1.0/16 + 255.0/256},
		{4096, 4096, 16, 256, 256, true, 1 + 1.0/16},
		{4096, 1 << 30, 16, 256, 256, true, 1 + 1.0/16},
		{1, 1, 1, 1, 1, true, 2},
		{17, 32, 16, 2, 2, true, 1 + 1.0/16},
	} {
		pages, k, capped, rho := RhoFormula(c.n, c.budget, c.s)
		if pages != c.pages || k != c.k || capped != c.capped || math.Abs(rho-c.rho) > 1e-15 {
			t.Errorf("RhoFormula(%d, %d, %d) = %d, %d, %v, %v; want %d, %d, %v, %v", c.n, c.budget, c.s, pages, k, capped, rho, c.pages, c.k, c.capped, c.rho)
		}
		if rho > 1+1/float64(c.s) {
			t.Errorf("RhoFormula(%d, %d, %d) = %v above 1 + 1/S", c.n, c.budget, c.s, rho)
		}
	}
}

// TestAttentionConfigValidate: every numeric setting at 0, -1 and a huge
// value is refused in one line naming its flag.
func TestAttentionConfigValidate(t *testing.T) {
	if err := DefaultAttentionConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	set := map[string]func(*AttentionConfig, int){
		"--context":   func(c *AttentionConfig, v int) { c.Contexts = []int{4096, v} },
		"--budget":    func(c *AttentionConfig, v int) { c.Budgets = []int{v} },
		"--batch":     func(c *AttentionConfig, v int) { c.Batch = v },
		"--page-size": func(c *AttentionConfig, v int) { c.PageSize = v },
		"--q-heads":   func(c *AttentionConfig, v int) { c.QHeads = v },
		"--kv-heads":  func(c *AttentionConfig, v int) { c.KVHeads = v },
		"--head-dim":  func(c *AttentionConfig, v int) { c.HeadDim = v },
		"--iters":     func(c *AttentionConfig, v int) { c.Iters = v },
	}
	for flag, f := range set {
		for _, v := range []int{0, -1, math.MaxInt, 1 << 40} {
			c := DefaultAttentionConfig()
			f(&c, v)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), flag) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s %d: %v, want a one-line error naming %s", flag, v, err, flag)
			}
		}
	}
	for _, c := range []struct {
		flag string
		f    func(*AttentionConfig)
	}{
		{"--context", func(c *AttentionConfig) { c.Contexts = nil }},
		{"--budget", func(c *AttentionConfig) { c.Budgets = nil }},
		{"--budget", func(c *AttentionConfig) { c.Budgets = []int{15} }}, // below one page
		{"--kv-heads", func(c *AttentionConfig) { c.QHeads, c.KVHeads = 6, 4 }},
		{"--batch", func(c *AttentionConfig) { c.Contexts, c.PageSize, c.Batch = []int{MaxContext}, 1, 4 }},
		{"--max-memory", func(c *AttentionConfig) { c.MemoryLimit = -2 }},
	} {
		cfg := DefaultAttentionConfig()
		c.f(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%+v: %v, want an error naming %s", cfg, err, c.flag)
		}
	}
}

// TestAttentionPreflight: a configuration over the memory limit is
// refused with memlimit.ErrTooLarge before anything is allocated or run.
func TestAttentionPreflight(t *testing.T) {
	var progress bytes.Buffer
	c := tinyAttention()
	c.Progress = &progress
	c.Contexts = []int{2048, 100_000_000} // 800 GB of K/V for the second
	err := Attention(context.Background(), c, func(AttentionResult) error {
		t.Error("a configuration ran")
		return nil
	})
	if !errors.Is(err, memlimit.ErrTooLarge) || !strings.Contains(err.Error(), "--context 100000000") {
		t.Fatalf("err %v, want ErrTooLarge naming the context", err)
	}
	if progress.Len() != 0 {
		t.Errorf("progress before the refusal: %q", progress.String())
	}
	c.Contexts, c.MemoryLimit = []int{2048}, 1<<20
	if err := c.Preflight(); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Errorf("1 MiB limit: %v, want ErrTooLarge (the copy buffers alone are 512 MiB)", err)
	}
	c.MemoryLimit = memlimit.NoLimit
	if err := c.Preflight(); err != nil {
		t.Errorf("no limit: %v", err)
	}
	if n := tinyAttention().MemoryBytes(2048); n <= 0 || n > 16<<20 {
		t.Errorf("MemoryBytes of the tiny configuration = %d", n)
	}
}

// TestAttentionEmitsEachConfiguration: a configuration's result reaches
// emit before the next configuration starts.
func TestAttentionEmitsEachConfiguration(t *testing.T) {
	var progress bytes.Buffer
	c := tinyAttention()
	c.Contexts, c.Budgets, c.Iters = []int{512, 1024}, []int{64, 128}, 1
	c.Progress = &progress
	var seen []string
	runAttentionEmit := func(r AttentionResult) error {
		seen = append(seen, progress.String())
		return nil
	}
	if err := Attention(context.Background(), c, runAttentionEmit); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 4 {
		t.Fatalf("%d results, want 4", len(seen))
	}
	for i, p := range seen[:2] {
		if strings.Contains(p, "x 1024 tokens") {
			t.Errorf("result %d (context 512) emitted after the 1024 context started:\n%s", i, p)
		}
	}
	if !strings.Contains(seen[1], "budget 128") || strings.Contains(seen[0], "budget 128") {
		t.Errorf("budget results not emitted in turn:\n%q", seen)
	}
}

// flushWriter counts writes and flushes.
type flushWriter struct {
	bytes.Buffer
	writes, flushes int
}

func (w *flushWriter) Write(p []byte) (int, error) { w.writes++; return w.Buffer.Write(p) }
func (w *flushWriter) Flush() error                { w.flushes++; return nil }

// TestWriteJSONLineFlushes: one Write per line, then a flush when the
// writer buffers.
func TestWriteJSONLineFlushes(t *testing.T) {
	var w flushWriter
	for i := range 3 {
		if err := WriteJSONLine(&w, map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
		if w.writes != i+1 || w.flushes != i+1 {
			t.Fatalf("after line %d: %d writes, %d flushes", i, w.writes, w.flushes)
		}
	}
	if got := w.String(); got != "{\"i\":0}\n{\"i\":1}\n{\"i\":2}\n" {
		t.Errorf("output %q", got)
	}
}
