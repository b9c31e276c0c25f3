package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/plan"
)

// opCounter is a collective.Transport that counts the messages its
// member sends, by the (layer, op) of their tags.
type opCounter struct {
	collective.Transport
	mu   *sync.Mutex
	sent map[[2]int]int
}

func (c opCounter) Send(ctx context.Context, to int, tag uint64, msg []byte) error {
	c.mu.Lock()
	c.sent[[2]int{int(uint16(tag >> 8)), int(collective.Op(tag))}]++
	c.mu.Unlock()
	return c.Transport.Send(ctx, to, tag, msg)
}

// TestDenseLayerExchangesNoCandidates: a layer whose plans are all
// dense (a dense layer, or budgets that cover every sequence) sends no
// selection candidates between the CP ranks, only the merge of the
// partial states, and still equals the single shard; a layer with one
// sparse plan exchanges candidates as before.
func TestDenseLayerExchangesNoCandidates(t *testing.T) {
	// Exact only: union selection is an approximation that the single
	// shard does not reproduce on sparse layers.
	for _, mode := range []Mode{Exact} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			var mu sync.Mutex
			sent := map[[2]int]int{}
			wrap := func(tr collective.Transport) collective.Transport {
				return opCounter{Transport: tr, mu: &mu, sent: sent}
			}
			rng := rand.New(rand.NewPCG(7, uint64(mode)))
			// Layer 0 is dense (DenseLayers 1); budget 64 tokens = 4 pages.
			g := newGridWrapped(t, testConfig(mode), true, wrap)
			g.create(1, plan.Striped)
			g.create(2, plan.Contiguous)
			g.appendAll(rng, 1, 200) // 13 pages
			g.appendAll(rng, 2, 40)  // 3 pages
			take := func() map[[2]int]int {
				mu.Lock()
				defer mu.Unlock()
				m := map[[2]int]int{}
				for k, v := range sent {
					m[k] = v
					delete(sent, k)
				}
				return m
			}
			sel, red := int(collective.OpSelect), int(collective.OpReduce)
			for _, tc := range []struct {
				name    string
				ids     []uint64
				budgets []int
				sparse1 bool // layer 1 has a sparse plan
			}{
				{"one sparse sequence", []uint64{1, 2}, []int{64, 64}, true},
				{"budgets cover both", []uint64{1, 2}, []int{256, 64}, false},
				{"short sequence alone", []uint64{2}, []int{64}, false},
			} {
				take()
				g.stepAndCompare(rng, tc.ids, tc.budgets, 0, 2, true)
				got := take()
				if n := got[[2]int{0, sel}]; n != 0 {
					t.Errorf("%s: dense layer 0 sent %d selection messages, want 0", tc.name, n)
				}
				if n := got[[2]int{0, red}] + got[[2]int{1, red}]; n != 2 {
					t.Errorf("%s: %d merge messages over two layers, want 2 (rank 1 to rank 0 per layer)", tc.name, n)
				}
				n1 := got[[2]int{1, sel}]
				if tc.sparse1 && n1 != 2 {
					t.Errorf("%s: sparse layer 1 sent %d selection messages, want 2 (one per rank)", tc.name, n1)
				}
				if !tc.sparse1 && n1 != 0 {
					t.Errorf("%s: layer 1 sent %d selection messages, want 0", tc.name, n1)
				}
			}
		})
	}
}
