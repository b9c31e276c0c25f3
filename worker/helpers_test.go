package worker

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// grid is a test coordinator over workers for one TP group (TP = 1): it
// talks to them through the Worker interface only, next to a single-shard
// reference fed the same data.
type grid struct {
	t       *testing.T
	cfg     Config
	workers []Worker
	host    []int // per CP rank: index of its worker
	trs     []collective.Transport
	ref     *shard.Shard
	refIDs  map[uint64]pagestore.SeqID
	layouts map[uint64]plan.Layout
	lens    map[uint64]int
	step    uint64
}

func testConfig(mode Mode) Config {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 4, 2, 16, 16
	cfg.CP, cfg.Capacity, cfg.Mode = 2, 64, mode
	cfg.Policy.DenseLayers, cfg.Policy.BudgetTokens = 1, 64
	cfg.MemoryLimit = -1
	return cfg
}

// newGrid hosts the CP ranks on one Local each (split) or all on one.
func newGrid(t *testing.T, cfg Config, split bool) *grid {
	t.Helper()
	return newGridWrapped(t, cfg, split, nil)
}

// newGridWrapped is newGrid with each rank's transport passed through
// wrap (nil: none) before its Local takes it.
func newGridWrapped(t *testing.T, cfg Config, split bool, wrap func(collective.Transport) collective.Transport) *grid {
	t.Helper()
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	t.Cleanup(func() { be.Close() })
	g := &grid{t: t, cfg: cfg, trs: collective.NewInprocGroup(cfg.CP), refIDs: map[uint64]pagestore.SeqID{},
		layouts: map[uint64]plan.Layout{}, lens: map[uint64]int{}}
	t.Cleanup(func() {
		for _, tr := range g.trs {
			tr.Close()
		}
	})
	var specs [][]RankSpec
	for cp := range cfg.CP {
		tr := g.trs[cp]
		if wrap != nil {
			tr = wrap(tr)
		}
		sp := RankSpec{Rank: Rank{CP: cp}, Backend: be, Transport: tr}
		if split || cp == 0 {
			specs = append(specs, []RankSpec{sp})
		} else {
			specs[0] = append(specs[0], sp)
		}
		g.host = append(g.host, len(specs)-1)
	}
	for _, sp := range specs {
		l, err := NewLocal(cfg, sp)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		g.workers = append(g.workers, l)
	}
	ref, err := shard.New(shard.Config{
		Store: pagestore.Config{
			Geometry: plan.Geometry{QHeads: cfg.QHeads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, PageSize: cfg.PageSize, DType: cfg.DType},
			Layers:   cfg.Layers,
			Capacity: cfg.Capacity * cfg.CP,
		},
		Policy: cfg.Policy,
	}, be)
	if err != nil {
		t.Fatal(err)
	}
	g.ref = ref
	return g
}

func (g *grid) must(err error) {
	g.t.Helper()
	if err != nil {
		g.t.Fatal(err)
	}
}

func (g *grid) worker(cp int) Worker { return g.workers[g.host[cp]] }

func (g *grid) create(id uint64, p plan.Placement) {
	g.t.Helper()
	lay := plan.Layout{CP: g.cfg.CP, TP: 1, Placement: p, BlockPages: 2}
	for _, w := range g.workers {
		g.must(w.Create(context.Background(), CreateRequest{Seq: id, Layout: lay}))
	}
	g.layouts[id] = lay
	g.refIDs[id] = g.ref.Store().Create()
}

// fork forks parent into child on every worker and in the reference.
func (g *grid) fork(parent, child uint64) {
	g.t.Helper()
	for _, w := range g.workers {
		g.must(w.Fork(context.Background(), ForkRequest{Parent: parent, Child: child}))
	}
	id, err := g.ref.Store().Fork(g.refIDs[parent])
	g.must(err)
	g.refIDs[child], g.layouts[child], g.lens[child] = id, g.layouts[parent], g.lens[parent]
}

// release frees a sequence on every worker and in the reference.
func (g *grid) release(id uint64) {
	g.t.Helper()
	for _, w := range g.workers {
		g.must(w.Release(context.Background(), ReleaseRequest{Seq: id}))
	}
	g.must(g.ref.Store().Release(g.refIDs[id]))
	delete(g.lens, id)
}

