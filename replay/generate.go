package replay

import "math/rand/v2"

// GenConfig sizes a generated case.
type GenConfig struct {
	Tokens, PageSize, BudgetTokens int
	QHeads, KVHeads, HeadDim       int
	GQA                            string
	SinkPages, LocalPages          int
	Seed                           uint64
}

// Generate makes a random case: keys are Gaussian with a per-page offset
// per KV head (so pages differ), values Gaussian, the query Gaussian with
// scale 2.
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
		var off float64
		for t := range g.Tokens {
			if t%g.PageSize == 0 {
				off = rng.NormFloat64() * 0.5
			}
			c.Keys[h] = append(c.Keys[h], vec(1, off))
			c.Values[h] = append(c.Values[h], vec(1, 0))
		}
	}
	for range g.QHeads {
		c.Query = append(c.Query, vec(2, 0))
	}
	return c
}
