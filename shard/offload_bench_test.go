package shard

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// BenchmarkOffloadStep measures a one-layer decode step (batch 1, 16K
// tokens = 1024 pages, 8 query heads, 2 KV heads, D = 64, S = 16, budget
// 512 tokens: K = 32 pages per KV head, group_max) with the device pool
// holding all pages without offload ("resident") and with offload on at a
// device budget of 100, 50, 20 and 10% of the pages, over the host memory
// tier; the same data and queries in every case. Selection changes
// slowly (each query a small rotation of the previous one) or completely
// (independent queries). It reports the hit rate of the step recalls and
// the payload bytes moved per step each way; "prefetch=16" runs prefetch
// 16 pages per row below the selection (see Config.PrefetchPages).
func BenchmarkOffloadStep(b *testing.B) {
	for _, drift := range []string{"slow", "random"} {
		for _, pct := range []int{0, 100, 50, 20, 10} {
			for _, pf := range []int{0, 16} {
				if pct == 0 && pf > 0 {
					continue
				}
				name := fmt.Sprintf("%s/budget=%d%%/prefetch=%d", drift, pct, pf)
				if pct == 0 {
					name = drift + "/resident"
				}
				benchOffloadStep(b, name, drift, pct, pf)
			}
		}
	}
}

func benchOffloadStep(b *testing.B, name, drift string, pct, pf int) {
	const qh, kvh, d, s, tokens, budgetTok = 8, 2, 64, 16, 16384, 512
	pages := tokens / s
	b.Run(name, func(b *testing.B) {
		be := kernels.NewCPU(kernels.CPUConfig{})
		defer be.Close()
		pol := plan.DefaultPolicy()
		pol.PageSize, pol.BudgetTokens, pol.DenseLayers = s, budgetTok, 0
		st := pagestore.Config{Layers: 1, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: pages + 8,
			DeviceBudget: pct * pages / 100}
		cfg := Config{Store: st, Policy: pol}
		if pct > 0 {
			cfg.PrefetchPages = pf
		}
		sh, err := New(cfg, be)
		if err != nil {
			b.Fatal(err)
		}
		defer sh.Close()
		rng := rand.New(rand.NewPCG(1, 2))
		id := sh.Store().Create()
		for range tokens / 1024 {
			if err := sh.Append(id, 0, randVec(rng, 1024*kvh*d, 1), randVec(rng, 1024*kvh*d, 1)); err != nil {
				b.Fatal(err)
			}
		}
		qs := benchQueries(rng, drift, 256, qh*d)
		var res StepResult
		reqs := []SeqStep{{Seq: id}}
		step := func(i int) {
			reqs[0].Q = qs[i%len(qs)]
			if err := sh.Step(context.Background(), 0, reqs, StepOptions{}, &res); err != nil {
				b.Fatal(err)
			}
		}
		for i := range 64 { // warm the device pool
			step(i)
		}
		before := sh.OffloadStats()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			step(64 + i)
		}
		b.StopTimer()
		after := sh.OffloadStats()
		if pct == 0 {
			return
		}
		n := float64(b.N)
		hits, misses := after.Hits-before.Hits, after.Misses-before.Misses
		b.ReportMetric(float64(hits)/float64(max(hits+misses, 1)), "hit-rate")
		b.ReportMetric(float64(after.BytesIn-before.BytesIn)/n, "B-in/step")
		b.ReportMetric(float64(after.BytesOut-before.BytesOut)/n, "B-out/step")
		b.ReportMetric(float64(misses)/n, "misses/step")
		b.ReportMetric(float64(after.Passes-before.Passes)/n, "passes/step")
		b.ReportMetric(float64((after.Stall-before.Stall).Nanoseconds())/n, "recall-ns/step")
		b.ReportMetric(float64(after.PrefetchHits-before.PrefetchHits)/n, "prefetch-hits/step")
	})
}

// benchQueries returns n queries of dim floats: independent ("random"),
// or a slow random walk, each a rotation by about 0.1 rad of the previous
// one towards a fresh random direction ("slow").
func benchQueries(rng *rand.Rand, drift string, n, dim int) [][]float32 {
	qs := make([][]float32, n)
	q := randVec(rng, dim, 2)
	for i := range qs {
		if drift == "random" {
			qs[i] = randVec(rng, dim, 2)
			continue
		}
		step := randVec(rng, dim, 2)
		c, sn := float32(math.Cos(0.1)), float32(math.Sin(0.1))
		next := make([]float32, dim)
		for j := range next {
			next[j] = c*q[j] + sn*step[j]
		}
		q, qs[i] = next, next
	}
	return qs
}
