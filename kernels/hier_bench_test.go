package kernels

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchSummaries draws a pool of pages page summaries directly (no keys):
// "random": per element min = c - |a|, max = c + |b| with c, a, b normal
// (boxes of random keys; the bound separates nothing); "needles": the same
// at a tenth of the scale, and one page in 64 shifted by 3 along a random
// direction (a few pages stand out, as retrieval heads see them: 1024
// at 1M tokens, more than K).
func benchSummaries(rng *rand.Rand, s Shape, pages int, kind string) []float32 {
	d, rec := s.HeadDim, 2*s.HeadDim
	sum := make([]float32, pages*s.KVHeads*rec)
	for p := range pages {
		scale, shift := float32(1), float32(0)
		if kind == "needles" {
			scale = 0.1
			if rng.IntN(64) == 0 {
				shift = 3
			}
		}
		for kvh := range s.KVHeads {
			r := sum[(p*s.KVHeads+kvh)*rec:][:rec]
			for j := range d {
				c := float32(rng.NormFloat64()) * scale
				if shift != 0 {
					c += shift * float32(rng.NormFloat64())
				}
				a, b := float32(rng.NormFloat64())*scale, float32(rng.NormFloat64())*scale
				r[j], r[d+j] = c-abs32(a), c+abs32(b)
			}
		}
	}
	return sum
}

func abs32(x float32) float32 { return max(x, -x) }

// BenchmarkHierRank compares, in one run, flat Quest ranking (Score +
// TopK: CPU.Rank) with the hierarchical search (CPU.HierRank, trees built
// once outside the timing, as a store keeps them) on one layer and one KV
// head group (4 query heads, D = 128, S = 16, budget 2048 tokens: K = 128
// pages), at 64K and 1M tokens. records/cand is the share of summary
// records the search scored (1 for flat). Each search runs without
// (nomemo: HierConfig.MaxSkip -1, every call searches) and with the
// fallback memory (memo: the default MaxSkip); skipped/row is the share
// of calls that skipped the search because it fell back recently. The
// memory's schedule (16, 32, ..., 256 calls) needs about a thousand
// calls to come near its steady state: -benchtime 1000x.
func BenchmarkHierRank(b *testing.B) {
	ctx := context.Background()
	s := Shape{QHeads: 4, KVHeads: 1, HeadDim: 128, PageSize: 16}
	const k = 128
	for _, tokens := range []int{64 << 10, 1 << 20} {
		pages := tokens / s.PageSize
		for _, kind := range []string{"random", "needles"} {
			rng := rand.New(rand.NewPCG(32, uint64(tokens)))
			l := Layer{Summary: benchSummaries(rng, s, pages, kind)}
			batch := Batch{Indptr: []int32{0, int32(pages)}, LastLen: []int32{int32(s.PageSize)}}
			for p := range pages {
				batch.Pages = append(batch.Pages, int32(p))
			}
			q := make([]float32, s.QHeads*s.HeadDim)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			var pl TopKPlan
			pl.Add(0, pages-1, 0, k, 0) // the tail page is forced
			out, outSc := make([]int32, k), make([]float32, k)
			c := NewCPU(CPUConfig{})
			b.Run(fmt.Sprintf("tokens=%d/%s/flat", tokens, kind), func(b *testing.B) {
				for b.Loop() {
					if err := c.Rank(ctx, s, l, &batch, q, GroupMax, &pl, out, outSc); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(1, "records/cand")
			})
			for _, g := range []int{4, 8, 16} {
				for _, after := range []float64{0.5, 0.1} {
					for _, memo := range []struct {
						name string
						max  int
					}{{"nomemo", -1}, {"memo", 0}} {
						// A tree of its own: no fallback memory from another run.
						tree, _ := NewBoxTree(g)
						if err := tree.Sync(s, l.Summary, batch.Pages, 0); err != nil {
							b.Fatal(err)
						}
						cfg := HierConfig{MinRatio: 4, FlatAfter: after, MaxSkip: memo.max}
						b.Run(fmt.Sprintf("tokens=%d/%s/hier-G%d-after%.1f-%s", tokens, kind, g, after, memo.name), func(b *testing.B) {
							var st HierStats
							rows := make([]HierStats, 1)
							for b.Loop() {
								if err := c.HierRank(ctx, cfg, s, l, &batch, []*BoxTree{tree}, q, GroupMax, &pl, out, outSc, rows); err != nil {
									b.Fatal(err)
								}
								st.Add(rows[0])
							}
							b.ReportMetric(float64(st.Records())/float64(st.Candidates), "records/cand")
							b.ReportMetric(float64(st.Skipped)/float64(st.Rows), "skipped/row")
						})
					}
				}
			}
			c.Close()
		}
	}
}
