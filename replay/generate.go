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

// Validate reports the first field of g that cannot make a valid case.
// Errors name the field as `questctl replay gen` spells its flag.
func (g GenConfig) Validate() error {
	switch {
	case g.Tokens < 1:
		return fmt.Errorf("tokens %d must be positive", g.Tokens)
	case g.PageSize < 1:
		return fmt.Errorf("page-size %d must be positive", g.PageSize)
	case g.BudgetTokens < g.PageSize:
		return fmt.Errorf("budget %d is below one page (page-size %d)", g.BudgetTokens, g.PageSize)
	case g.QHeads < 1 || g.KVHeads < 1 || g.HeadDim < 1:
		return fmt.Errorf("q-heads %d, kv-heads %d and head-dim %d must be positive", g.QHeads, g.KVHeads, g.HeadDim)
	case g.QHeads%g.KVHeads != 0:
		return fmt.Errorf("q-heads %d is not a multiple of kv-heads %d", g.QHeads, g.KVHeads)
	case g.SinkPages < 0 || g.LocalPages < 0:
		return fmt.Errorf("sink-pages %d and local-pages %d must not be negative", g.SinkPages, g.LocalPages)
	}
	if _, err := plan.ParseGQAMode(g.GQA); err != nil {
		return err
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
