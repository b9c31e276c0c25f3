package shard

import (
	"math"
	"slices"
)

// PageSlack returns the notes' page slack g_p(q) = U_p(q) - max_r q.k_r
// of one query head over one page of one KV head, in logit units (scaled
// by 1/sqrt(d)), computed in float64 from the page's keys: U_p(q) is the
// Quest bound sum_j max(q_j min_j, q_j max_j) over the per-dimension
// minimum and maximum of the page's n valid keys (page: [>= n][d]). The
// bound holds, so the slack is never negative (invariant 1); it is 0 for
// a page of one token. A page with no valid token has slack 0.
func PageSlack(q, page []float32, n, d int) float64 {
	if n <= 0 {
		return 0
	}
	var u float64
	best := math.Inf(-1)
	for j := range d {
		mn, mx := math.Inf(1), math.Inf(-1)
		for t := range n {
			x := float64(page[t*d+j])
			mn, mx = min(mn, x), max(mx, x)
		}
		qj := float64(q[j])
		u += max(qj*mn, qj*mx)
	}
	for t := range n {
		var s float64
		for j := range d {
			s += float64(q[j]) * float64(page[t*d+j])
		}
		best = max(best, s)
	}
	return (u - best) / math.Sqrt(float64(d))
}

// SlackPages bounds the pages per sequence and step whose slack the
// diagnostics compute: float64 over every key of a page per query head
// costs more than the rest of a diagnostic step, so long sequences are
// sampled (see [SlackStride]).
const SlackPages = 256

// SlackStride returns the stride of the pages whose slack a step of np
// pages records: every page up to [SlackPages] pages, else every
// ceil(np/SlackPages)-th page (page 0, stride, 2*stride, ...).
func SlackStride(np int) int { return max(1, (np+SlackPages-1)/SlackPages) }

// SlackStats collects the page slacks of one step's (query head, page)
// pairs and summarizes them.
type SlackStats struct{ v []float64 }

// Add records one slack.
func (s *SlackStats) Add(g float64) { s.v = append(s.v, g) }

// AddTo sets dg's slack quantiles (NaN when nothing was recorded).
func (s *SlackStats) AddTo(dg *Diagnostics) {
	if len(s.v) == 0 {
		dg.SlackP50, dg.SlackP90, dg.SlackMax = math.NaN(), math.NaN(), math.NaN()
		return
	}
	slices.Sort(s.v)
	q := func(f float64) float64 { return s.v[min(len(s.v)-1, int(f*float64(len(s.v))))] }
	dg.SlackP50, dg.SlackP90, dg.SlackMax = q(0.5), q(0.9), s.v[len(s.v)-1]
}
