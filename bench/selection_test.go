package bench

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
)

func tinySelection() SelectionConfig {
	c := DefaultSelectionConfig()
	c.CP, c.Context, c.Budget = []int{2}, 1024, 128
	c.QHeads, c.KVHeads, c.HeadDim, c.Steps = 4, 2, 16, 2
	return c
}

// TestSelectionConfigValidate: every numeric setting at 0, -1 and a huge
// value is refused in one line naming its flag (--kv-heads 0 and
// --page-size 0 divided by zero, --head-dim -1 panicked in make).
func TestSelectionConfigValidate(t *testing.T) {
	if err := DefaultSelectionConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	set := map[string]func(*SelectionConfig, int){
		"--cp":        func(c *SelectionConfig, v int) { c.CP = []int{2, v} },
		"--context":   func(c *SelectionConfig, v int) { c.Context = v },
		"--budget":    func(c *SelectionConfig, v int) { c.Budget = v },
		"--page-size": func(c *SelectionConfig, v int) { c.PageSize = v },
		"--q-heads":   func(c *SelectionConfig, v int) { c.QHeads = v },
		"--kv-heads":  func(c *SelectionConfig, v int) { c.KVHeads = v },
		"--head-dim":  func(c *SelectionConfig, v int) { c.HeadDim = v },
		"--steps":     func(c *SelectionConfig, v int) { c.Steps = v },
	}
	for flag, f := range set {
		for _, v := range []int{0, -1, math.MaxInt, 1 << 40} {
			c := DefaultSelectionConfig()
			f(&c, v)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), flag) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s %d: %v, want a one-line error naming %s", flag, v, err, flag)
			}
			// Selection itself refuses it too, without panicking.
			if err := Selection(context.Background(), c, func(SelectionResult) error { return nil }); err == nil {
				t.Errorf("%s %d: Selection ran", flag, v)
			}
		}
	}
	for _, c := range []struct {
		flag string
		f    func(*SelectionConfig)
	}{
		{"--cp", func(c *SelectionConfig) { c.CP = nil }},
		{"--selection", func(c *SelectionConfig) { c.Modes = nil }},
		{"--selection", func(c *SelectionConfig) { c.Modes = []engine.Selection{7} }},
		{"--budget", func(c *SelectionConfig) { c.Budget = 15 }},
		{"--kv-heads", func(c *SelectionConfig) { c.QHeads, c.KVHeads = 6, 4 }},
		{"--max-memory", func(c *SelectionConfig) { c.MemoryLimit = -2 }},
	} {
		cfg := DefaultSelectionConfig()
		c.f(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%+v: %v, want an error naming %s", cfg, err, c.flag)
		}
	}
}

// TestSelectionPreflight: a context too large for memory is refused with
// memlimit.ErrTooLarge before anything is allocated (it ran out of memory
// in make before).
func TestSelectionPreflight(t *testing.T) {
	var progress bytes.Buffer
	c := tinySelection()
	c.Context, c.Progress = 100_000_000, &progress
	err := Selection(context.Background(), c, func(SelectionResult) error {
		t.Error("a configuration ran")
		return nil
	})
	if !errors.Is(err, memlimit.ErrTooLarge) || !strings.Contains(err.Error(), "--context 100000000") {
		t.Fatalf("err %v, want ErrTooLarge naming the context", err)
	}
	if progress.Len() != 0 {
		t.Errorf("progress before the refusal: %q", progress.String())
	}
	c = tinySelection()
	c.MemoryLimit = 1 << 10
	if err := c.Preflight(); !errors.Is(err, memlimit.ErrTooLarge) {
		t.Errorf("1 KiB limit: %v, want ErrTooLarge", err)
	}
	c.MemoryLimit = 64 << 20
	if err := c.Preflight(); err != nil {
		t.Errorf("64 MiB limit for a tiny run: %v", err)
	}
}

// TestSelectionEmitsEachConfiguration: each (cp, mode) result reaches emit
// before the next configuration is set up, with non-zero phase times.
func TestSelectionEmitsEachConfiguration(t *testing.T) {
	var progress bytes.Buffer
	c := tinySelection()
	c.CP, c.Progress = []int{2, 3}, &progress
	var seen []string
	var rs []SelectionResult
	if err := Selection(context.Background(), c, func(r SelectionResult) error {
		seen, rs = append(seen, progress.String()), append(rs, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(rs) != 6 {
		t.Fatalf("%d results, want 6", len(rs))
	}
	for i, r := range rs {
		// The progress so far ends with this configuration's setup.
		if n := strings.Count(seen[i], "filling"); n != i+1 {
			t.Errorf("result %d (cp %d %s) emitted after %d setups", i, r.CP, r.Mode, n)
		}
		if !(r.StepUS > 0 && r.ScoreUS > 0 && r.MergeUS > 0) {
			t.Errorf("cp %d %s: step %v score %v merge %v us, want > 0", r.CP, r.Mode, r.StepUS, r.ScoreUS, r.MergeUS)
		}
		if r.Mode == "exact" && !(r.SelectUS > 0) {
			t.Errorf("cp %d exact: select %v us, want > 0", r.CP, r.SelectUS)
		}
	}
}
