package collective_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/collective"
)

// BenchmarkSelectExactShape runs SelectExact at the shape of
// collective.DefaultBenchConfig (8 rows per sequence, k = 128) on an
// in-process group of 2 and 4 ranks at batch 1 and 16. Each rank proposes
// k candidates per row from its stripe of 8192 pages, in random order
// (not sorted), with normally distributed scores, like questctl bench
// collective.
func BenchmarkSelectExactShape(b *testing.B) {
	const heads, k, pages = 8, 128, 8192
	for _, n := range []int{2, 4} {
		for _, batch := range []int{1, 16} {
			rows := heads * batch
			b.Run(fmt.Sprintf("shards=%d/batch=%d", n, batch), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, uint64(n)<<32|uint64(batch)))
				local := make([][][]collective.Candidate, n)
				budgets := make([]int, rows)
				for row := range budgets {
					budgets[row] = k
				}
				for r := range n {
					var mine []int32
					for p := r; p < pages; p += n {
						mine = append(mine, int32(p))
					}
					local[r] = make([][]collective.Candidate, rows)
					for row := range rows {
						rng.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
						c := make([]collective.Candidate, k)
						for i := range c {
							c[i] = collective.Candidate{Score: float32(rng.NormFloat64()), Page: mine[i]}
						}
						local[r][row] = c
					}
				}
				dst := make([][][]int32, n)
				b.SetBytes(int64(n * rows * k * 8))
				benchOp(b, n, func(g *collective.Group, tag uint64, r int) error {
					var err error
					dst[r], err = g.SelectExact(bg(), tag, local[r], budgets, dst[r])
					return err
				})
			})
		}
	}
}
