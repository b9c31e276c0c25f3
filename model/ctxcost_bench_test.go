package model

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkChunkAtContext times one dense prefill chunk of n tokens of
// the passkey model after c tokens of context (random keys and values),
// the context held beforehand (no copy inside the timing).
func BenchmarkChunkAtContext(b *testing.B) {
	m, err := Load(filepath.Join(modelsDir(b), "passkey-llama-v1"), LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	g := m.Geometry()
	kvd := g.KVHeads * g.HeadDim
	r := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	for _, c := range []int{1024, 8192, 24576} {
		d := NewDense(g, 0)
		for l := range g.Layers {
			k, v := make([]float32, c*kvd, (c+4096)*kvd), make([]float32, c*kvd, (c+4096)*kvd)
			for i := range k {
				k[i], v[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
			}
			d.k[l], d.v[l] = k, v
		}
		for _, n := range []int{1, 2, 4, 8, 16} {
			ids := make([]int, n)
			for i := range ids {
				ids[i] = 'a' + i
			}
			b.Run(fmt.Sprintf("context=%d/tokens=%d", c, n), func(b *testing.B) {
				var total time.Duration
				var all []float64
				for b.Loop() {
					t0 := time.Now()
					if _, err := m.Forward(ctx, d, ids, ForwardOptions{}); err != nil {
						b.Fatal(err)
					}
					total += time.Since(t0)
					all = append(all, float64(time.Since(t0).Microseconds())/1e3)
					for l := range g.Layers {
						d.k[l], d.v[l] = d.k[l][:c*kvd], d.v[l][:c*kvd]
					}
				}
				b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "ms/chunk")
				slices.Sort(all)
				b.ReportMetric(all[0], "min-ms")
				b.ReportMetric(all[len(all)/2], "p50-ms")
			})
		}
	}
}
