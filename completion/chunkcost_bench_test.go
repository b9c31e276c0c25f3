package completion

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/questrt/questrt/model"
)

// BenchmarkPrefillChunkCost times one dense prefill chunk of n prompt
// tokens of the passkey model after c tokens of context, the
// measurements behind the ITL budget's per-chunk fixed cost (itlBudget):
// ms/chunk and ms/token for each n, so that a chunk's time fitted as
// F + n*p shows its fixed part F. Every chunk runs on a fresh cache that
// starts with the same c tokens (model.NewDenseFrom; its first append
// copies them, about 0.8 MB of keys and values per 1,024 tokens, inside
// the timed chunk).
func BenchmarkPrefillChunkCost(b *testing.B) {
	m, _, _ := passkeyModel(b)
	ids := make([]int, 2048+512)
	for i := range ids {
		ids[i] = 'a' + i%26
	}
	ctx := context.Background()
	for _, c := range []int{0, 2048} {
		base := model.NewDense(m.Geometry(), 0)
		for i := 0; i < c; i += 512 {
			if _, err := m.Forward(ctx, base, ids[i:min(c, i+512)], model.ForwardOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		for _, n := range []int{1, 2, 4, 8, 16, 32, 64, 128, 512} {
			b.Run(fmt.Sprintf("context=%d/tokens=%d", c, n), func(b *testing.B) {
				var total time.Duration
				for b.Loop() {
					d := model.NewDenseFrom(m.Geometry(), 0, base, c)
					t0 := time.Now()
					if _, err := m.Forward(ctx, d, ids[c:c+n], model.ForwardOptions{}); err != nil {
						b.Fatal(err)
					}
					total += time.Since(t0)
				}
				b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "ms/chunk")
				b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N*n), "ms/token")
			})
		}
	}
}
