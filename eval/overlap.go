package eval

import "github.com/questrt/questrt/model"

// Overlap of adjacent sparse layers' selections (issue 32 item 5: the
// notes' "相邻层候选 Jaccard"). At every step with diagnostics, for each
// pair of adjacent layers (L, L+1) that both ranked pages, and each KV
// head, the ranked pages of a layer are the pages it attended minus the
// forced ones (sink and local: those overlap by construction), unioned
// over the KV head's query heads (group_max: one set already). The
// diagnostic sums, per pair, the Jaccard index |A∩B| / |A∪B|, the share
// of layer L+1's ranked pages already in layer L's |A∩B| / |B|, and the
// share a uniformly random choice of |B| candidates would reach, |A| / C
// with C the candidate pages: what layer L+1 could take from layer L
// without ranking.

// OverlapSums sums one adjacent pair's overlap over (step, KV head)
// samples.
type OverlapSums struct {
	Layer                  int // the pair is (Layer, Layer+1)
	Samples                int
	Jaccard, Share, Chance float64
	// Empty counts samples where layer L+1 ranked no page (not in the
	// sums).
	Empty int
}

// overlapStep adds the step's adjacent-layer overlaps into sums (one
// entry per pair, grown as needed); kvHeads groups the query heads.
func overlapStep(sums []OverlapSums, steps []model.StepInfo, kvHeads int) []OverlapSums {
	if len(sums) < len(steps)-1 {
		for l := len(sums); l < len(steps)-1; l++ {
			sums = append(sums, OverlapSums{Layer: l})
		}
	}
	var a, b map[int32]bool
	for l := 0; l+1 < len(steps); l++ {
		s0, s1 := steps[l], steps[l+1]
		if !ranked(s0) || !ranked(s1) || s0.Plan.Pages != s1.Plan.Pages || kvHeads <= 0 {
			continue
		}
		g := len(s0.Selected) / kvHeads
		if g == 0 || len(s1.Selected) != len(s0.Selected) {
			continue
		}
		cand := s1.Plan.Hi() - s1.Plan.Lo()
		for kh := range kvHeads {
			a = rankedSet(a, s0, kh*g, g)
			b = rankedSet(b, s1, kh*g, g)
			x := &sums[l]
			if len(b) == 0 {
				x.Empty++
				continue
			}
			inter := 0
			for p := range b {
				if a[p] {
					inter++
				}
			}
			x.Samples++
			x.Jaccard += float64(inter) / float64(len(a)+len(b)-inter)
			x.Share += float64(inter) / float64(len(b))
			x.Chance += float64(len(a)) / float64(max(cand, 1))
		}
	}
	return sums
}

// ranked reports whether the step's plan ranked pages and its
// diagnostics hold the selection.
func ranked(s model.StepInfo) bool {
	return s.Diag && !s.Plan.Dense && s.Plan.Rank > 0 && len(s.Selected) > 0
}

// rankedSet fills m with the non-forced pages attended by query heads
// [h0, h0+n) of step s.
func rankedSet(m map[int32]bool, s model.StepInfo, h0, n int) map[int32]bool {
	if m == nil {
		m = map[int32]bool{}
	}
	clear(m)
	lo, hi := int32(s.Plan.Lo()), int32(s.Plan.Hi())
	for h := h0; h < h0+n; h++ {
		for _, p := range s.Selected[h] {
			if p >= lo && p < hi {
				m[p] = true
			}
		}
	}
	return m
}

// mergeOverlap adds o into s.
func mergeOverlap(s, o []OverlapSums) []OverlapSums {
	for len(s) < len(o) {
		s = append(s, OverlapSums{Layer: len(s)})
	}
	for i, x := range o {
		y := &s[i]
		y.Samples += x.Samples
		y.Empty += x.Empty
		y.Jaccard += x.Jaccard
		y.Share += x.Share
		y.Chance += x.Chance
	}
	return s
}

// OverlapRecord is one adjacent pair's overlap averaged over (step, KV
// head) samples: mean Jaccard, mean share of layer Layer+1's ranked
// pages found in layer Layer's, and the share a random choice would
// find.
type OverlapRecord struct {
	Layers  [2]int  `json:"layers"`
	Samples int     `json:"samples"`
	Jaccard float64 `json:"jaccard"`
	Share   float64 `json:"share"`
	Chance  float64 `json:"chance"`
}

// overlapRecords averages the pairs that have samples.
func overlapRecords(s []OverlapSums) []OverlapRecord {
	var out []OverlapRecord
	for _, x := range s {
		if x.Samples == 0 {
			continue
		}
		n := float64(x.Samples)
		out = append(out, OverlapRecord{Layers: [2]int{x.Layer, x.Layer + 1}, Samples: x.Samples,
			Jaccard: x.Jaccard / n, Share: x.Share / n, Chance: x.Chance / n})
	}
	return out
}
