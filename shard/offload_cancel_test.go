package shard

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// lateCancel is a context whose Err is nil for the first n calls and
// Canceled afterwards: a deadline that fires after a recall's own check,
// while its copies are being issued.
type lateCancel struct {
	context.Context
	n int
}

func (c *lateCancel) Err() error {
	if c.n > 0 {
		c.n--
		return nil
	}
	return context.Canceled
}

// TestOffloadCancelledRecall: a recall or a step whose context ends at any
// point while pages are brought in either completes or fails cleanly:
// every page's K/V read back equal what was written, the residency
// checks out, and later steps stay bit-identical to the all-resident
// reference, on host pools and on the pretend device. (A device recall
// used to mark pages moved and then drop the copies.)
func TestOffloadCancelledRecall(t *testing.T) {
	for _, dev := range []bool{false, true} {
		for n := range 4 {
			name := map[bool]string{false: "host", true: "device"}[dev]
			t.Run(name, func(t *testing.T) {
				const layers, qh, kvh, d, s = 1, 2, 1, 4, 4
				pol := plan.DefaultPolicy()
				pol.BudgetTokens, pol.DenseLayers = 64*s, 0 // every page attended
				var tr = fakeDev
				if !dev {
					tr = nil
				}
				p := newOffPair(t, layers, qh, kvh, d, s, 64, 10, pol, pagestore.EvictLRU, tr, prefetchOpt{})
				rng := rand.New(rand.NewPCG(3, uint64(n)))
				a, b := p.create(), p.create()
				p.append(rng, a, 8*s)
				p.append(rng, b, 8*s) // b resident and dirty, most of a in the tier
				st := p.off.Store()
				read := func(id pagestore.SeqID) [][]float32 {
					table, err := st.AppendPageTable(nil, p.ids[id])
					if err != nil {
						t.Fatal(err)
					}
					var out [][]float32
					for _, pg := range table {
						k, v := make([]float32, kvh*s*d), make([]float32, kvh*s*d)
						if err := st.ReadKV(context.Background(), 0, pg, k, v); err != nil {
							t.Fatal(err)
						}
						out = append(out, append(k, v...))
					}
					return out
				}
				beforeA, beforeB := read(a), read(b)
				table, _ := st.AppendPageTable(nil, p.ids[a])
				err := st.Recall(&lateCancel{Context: context.Background(), n: n}, table[1:4])
				t.Logf("recall with the context ending after %d checks: %v", n, err)
				q := randVec(rng, qh*d, 2)
				var res StepResult
				err = p.off.Step(&lateCancel{Context: context.Background(), n: n}, 0, []SeqStep{{Seq: p.ids[a], Q: q}}, StepOptions{}, &res)
				t.Logf("step with the context ending after %d checks: %v", n, err)
				if err := st.CheckResidency(); err != nil {
					t.Fatal(err)
				}
				if !slices.EqualFunc(beforeA, read(a), slices.Equal) || !slices.EqualFunc(beforeB, read(b), slices.Equal) {
					t.Fatal("a cancelled recall changed some page's K/V")
				}
				for range 2 {
					for _, id := range []pagestore.SeqID{a, b} {
						want, got, one := p.step(rng, 0, []pagestore.SeqID{id}, []int{0}, StepOptions{}, false)
						if !one || !slices.Equal(want.O, got.O) || !slices.Equal(want.LSE, got.LSE) {
							t.Fatalf("sequence %d: outputs differ from the reference after a cancelled recall (one pass: %v)", id, one)
						}
					}
				}
			})
		}
	}
}
