package shard

import (
	"math"
	"math/rand/v2"
	"testing"
)

// PageSlack against a hand-worked page and against the bound's property
// on random pages: U_p(q) >= max_r q.k_r (slack >= 0), 0 for one token.
func TestPageSlack(t *testing.T) {
	// d = 2, keys (1, -1) and (-2, 3), q = (1, 1): min (-2, -1), max (1, 3);
	// U = max(-2, 1) + max(-1, 3) = 4; dots 0 and 1; slack (4-1)/sqrt 2.
	page := []float32{1, -1, -2, 3}
	if g, want := PageSlack([]float32{1, 1}, page, 2, 2), 3/math.Sqrt2; math.Abs(g-want) > 1e-12 {
		t.Fatalf("hand-worked slack %g, want %g", g, want)
	}
	if g := PageSlack([]float32{1, 1}, page, 1, 2); g != 0 {
		t.Fatalf("one token: slack %g", g)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		d, n := 1+rng.IntN(32), 1+rng.IntN(16)
		q, p := make([]float32, d), make([]float32, n*d)
		for i := range q {
			q[i] = float32(rng.NormFloat64() * 3)
		}
		for i := range p {
			p[i] = float32(rng.NormFloat64())
		}
		if g := PageSlack(q, p, n, d); g < -1e-9 {
			t.Fatalf("negative slack %g (d %d, n %d)", g, d, n)
		}
	}
	var s SlackStats
	var dg Diagnostics
	s.AddTo(&dg)
	if !math.IsNaN(dg.SlackP50) {
		t.Fatalf("empty stats: p50 %g", dg.SlackP50)
	}
	for i := range 100 {
		s.Add(float64(i))
	}
	s.AddTo(&dg)
	if dg.SlackP50 != 50 || dg.SlackP90 != 90 || dg.SlackMax != 99 {
		t.Fatalf("quantiles %g %g %g", dg.SlackP50, dg.SlackP90, dg.SlackMax)
	}
}
