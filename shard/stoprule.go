package shard

import (
	"cmp"
	"math"
	"slices"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
)

// StopCollector gathers one query head's pages of one step, in float64
// from the keys, for the stop rules of notes 3.2 (decode.StopRow): each
// page's Quest bound for this head and its tokens' scaled logits. Feed
// it every page once, in logical order; Reset it between steps. Its
// buffers are kept across steps.
type StopCollector struct {
	pages  []kernels.StopPage
	logits [][]float64
	mn, mx []float64
}

// Reset empties the collector, keeping its buffers.
func (c *StopCollector) Reset() {
	c.pages = c.pages[:0]
	for i := range c.logits {
		c.logits[i] = c.logits[i][:0]
	}
}

// AddPage takes the next page: query q ([d]) and the page's n valid keys
// (page: [>= n][d]). The bound is sum_j max(q_j min_j, q_j max_j) and the
// logits q.k, both in float64 and scaled by 1/sqrt(d): products of
// float32 values are exact in float64 and rounding is monotone, so the
// bound holds for every logit exactly (invariant 1 in float64).
func (c *StopCollector) AddPage(q, page []float32, n, d int) {
	p := len(c.pages)
	if p == len(c.logits) {
		c.logits = append(c.logits, nil)
	}
	lg := c.logits[p][:0]
	scale := 1 / math.Sqrt(float64(d))
	if n <= 0 {
		c.pages = append(c.pages, kernels.StopPage{Bound: math.Inf(-1)})
		c.logits[p] = lg
		return
	}
	c.mn, c.mx = resize64(c.mn, d), resize64(c.mx, d)
	for j := range d {
		c.mn[j], c.mx[j] = math.Inf(1), math.Inf(-1)
	}
	for t := range n {
		k := page[t*d:][:d]
		var s float64
		for j, x := range k {
			v := float64(x)
			c.mn[j], c.mx[j] = min(c.mn[j], v), max(c.mx[j], v)
			s += float64(q[j]) * v
		}
		lg = append(lg, s*scale)
	}
	var u float64
	for j := range d {
		qj := float64(q[j])
		u += max(qj*c.mn[j], qj*c.mx[j])
	}
	c.pages = append(c.pages, kernels.StopPage{Bound: u * scale, Tokens: n})
	c.logits[p] = lg
}

// Row replays the stop rules on the collected pages: forced[p] marks the
// pages always read (sink and local), r is the R of the exact top-R.
func (c *StopCollector) Row(head int, forced []bool, r int) decode.StopRow {
	np := len(c.pages)
	r = max(r, 1)
	// The dense reference: every token, float64.
	var all []kernels.StopToken
	lse := math.Inf(-1)
	for p := range np {
		for t, x := range c.logits[p] {
			all = append(all, kernels.StopToken{Logit: x, Page: p, Slot: t})
			lse = kernels.LogAddExp(lse, x)
		}
	}
	slices.SortFunc(all, kernels.StopBefore)
	top := all[:min(r, len(all))]
	hits := make([]int, np)
	for _, t := range top {
		hits[t.Page]++
	}
	mass := make([]float64, np)
	for p := range np {
		for _, x := range c.logits[p] {
			mass[p] += math.Exp(x - lse)
		}
	}
	var ranked []int
	var fMass float64
	fHits := 0
	for p := range np {
		if forced[p] {
			fMass += mass[p]
			fHits += hits[p]
			continue
		}
		ranked = append(ranked, p)
	}
	slices.SortFunc(ranked, func(a, b int) int {
		if x := cmp.Compare(c.pages[b].Bound, c.pages[a].Bound); x != 0 {
			return x
		}
		return cmp.Compare(a, b)
	})
	row := decode.StopRow{Head: head, Ranked: len(ranked), Exact: true}
	open := func(p int) []float64 { return c.logits[p] }
	for i, b := range decode.StopBatches {
		res := kernels.BranchBound(c.pages, forced, open, kernels.BnBConfig{R: r, Batch: b})
		row.Opened[i], row.Certified[i] = res.Opened, res.Certified
		if !slices.Equal(res.Top, top) {
			row.Exact = false
		}
		if i == 0 {
			row.StopMassBound = res.MassBound
		}
	}
	one := kernels.BranchBound(c.pages, forced, open, kernels.BnBConfig{R: 1})
	row.OpenedTop1, row.CertifiedTop1 = one.Opened, one.Certified
	if len(all) > 0 && (len(one.Top) != 1 || one.Top[0] != all[0]) {
		row.Exact = false
	}
	// Coverage for k = 0..g ranked pages read by descending bound.
	g := min(len(ranked), decode.StopGridMax)
	sorted := make([]float64, len(ranked))
	// suffix[k]: sum over ranked[k:] of S_p exp(U_p - lse).
	suffix := make([]float64, len(ranked)+1)
	for k := len(ranked) - 1; k >= 0; k-- {
		pg := c.pages[ranked[k]]
		sorted[k] = pg.Bound
		if pg.Tokens > 0 {
			suffix[k] = suffix[k+1] + float64(pg.Tokens)*math.Exp(pg.Bound-lse)
		} else {
			suffix[k] = suffix[k+1]
		}
	}
	row.Gap = make([]float32, g+1)
	row.Recall = make([]float32, g+1)
	row.Mass = make([]float32, g+1)
	row.MassBound = make([]float32, g+1)
	m, h := fMass, fHits
	for k := 0; k <= g; k++ {
		if k > 0 {
			m += mass[ranked[k-1]]
			h += hits[ranked[k-1]]
		}
		row.Gap[k] = float32(kernels.ScoreGap(sorted, k))
		if len(top) > 0 {
			row.Recall[k] = float32(h) / float32(len(top))
		}
		row.Mass[k] = float32(min(m, 1))
		a := suffix[k]
		switch {
		case a == 0:
			row.MassBound[k] = 0
		case math.IsInf(a, 1):
			row.MassBound[k] = 1
		default:
			row.MassBound[k] = float32(a / (m + a))
		}
	}
	return row
}

// resize64 returns s with length n, reallocating only to grow.
func resize64(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}
