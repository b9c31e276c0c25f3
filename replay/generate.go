package replay

import (
	"fmt"
	"math/rand/v2"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// GenConfig sizes a generated case.
type GenConfig struct {
	Tokens, PageSize, BudgetTokens int
	QHeads, KVHeads, HeadDim       int
	GQA                            string
	SinkPages, LocalPages          int
	Seed                           uint64
}

// Ranges of the GenConfig fields that no other field bounds. The memory
// check ([GenConfig.Check]) refuses most large geometries well before.
const (
	MaxGenTokens  = 1 << 24 // tokens, page size and budget
	MaxGenHeads   = 1024    // query heads (KV heads divide them)
	MaxGenHeadDim = 4096
)

// Validate reports the first field of g that cannot make a valid case,
// in the CLI's form "--flag VALUE: want RANGE", naming the field as
// `questctl replay gen` spells its flag.
func (g GenConfig) Validate() error {
	for _, f := range []struct {
		name   string
		v      int
		lo, hi int
		note   string
	}{
		{"tokens", g.Tokens, 1, MaxGenTokens, ""},
		{"q-heads", g.QHeads, 1, MaxGenHeads, ", a multiple of --kv-heads"},
		{"kv-heads", g.KVHeads, 1, MaxGenHeads, ", dividing --q-heads"},
		{"head-dim", g.HeadDim, 1, MaxGenHeadDim, ""},
		{"page-size", g.PageSize, 1, MaxGenTokens, " tokens"},
	} {
		if f.v < f.lo || f.v > f.hi {
			return fmt.Errorf("--%s %d: want %d..%d%s", f.name, f.v, f.lo, f.hi, f.note)
		}
	}
	if g.BudgetTokens < g.PageSize || g.BudgetTokens > MaxGenTokens {
		return fmt.Errorf("--budget %d: want %d..%d tokens (at least one page of --page-size %d)", g.BudgetTokens, g.PageSize, MaxGenTokens, g.PageSize)
	}
	if g.QHeads%g.KVHeads != 0 {
		return fmt.Errorf("--q-heads %d: want a multiple of --kv-heads %d, at most %d", g.QHeads, g.KVHeads, MaxGenHeads)
	}
	// The forced pages are part of the K = B/S pages read; the sum is
	// compared without overflowing.
	k := g.BudgetTokens / g.PageSize
	for _, f := range []struct {
		name string
		v    int
	}{{"sink-pages", g.SinkPages}, {"local-pages", g.LocalPages}} {
		if f.v < 0 {
			return fmt.Errorf("--%s %d: want 0..%d (--sink-pages + --local-pages at most K = --budget %d / --page-size %d pages)", f.name, f.v, k, g.BudgetTokens, g.PageSize)
		}
	}
	if g.SinkPages > k || g.LocalPages > k-g.SinkPages {
		return fmt.Errorf("--sink-pages %d + --local-pages %d: want at most K = %d forced pages (--budget %d / --page-size %d, forced pages included)",
			g.SinkPages, g.LocalPages, k, g.BudgetTokens, g.PageSize)
	}
	if _, err := plan.ParseGQAMode(g.GQA); err != nil {
		return fmt.Errorf("--gqa %q: want group_max or per_head", g.GQA)
	}
	return nil
}

// Check validates g and refuses, before anything is allocated, a case
// whose generation (the case in memory) or whose single-shard replay
// ([Case.Check]) would not fit limit (bytes, memlimit.Auto or
// memlimit.NoLimit).
func (g GenConfig) Check(limit int64) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if limit < memlimit.NoLimit {
		return fmt.Errorf("memory limit %d: want bytes, 0 (available memory) or -1 (no check)", limit)
	}
	// Every row is its own slice: 4 bytes a value, up to a quarter more
	// for the allocator's size classes, and a 24-byte header.
	row := memlimit.Add(memlimit.Mul(int64(g.HeadDim), 5), 48)
	need := memlimit.Add(memlimit.Mul(2, int64(g.KVHeads), int64(g.Tokens), row), memlimit.Mul(int64(g.QHeads), row))
	what := fmt.Sprintf("the keys, values and query of %d tokens x kv-heads %d x head-dim %d", g.Tokens, g.KVHeads, g.HeadDim)
	if err := memlimit.Check(what, need, limit); err != nil {
		return err
	}
	gm := geometry{g.Tokens, g.PageSize, g.BudgetTokens, g.QHeads, g.KVHeads, g.HeadDim}
	if err := gm.check(Options{MemoryLimit: limit}); err != nil {
		return fmt.Errorf("replaying the case: %w", err)
	}
	return nil
}

// Generate makes a random case: keys are Gaussian with a per-page offset
// per KV head (so pages differ), values Gaussian, the query Gaussian with
// scale 2. The case is a pure function of g.
func Generate(g GenConfig) *Case {
	rng := rand.New(rand.NewPCG(g.Seed, 0x9e3779b97f4a7c15))
	c := &Case{
		PageSize: g.PageSize, BudgetTokens: g.BudgetTokens, GQA: g.GQA,
		SinkPages: g.SinkPages, LocalPages: g.LocalPages,
		QHeads: g.QHeads, KVHeads: g.KVHeads, HeadDim: g.HeadDim,
	}
	vec := func(scale, off float64) []float32 {
		v := make([]float32, g.HeadDim)
		for i := range v {
			v[i] = float32(rng.NormFloat64()*scale + off)
		}
		return v
	}
	c.Keys = make([][][]float32, g.KVHeads)
	c.Values = make([][][]float32, g.KVHeads)
	for h := range g.KVHeads {
		c.Keys[h] = make([][]float32, 0, g.Tokens)
		c.Values[h] = make([][]float32, 0, g.Tokens)
		var off float64
		for t := range g.Tokens {
			if t%g.PageSize == 0 {
				off = rng.NormFloat64() * 0.5
			}
			c.Keys[h] = append(c.Keys[h], vec(1, off))
			c.Values[h] = append(c.Values[h], vec(1, 0))
		}
	}
	c.Query = make([][]float32, 0, g.QHeads)
	for range g.QHeads {
		c.Query = append(c.Query, vec(2, 0))
	}
	return c
}
