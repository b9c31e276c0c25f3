package shard

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/questrt/questrt/decode"
)

// TestStopCollectorRow checks a StopRow against a naive float64
// reference written out here: bounds from each page's keys, pages ranked
// by bound, and for every k the top-R recall, softmax mass and the mass
// bound over the pages read, the score gap, and the searches' top-R.
func TestStopCollectorRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 32))
	for trial := range 60 {
		d := 4 + rng.IntN(12)
		s := 1 + rng.IntN(16)
		np := 1 + rng.IntN(40)
		last := 1 + rng.IntN(s)
		r := 1 + rng.IntN(12)
		ties := trial%3 == 0
		draw := func() float32 {
			if ties {
				return float32(rng.IntN(3) - 1)
			}
			return float32(rng.NormFloat64())
		}
		q := make([]float32, d)
		for j := range q {
			q[j] = 2 * draw()
		}
		keys := make([][]float32, np)
		var col StopCollector
		col.AddPage(q, nil, 0, d) // a leftover from an earlier step
		col.Reset()
		for p := range np {
			n := s
			if p == np-1 {
				n = last
			}
			keys[p] = make([]float32, (n+3)*d) // padding after the valid keys
			for i := range keys[p] {
				keys[p][i] = draw()
			}
			col.AddPage(q, keys[p], n, d)
		}
		forced := make([]bool, np)
		for p := range forced {
			forced[p] = p == np-1 || (p == 0 && trial%2 == 0)
		}
		row := col.Row(3, forced, r)

		// The reference.
		scale := 1 / math.Sqrt(float64(d))
		type tok struct {
			x    float64
			p, t int
		}
		var all []tok
		bound := make([]float64, np)
		valid := func(p int) int {
			if p == np-1 {
				return last
			}
			return s
		}
		for p := range np {
			bound[p] = 0
			for j := range d {
				mn, mx := math.Inf(1), math.Inf(-1)
				for i := range valid(p) {
					mn, mx = min(mn, float64(keys[p][i*d+j])), max(mx, float64(keys[p][i*d+j]))
				}
				bound[p] += max(float64(q[j])*mn, float64(q[j])*mx)
			}
			bound[p] *= scale
			for i := range valid(p) {
				var x float64
				for j := range d {
					x += float64(q[j]) * float64(keys[p][i*d+j])
				}
				x *= scale
				if x > bound[p] {
					t.Fatalf("trial %d page %d: logit %v above the bound %v", trial, p, x, bound[p])
				}
				all = append(all, tok{x, p, i})
			}
		}
		sort.SliceStable(all, func(i, j int) bool { return all[i].x > all[j].x }) // stable: page, slot order among ties
		var z float64
		for _, a := range all {
			z += math.Exp(a.x - all[0].x)
		}
		var ranked []int
		for p := range np {
			if !forced[p] {
				ranked = append(ranked, p)
			}
		}
		sort.SliceStable(ranked, func(i, j int) bool { return bound[ranked[i]] > bound[ranked[j]] })
		if row.Head != 3 || row.Ranked != len(ranked) || !row.Exact || len(row.Recall) != min(len(ranked), decode.StopGridMax)+1 {
			t.Fatalf("trial %d: head %d ranked %d (want %d) exact %v, %d grid points", trial, row.Head, row.Ranked, len(ranked), row.Exact, len(row.Recall))
		}
		top := all[:min(r, len(all))]
		for k := range row.Recall {
			read := slices.Clone(forced)
			for _, p := range ranked[:k] {
				read[p] = true
			}
			hit := 0
			for _, a := range top {
				if read[a.p] {
					hit++
				}
			}
			var zr, bnd float64
			for _, a := range all {
				if read[a.p] {
					zr += math.Exp(a.x - all[0].x)
				}
			}
			for p := range np {
				if !read[p] {
					bnd += float64(valid(p)) * math.Exp(bound[p]-all[0].x)
				}
			}
			wantBound := 0.0
			if bnd > 0 {
				wantBound = bnd / (zr + bnd)
			}
			near := func(a float32, b float64) bool { return math.Abs(float64(a)-b) <= 1e-5*max(1, math.Abs(b)) }
			if !near(row.Recall[k], float64(hit)/float64(len(top))) || !near(row.Mass[k], zr/z) || !near(row.MassBound[k], wantBound) {
				t.Fatalf("trial %d k %d: recall %v mass %v bound %v, want %v %v %v", trial, k, row.Recall[k], row.Mass[k], row.MassBound[k], float64(hit)/float64(len(top)), zr/z, wantBound)
			}
			if float64(row.MassBound[k]) < 1-zr/z-1e-6 {
				t.Fatalf("trial %d k %d: mass bound %v below the dropped mass %v", trial, k, row.MassBound[k], 1-zr/z)
			}
			wantGap := math.Inf(1)
			if k > 0 && k < len(ranked) {
				wantGap = bound[ranked[k-1]] - bound[ranked[k]]
			}
			if !(math.IsInf(wantGap, 1) && math.IsInf(float64(row.Gap[k]), 1)) && !near(row.Gap[k], wantGap) {
				t.Fatalf("trial %d k %d: gap %v, want %v", trial, k, row.Gap[k], wantGap)
			}
		}
		// The one-page search stops at the first k whose next bound is
		// below the R-th logit of the pages read (with R tokens read).
		want := len(ranked)
		for k := range len(ranked) {
			read := slices.Clone(forced)
			for _, p := range ranked[:k] {
				read[p] = true
			}
			var xs []float64
			for _, a := range all {
				if read[a.p] {
					xs = append(xs, a.x)
				}
			}
			if len(xs) >= r && bound[ranked[k]] < xs[r-1] {
				want = k
				break
			}
		}
		// The same for R = 1.
		want1 := len(ranked)
		for k := range len(ranked) {
			best := math.Inf(-1)
			for _, a := range all {
				if forced[a.p] || slices.Contains(ranked[:k], a.p) {
					best = max(best, a.x)
				}
			}
			if bound[ranked[k]] < best {
				want1 = k
				break
			}
		}
		if row.OpenedTop1 != want1 || row.CertifiedTop1 != (want1 < len(ranked)) {
			t.Fatalf("trial %d: top-1 search opened %d certified %v, want %d of %d", trial, row.OpenedTop1, row.CertifiedTop1, want1, len(ranked))
		}
		if row.Opened[0] != want || row.Certified[0] != (want < len(ranked)) {
			t.Fatalf("trial %d: opened %d certified %v, want %d of %d", trial, row.Opened[0], row.Certified[0], want, len(ranked))
		}
	}
}
