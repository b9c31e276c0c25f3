package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// stopCase is random pages of keys for one query: the Quest box bound
// and the logits, both in float64 from the same keys, scaled by
// 1/sqrt(d).
type stopCase struct {
	pages  []StopPage
	logits [][]float64
	forced []bool
}

// newStopCase draws n pages of up to s tokens of dimension d; with ties,
// keys and the query are small integers, so many logits and bounds tie.
func newStopCase(rng *rand.Rand, n, s, d int, ties bool) stopCase {
	draw := func() float64 {
		if ties {
			return float64(rng.IntN(3) - 1)
		}
		return rng.NormFloat64()
	}
	q := make([]float64, d)
	for j := range q {
		q[j] = draw()
	}
	scale := 1 / math.Sqrt(float64(d))
	c := stopCase{pages: make([]StopPage, n), logits: make([][]float64, n), forced: make([]bool, n)}
	for p := range n {
		tok := 1 + rng.IntN(s)
		if rng.IntN(8) == 0 {
			tok = 0 // an empty page
		}
		mn, mx := make([]float64, d), make([]float64, d)
		for j := range d {
			mn[j], mx[j] = math.Inf(1), math.Inf(-1)
		}
		for range tok {
			var dot float64
			for j := range d {
				k := draw()
				// A slow drift makes some pages clearly better.
				if !ties {
					k += 0.05 * float64(p%7) * q[j]
				}
				mn[j], mx[j] = min(mn[j], k), max(mx[j], k)
				dot += q[j] * k
			}
			c.logits[p] = append(c.logits[p], dot*scale)
		}
		u := math.Inf(-1)
		if tok > 0 {
			u = 0
			for j := range d {
				u += max(q[j]*mn[j], q[j]*mx[j])
			}
			u *= scale
		}
		c.pages[p] = StopPage{Bound: u, Tokens: tok}
		c.forced[p] = p == n-1 || rng.IntN(16) == 0
	}
	return c
}

// naiveTop is the float64 full scan: every token sorted, the first r.
func (c stopCase) naiveTop(r int) []StopToken {
	var all []StopToken
	for p, lg := range c.logits {
		for t, x := range lg {
			all = append(all, StopToken{Logit: x, Page: p, Slot: t})
		}
	}
	slices.SortFunc(all, StopBefore)
	return all[:min(r, len(all))]
}

func TestBranchBoundIsExactTopR(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 32))
	certified := 0
	for trial := range 600 {
		ties := trial%2 == 1
		n := 1 + rng.IntN(40)
		c := newStopCase(rng, n, 1+rng.IntN(16), 2+rng.IntN(8), ties)
		var forced []bool
		if trial%3 != 0 {
			forced = c.forced
		}
		r := 1 + rng.IntN(12)
		calls := make([]int, n)
		open := func(p int) []float64 { calls[p]++; return c.logits[p] }
		res := BranchBound(c.pages, forced, open, BnBConfig{R: r, Batch: 1 + rng.IntN(4)})
		want := c.naiveTop(r)
		if !slices.Equal(res.Top, want) {
			t.Fatalf("trial %d (ties %v, r %d): top %v, the full scan's %v", trial, ties, r, res.Top, want)
		}
		// Every page read once at most; the unread ones hold no token at
		// or above tau (the certificate did not stop early).
		opened := map[int]bool{}
		for _, p := range res.Open {
			opened[p] = true
		}
		for p, k := range calls {
			isForced := forced != nil && forced[p]
			if k > 1 || (k == 1) != (isForced || opened[p]) {
				t.Fatalf("trial %d: page %d opened %d times (forced %v, in Open %v)", trial, p, k, isForced, opened[p])
			}
			if k == 0 && len(want) == r {
				for _, x := range c.logits[p] {
					if x >= want[r-1].Logit {
						t.Fatalf("trial %d: unread page %d holds logit %v >= the R-th %v", trial, p, x, want[r-1].Logit)
					}
				}
			}
		}
		ranked := 0
		for p := range n {
			if forced == nil || !forced[p] {
				ranked++
			}
		}
		if res.Opened != len(res.Open) || res.Certified != (res.Opened < ranked) {
			t.Fatalf("trial %d: opened %d, open list %d, certified %v, ranked %d", trial, res.Opened, len(res.Open), res.Certified, ranked)
		}
		if res.Certified {
			certified++
		}
	}
	// The property means something only where the search stopped early.
	if certified < 100 {
		t.Fatalf("only %d of 600 searches stopped on the certificate", certified)
	}
	t.Logf("%d of 600 searches stopped on the certificate", certified)
}