// appendAll appends n random tokens to every layer: checks first, then
// one message per page to its owner (and the keys to every mirror).
func (g *grid) appendAll(rng *rand.Rand, id uint64, n int) {
	g.t.Helper()
	c, ctx := g.cfg, context.Background()
	tok := c.KVHeads * c.HeadDim
	start := g.lens[id]
	lay := g.layouts[id]
	for layer := range c.Layers {
		k, v := randVec(rng, n*tok), randVec(rng, n*tok)
		for _, w := range g.workers {
			g.must(w.Check(ctx, CheckRequest{Seq: id, Layer: layer, Len: start, Append: n}))
		}
		for t0 := 0; t0 < n; {
			p := (start + t0) / c.PageSize
			t1 := min(n, (p+1)*c.PageSize-start)
			for cp := range c.CP {
				m := AppendRequest{Seq: id, Rank: Rank{CP: cp}, Layer: layer, Start: start + t0, Tokens: t1 - t0}
				if lay.Owner(p) == cp {
					m.K, m.V = k[t0*tok:t1*tok], v[t0*tok:t1*tok]
				} else if c.Mode != Replicated {
					continue
				}
				if c.Mode == Replicated {
					m.MirrorK = k[t0*tok : t1*tok]
				}
				g.must(g.worker(cp).Append(ctx, m))
			}
			t0 = t1
		}
		g.must(g.ref.Append(g.refIDs[id], layer, k, v))
	}
	g.lens[id] += n
}

// rollback drops n tokens: checks, then the owner of the cut page first
// (its summary records go to the other mirrors).
func (g *grid) rollback(id uint64, n int) {
	g.t.Helper()
	c, ctx := g.cfg, context.Background()
	l := g.lens[id]
	for _, w := range g.workers {
		g.must(w.Check(ctx, CheckRequest{Seq: id, Len: l, Drop: n}))
	}
	owner := 0
	if (l-n)%c.PageSize != 0 {
		owner = g.layouts[id].Owner((l - n) / c.PageSize)
	}
	rep, err := g.worker(owner).Rollback(ctx, RollbackRequest{Seq: id, Rank: Rank{CP: owner}, Len: l, Drop: n})
	g.must(err)
	for cp := range c.CP {
		if cp != owner {
			_, err := g.worker(cp).Rollback(ctx, RollbackRequest{Seq: id, Rank: Rank{CP: cp}, Len: l, Drop: n, Tail: rep.Tail})
			g.must(err)
		}
	}
	g.must(g.ref.Store().Rollback(g.refIDs[id], n))
	g.lens[id] -= n
}

// layerMsgs builds each worker's Layer request: every rank gets the whole
// q (TP = 1), the owner of each new token's page its k and v, every mirror
// its keys.
func (g *grid) layerMsgs(step uint64, layer int, seqs []StepSeq, q, k, v [][]float32) []LayerRequest {
	c := g.cfg
	msgs := make([]LayerRequest, len(g.workers))
	for w := range msgs {
		msgs[w] = LayerRequest{Step: step, Layer: layer}
	}
	for cp := range c.CP {
		in := RankInput{Rank: Rank{CP: cp}}
		for i, s := range seqs {
			in.Q = append(in.Q, q[i]...)
			if !s.New {
				continue
			}
			if g.layouts[s.Seq].Owner(s.Len/c.PageSize) == cp {
				in.K = append(in.K, k[i]...)
				in.V = append(in.V, v[i]...)
			}
			if c.Mode == Replicated {
				in.MirrorK = append(in.MirrorK, k[i]...)
			}
		}
		w := g.host[cp]
		msgs[w].Ranks = append(msgs[w].Ranks, in)
	}
	return msgs
}

// layer runs one Layer call on every worker at once and returns the
// errors and replies.
func (g *grid) layer(msgs []LayerRequest) ([]error, []LayerReply) {
	errs := make([]error, len(g.workers))
	reps := make([]LayerReply, len(g.workers))
	var wg sync.WaitGroup
	for w, wk := range g.workers {
		wg.Go(func() { errs[w] = wk.Layer(context.Background(), msgs[w], &reps[w]) })
	}
	wg.Wait()
	return errs, reps
}

