package serve

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/questrt/questrt/model"
)

// BenchmarkPrefillChunkCost times one dense prefill chunk of n prompt
// tokens of the passkey model at context c (the tokens before it), the
// measurements behind the per-chunk cost of the ITL budget (itlBudget's
// fixed cost): ms/chunk and ms/token for each n, so that a chunk's time
// fitted as F + n*p shows its fixed part F.
func BenchmarkPrefillChunkCost(b *testing.B) {
	m, _, _ := passkeyModel(b)
	ids := make([]int, 8192+512)
	for i := range ids {
		ids[i] = 'a' + i%26
	}
	for _, c := range []int{0, 4096} {
		for _, n := range []int{1, 2, 4, 8, 16, 32, 64, 128, 512} {
			b.Run(fmt.Sprintf("context=%d/tokens=%d", c, n), func(b *testing.B) {
				ctx := context.Background()
				d := model.NewDense(m.Geometry(), 0)
				if c > 0 {
					for i := 0; i < c; i += 512 {
						if _, err := m.Forward(ctx, d, ids[i:min(c, i+512)], model.ForwardOptions{}); err != nil {
							b.Fatal(err)
						}
					}
				}
				var total time.Duration
				for b.Loop() {
					// The same chunk again at the same context: a fork
					// would copy the context; truncating is not offered,
					// so a fresh sequence every 8 chunks keeps c close.
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
