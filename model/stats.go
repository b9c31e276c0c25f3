package model

import "time"

// StepSummary totals one decode step over the layers: pages and bytes of
// K/V read against dense attention, and the byte model of the notes (eq.
// 12), rho = 1/S + K/P for a sparse layer (its summaries are scanned, K
// of P pages read) and 1 for a dense one.
type StepSummary struct {
	// PagesRead and PagesTotal are (KV head, page) pairs over all layers.
	PagesRead, PagesTotal int
	// Rho is the bytes read (K/V of the pages read plus the summaries a
	// sparse layer scans) over the bytes of dense attention, all layers.
	Rho float64
	// RhoFormula is the mean over layers of 1/S + K/P (sparse) or 1.
	RhoFormula float64
	// SparseRho and SparseRhoFormula are the same over the sparse layers
	// only (0 when every layer was dense).
	SparseRho, SparseRhoFormula float64
	// SparseLayers counts the layers whose plan was not dense.
	SparseLayers int
	// Score, TopK, Select, Attend, Merge, Fused and Total sum the
	// engine's phase times over the layers.
	Score, TopK, Select, Attend, Merge, Fused, Total time.Duration
}

// Summarize totals the per-layer statistics of one decode step for page
// size s.
func Summarize(steps []StepInfo, s int) StepSummary {
	var sum StepSummary
	inv := 1 / float64(s)
	var read, dense, sread, sdense float64
	for _, st := range steps {
		sum.PagesRead += st.PagesRead
		sum.PagesTotal += st.PagesTotal
		r, d := float64(st.PagesRead), float64(st.PagesTotal)
		if st.Plan.Dense {
			read += r
			dense += d
			sum.RhoFormula++
		} else {
			// Every page's summary (1/S of its K/V bytes) is scanned.
			b := r + d*inv
			read += b
			dense += d
			sread += b
			sdense += d
			sum.SparseLayers++
			f := inv
			if st.Plan.Pages > 0 {
				f += float64(st.Plan.K) / float64(st.Plan.Pages)
			}
			sum.RhoFormula += f
			sum.SparseRhoFormula += f
		}
		t := st.Time
		sum.Score += t.Score
		sum.TopK += t.TopK
		sum.Select += t.Select
		sum.Attend += t.Attend
		sum.Merge += t.Merge
		sum.Fused += t.Fused
		sum.Total += t.Total
	}
	if dense > 0 {
		sum.Rho = read / dense
	}
	if len(steps) > 0 {
		sum.RhoFormula /= float64(len(steps))
	}
	if sum.SparseLayers > 0 {
		sum.SparseRho = sread / sdense
		sum.SparseRhoFormula /= float64(sum.SparseLayers)
	}
	return sum
}