// root returns CP rank 0's output.
func root(reps []LayerReply) *RankOutput {
	for w := range reps {
		for i := range reps[w].Ranks {
			if reps[w].Ranks[i].Rank == (Rank{}) {
				return &reps[w].Ranks[i]
			}
		}
	}
	return nil
}

// stepAndCompare runs one step over the given layers (one new token per
// layer per sequence when fresh) and compares each layer's output with
// the single shard's. It returns the merged outputs, each layer's O then
// LSE, one after the other.
func (g *grid) stepAndCompare(rng *rand.Rand, ids []uint64, budgets []int, first, layers int, fresh bool) []float32 {
	g.t.Helper()
	c, ctx := g.cfg, context.Background()
	g.step++
	var seqs []StepSeq
	for i, id := range ids {
		seqs = append(seqs, StepSeq{Seq: id, Len: g.lens[id], New: fresh, Budget: budgets[i]})
	}
	for _, w := range g.workers {
		g.must(w.BeginStep(ctx, BeginRequest{Step: g.step, Layer: first, Seqs: seqs}))
	}
	tok, qd := c.KVHeads*c.HeadDim, c.QHeads*c.HeadDim
	var out []float32
	for layer := first; layer < first+layers; layer++ {
		var q, k, v [][]float32
		var refReqs []shard.SeqStep
		for _, id := range ids {
			q = append(q, randVec(rng, qd))
			r := shard.SeqStep{Seq: g.refIDs[id], Q: q[len(q)-1], BudgetTokens: budgets[len(q)-1]}
			if fresh {
				k, v = append(k, randVec(rng, tok)), append(v, randVec(rng, tok))
				r.K, r.V = k[len(k)-1], v[len(v)-1]
			}
			refReqs = append(refReqs, r)
		}
		errs, reps := g.layer(g.layerMsgs(g.step, layer, seqs, q, k, v))
		for w, err := range errs {
			if err != nil {
				g.t.Fatalf("layer %d worker %d: %v", layer, w, err)
			}
		}
		var want shard.StepResult
		g.must(g.ref.Step(ctx, layer, refReqs, shard.StepOptions{}, &want))
		got := root(reps)
		compareStates(g.t, layer, got.O, want.O, got.LSE, want.LSE)
		out = append(append(out, got.O...), got.LSE...)
		// Each new token is stored once; under replicated selection
		// every rank's mirror takes it too.
		took := 0
		for w := range reps {
			for _, out := range reps[w].Ranks {
				took += out.Appended
				if fresh && c.Mode == Replicated && out.Appended != len(ids) {
					g.t.Fatalf("layer %d rank %v took %d new tokens, want %d", layer, out.Rank, out.Appended, len(ids))
				}
			}
		}
		if fresh && c.Mode != Replicated && took != len(ids) {
			g.t.Fatalf("layer %d: the ranks took %d new tokens, want %d", layer, took, len(ids))
		}
	}
	for _, w := range g.workers {
		g.must(w.EndStep(ctx, EndRequest{Step: g.step}))
	}
	if fresh {
		for _, id := range ids {
			g.lens[id]++
		}
	}
	return out
}

func compareStates(t *testing.T, layer int, o, wantO, lse, wantLSE []float32) {
	t.Helper()
	if len(o) != len(wantO) || len(lse) != len(wantLSE) {
		t.Fatalf("layer %d: %d outputs and %d lse, single shard %d and %d", layer, len(o), len(lse), len(wantO), len(wantLSE))
	}
	near := func(a, b float32) bool {
		d := float64(a - b)
		return d*d <= 4e-10*max(1, float64(b)*float64(b))
	}
	for j := range wantO {
		if !near(o[j], wantO[j]) {
			t.Fatalf("layer %d: output %d is %v, single shard %v", layer, j, o[j], wantO[j])
		}
	}
	for j := range wantLSE {
		if !near(lse[j], wantLSE[j]) {
			t.Fatalf("layer %d: lse %d is %v, single shard %v", layer, j, lse[j], wantLSE[j])
		}
	}
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}