// A batch of b pages per round stops at the first multiple of b at or
// after the one-page search's stop (each check sees a higher tau and a
// lower next bound than the one-page search's stop did).
func TestBranchBoundBatchRoundsUp(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 32))
	for trial := range 300 {
		c := newStopCase(rng, 1+rng.IntN(60), 16, 8, trial%2 == 1)
		open := func(p int) []float64 { return c.logits[p] }
		one := BranchBound(c.pages, c.forced, open, BnBConfig{R: 4})
		ranked := 0
		for _, f := range c.forced {
			if !f {
				ranked++
			}
		}
		for _, b := range []int{2, 3, 8} {
			got := BranchBound(c.pages, c.forced, open, BnBConfig{R: 4, Batch: b})
			want := min((one.Opened+b-1)/b*b, ranked)
			if got.Opened != want || got.Rounds != (got.Opened+b-1)/b {
				t.Fatalf("trial %d batch %d: opened %d in %d rounds, want %d (one page a round: %d of %d)", trial, b, got.Opened, got.Rounds, want, one.Opened, ranked)
			}
		}
	}
}

// The mass bound is at least the true softmax mass of the unread tokens
// (float64 over every logit), for the search's stop and for random read
// sets.
func TestMassBoundBoundsDroppedMass(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 32))
	for trial := range 400 {
		c := newStopCase(rng, 1+rng.IntN(50), 16, 1+rng.IntN(16), trial%2 == 1)
		// Logits up to a few hundred: the bound must not overflow.
		shift := float64(rng.IntN(400))
		for p := range c.pages {
			c.pages[p].Bound += shift
			for t := range c.logits[p] {
				c.logits[p][t] += shift
			}
		}
		check := func(read []bool, bound float64, what string) {
			var zr, zu float64
			for p, lg := range c.logits {
				for _, x := range lg {
					if read[p] {
						zr += math.Exp(x - shift)
					} else {
						zu += math.Exp(x - shift)
					}
				}
			}
			eps := 0.0
			if zu > 0 {
				eps = zu / (zr + zu)
			}
			if !(bound >= eps*(1-1e-12)) || bound > 1 {
				t.Fatalf("trial %d %s: bound %v below the dropped mass %v", trial, what, bound, eps)
			}
		}
		open := func(p int) []float64 { return c.logits[p] }
		res := BranchBound(c.pages, c.forced, open, BnBConfig{R: 1 + rng.IntN(8)})
		read := slices.Clone(c.forced)
		for _, p := range res.Open {
			read[p] = true
		}
		check(read, res.MassBound, "stop")
		for p := range read {
			read[p] = rng.IntN(2) == 0
		}
		logZ := math.Inf(-1)
		var unread []StopPage
		for p, lg := range c.logits {
			if !read[p] {
				unread = append(unread, c.pages[p])
				continue
			}
			for _, x := range lg {
				logZ = LogAddExp(logZ, x)
			}
		}
		check(read, MassBound(logZ, unread), "random read set")
	}
}

func TestScoreGap(t *testing.T) {
	s := []float64{5, 3, 3, 1}
	for _, c := range []struct {
		k    int
		want float64
	}{{0, math.Inf(1)}, {1, 2}, {2, 0}, {3, 2}, {4, math.Inf(1)}} {
		if g := ScoreGap(s, c.k); g != c.want {
			t.Errorf("ScoreGap(%v, %d) = %v, want %v", s, c.k, g, c.want)
		}
	}
}
