package collective

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/plan"
)

// phaseCase is the shape of collective.DefaultBenchConfig for n ranks
// (rows rows of k candidates per rank, drawn from the rank's stripe of
// 8192 pages, normal scores, shuffled) and its budgets.
func phaseCase(n, rows, k int) ([][][]Candidate, []int) {
	rng := rand.New(rand.NewPCG(1, 7))
	local := make([][][]Candidate, n)
	for r := range n {
		var mine []int32
		for p := r; p < 8192; p += n {
			mine = append(mine, int32(p))
		}
		local[r] = make([][]Candidate, rows)
		for row := range rows {
			rng.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
			c := make([]Candidate, k)
			for i := range c {
				c[i] = Candidate{Score: float32(rng.NormFloat64()), Page: mine[i]}
			}
			local[r][row] = c
		}
	}
	budgets := make([]int, rows)
	for i := range budgets {
		budgets[i] = k
	}
	return local, budgets
}

// BenchmarkSelectPhases times the parts of one member's SelectExact
// without the exchange, at 8 and 128 rows (batch 1 and 16 of the
// default 8 KV heads) of k = 128: encode (validate, sort,
// write the frame; shuffled input, input already in Compare order, and
// input in page order as the CPU top-K returns it),
// parse (check and decode the peers' frames) and merge (every row's
// global top-k, pages ascending; merge-unordered: SelectExactUnordered's).
func BenchmarkSelectPhases(b *testing.B) {
	const k = 128
	for _, sz := range [][2]int{{2, 8}, {4, 8}, {2, 128}, {4, 128}} {
		n, rows := sz[0], sz[1]
		local, budgets := phaseCase(n, rows, k)
		peers := make([][]byte, n)
		for r := 1; r < n; r++ {
			p := NewGroup(NewInprocGroup(n)[r])
			if err := p.encodeSelect(local[r], budgets); err != nil {
				b.Fatal(err)
			}
			peers[r] = slices.Clone(p.buf)
		}
		g := NewGroup(NewInprocGroup(n)[0])
		b.Run(fmt.Sprintf("shards=%d/rows=%d/encode", n, rows), func(b *testing.B) {
			for b.Loop() {
				if err := g.encodeSelect(local[0], budgets); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("shards=%d/rows=%d/encode-sorted", n, rows), func(b *testing.B) {
			sorted := make([][]Candidate, rows)
			for row, c := range local[0] {
				sorted[row] = slices.SortedFunc(slices.Values(c), plan.Compare)
			}
			for b.Loop() {
				if err := g.encodeSelect(sorted, budgets); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("shards=%d/rows=%d/encode-pages", n, rows), func(b *testing.B) {
			byPage := make([][]Candidate, rows)
			for row, c := range local[0] {
				byPage[row] = slices.SortedFunc(slices.Values(c), func(x, y Candidate) int { return cmp.Compare(x.Page, y.Page) })
			}
			for b.Loop() {
				if err := g.encodeSelect(byPage, budgets); err != nil {
					b.Fatal(err)
				}
			}
		})
		if err := g.encodeSelect(local[0], budgets); err != nil {
			b.Fatal(err)
		}
		copy(g.recv[1:], peers[1:])
		b.Run(fmt.Sprintf("shards=%d/rows=%d/parse", n, rows), func(b *testing.B) {
			for b.Loop() {
				if err := g.parseSelect(rows, budgets); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, ordered := range []bool{true, false} {
			name := "merge"
			if !ordered {
				name = "merge-unordered"
			}
			b.Run(fmt.Sprintf("shards=%d/rows=%d/%s", n, rows, name), func(b *testing.B) {
				// The peers' keys, also when the parse case did not run
				// (-bench .../merge alone).
				if err := g.parseSelect(rows, budgets); err != nil {
					b.Fatal(err)
				}
				dst := make([][]int32, rows)
				for b.Loop() {
					for row := range rows {
						var err error
						if dst[row], err = g.selectRow(row, k, dst[row][:0], ordered); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}
