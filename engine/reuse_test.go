package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// reuseSeq is a test sequence with every token's keys and values of
// layer 0 kept on the host, [token][KVHeads*HeadDim].
type reuseSeq struct {
	id   SeqID
	k, v [][]float32
}

// reuseCfg is a one-layer engine whose layer 0 is sparse: pages of 4
// tokens, budget 16 tokens (4 pages), the tail page forced.
func reuseCfg(cp, tp, steps int) Config {
	cfg := DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 1, 8, 4, 16, 4
	cfg.CP, cfg.TP, cfg.CapacityPages = cp, tp, 256
	cfg.Policy.PageSize, cfg.Policy.BudgetTokens, cfg.Policy.DenseLayers = 4, 16, 0
	cfg.Policy.ReuseSteps = steps
	return cfg
}

func newReuseSeq(t *testing.T, e *Engine, rng *rand.Rand, n int) *reuseSeq {
	t.Helper()
	c := e.Config()
	id, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	s := &reuseSeq{id: id}
	kv := c.KVHeads * c.HeadDim
	k, v := randVec(rng, n*kv), randVec(rng, n*kv)
	if err := e.Append(id, 0, k, v); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		s.k = append(s.k, k[i*kv:(i+1)*kv])
		s.v = append(s.v, v[i*kv:(i+1)*kv])
	}
	return s
}

// step runs one decode step of layer 0 with a new token for every
// sequence and diagnostics, keeping the tokens in the sequences.
func reuseStep(t *testing.T, e *Engine, rng *rand.Rand, seqs []*reuseSeq, budgets []int, res *Result) [][]float32 {
	return reuseStepDiag(t, e, rng, seqs, budgets, true, res)
}

func reuseStepDiag(t *testing.T, e *Engine, rng *rand.Rand, seqs []*reuseSeq, budgets []int, diag bool, res *Result) [][]float32 {
	t.Helper()
	c := e.Config()
	kv := c.KVHeads * c.HeadDim
	var reqs []Request
	var qs [][]float32
	for i, s := range seqs {
		q, k, v := randVec(rng, c.QHeads*c.HeadDim), randVec(rng, kv), randVec(rng, kv)
		for j := range q {
			q[j] *= 2
		}
		qs = append(qs, q)
		s.k, s.v = append(s.k, k), append(s.v, v)
		b := 0
		if budgets != nil {
			b = budgets[i]
		}
		reqs = append(reqs, Request{Seq: s.id, Q: q, K: k, V: v, BudgetTokens: b})
	}
	if err := e.Step(context.Background(), 0, reqs, StepOptions{Diagnostics: diag}, res); err != nil {
		t.Fatal(err)
	}
	return qs
}

// refAttend is float64 attention of query head h of q over the tokens
// of the given pages of s (page size ps, scale 1/sqrt(D)).
func refAttend(s *reuseSeq, q []float32, h, group, d, ps int, pages []int32) []float64 {
	kvh := h / group
	qh := q[h*d : (h+1)*d]
	var logits []float64
	var toks []int
	for _, p := range pages {
		for tk := int(p) * ps; tk < min(int(p+1)*ps, len(s.k)); tk++ {
			var dot float64
			for j := range d {
				dot += float64(qh[j]) * float64(s.k[tk][kvh*d+j])
			}
			logits = append(logits, dot/math.Sqrt(float64(d)))
			toks = append(toks, tk)
		}
	}
	m := slices.Max(logits)
	var sum float64
	o := make([]float64, d)
	for i, x := range logits {
		w := math.Exp(x - m)
		sum += w
		for j := range d {
			o[j] += w * float64(s.v[toks[i]][kvh*d+j])
		}
	}
	for j := range o {
		o[j] /= sum
	}
	return o
}

// TestReuseOneIsBitIdentical: ReuseSteps 1 (and 0) rank at every step:
// the same pages and bit-identical outputs as a policy without reuse,
// over CP x TP layouts and the three selection modes, and no step
// reports a reuse.
func TestReuseOneIsBitIdentical(t *testing.T) {
	for _, lay := range [][2]int{{1, 1}, {3, 2}} {
		for _, mode := range []Selection{Exact, Union, Replicated} {
			t.Run(fmt.Sprintf("cp%d_tp%d_%v", lay[0], lay[1], mode), func(t *testing.T) {
				var outs [2][][]float32
				var sels [2][][][]int32
				for run, r := range []int{0, 1} {
					cfg := reuseCfg(lay[0], lay[1], r)
					cfg.Selection = mode
					e := newPair(t, cfg).e
					rng := rand.New(rand.NewPCG(5, 1))
					seqs := []*reuseSeq{newReuseSeq(t, e, rng, 61), newReuseSeq(t, e, rng, 90)}
					var res Result
					for range 9 {
						reuseStep(t, e, rng, seqs, nil, &res)
						if res.Time.Reused != 0 || res.Time.RankSkipped {
							t.Fatalf("reuse steps %d: a step reused (%d, skipped %v)", r, res.Time.Reused, res.Time.RankSkipped)
						}
						outs[run] = append(outs[run], slices.Clone(res.O))
						var sel [][]int32
						for _, dg := range res.Diag {
							sel = append(sel, dg.Selected...)
						}
						sels[run] = append(sels[run], sel)
					}
				}
				for st := range outs[0] {
					for j := range outs[0][st] {
						if math.Float32bits(outs[0][st][j]) != math.Float32bits(outs[1][st][j]) {
							t.Fatalf("step %d output %d: %v without reuse, %v with reuse steps 1", st, j, outs[0][st][j], outs[1][st][j])
						}
					}
					for h := range sels[0][st] {
						if !slices.Equal(sels[0][st][h], sels[1][st][h]) {
							t.Fatalf("step %d row %d: pages %v vs %v", st, h, sels[0][st][h], sels[1][st][h])
						}
					}
				}
			})
		}
	}
}

// TestReuseAttendsKeptPlusNewer: with ReuseSteps r, a layer ranks at
// steps 0, r, 2r, ... of a sequence; at the steps between it attends
// exactly the pages it ranked last plus every page that became a
// candidate since, and the forced pages (a hand-built set), and its
// output equals float64 attention over exactly those pages. Pages grow
// during the reuse windows (4-token pages, a token per step).
func TestReuseAttendsKeptPlusNewer(t *testing.T) {
	for _, tc := range []struct {
		cp, tp, r, sink int
		gqa             kernels.GQAMode
	}{{1, 1, 4, 0, kernels.GroupMax}, {1, 1, 3, 1, kernels.PerHead}, {3, 2, 4, 1, kernels.GroupMax}, {2, 4, 5, 0, kernels.PerHead}} {
		t.Run(fmt.Sprintf("cp%d_tp%d_r%d_sink%d_%v", tc.cp, tc.tp, tc.r, tc.sink, tc.gqa), func(t *testing.T) {
			cfg := reuseCfg(tc.cp, tc.tp, tc.r)
			cfg.Policy.SinkPages, cfg.Policy.GQA = tc.sink, tc.gqa
			e := newPair(t, cfg).e
			c := e.Config()
			g, d, ps := c.QHeads/c.KVHeads, c.HeadDim, c.PageSize
			rng := rand.New(rand.NewPCG(7, uint64(tc.r)))
			s := newReuseSeq(t, e, rng, 57)
			var res Result
			var kept [][]int32 // per query head, the ranked pages of the last ranking step
			var hi0 int
			for step := range 3*tc.r + 2 {
				qs := reuseStep(t, e, rng, []*reuseSeq{s}, nil, &res)
				pl := res.Plans[0]
				if pl.Dense || pl.Rank == 0 {
					t.Fatalf("step %d: plan %+v is not sparse", step, pl)
				}
				ranking := step%tc.r == 0
				if ranking == (res.Time.Reused == 1) || ranking == res.Time.RankSkipped {
					t.Fatalf("step %d: ranking %v, but reused %d, rank skipped %v", step, ranking, res.Time.Reused, res.Time.RankSkipped)
				}
				got := res.Diag[0].Selected
				forced := func(p int32) bool { return int(p) < pl.Lo() || int(p) >= pl.Hi() }
				if ranking {
					kept, hi0 = nil, pl.Hi()
					for _, sel := range got {
						var k []int32
						for _, p := range sel {
							if !forced(p) {
								k = append(k, p)
							}
						}
						if len(k) != pl.Rank {
							t.Fatalf("step %d: ranked %d pages %v, plan ranks %d", step, len(k), sel, pl.Rank)
						}
						kept = append(kept, k)
					}
				}
				for h := range c.QHeads {
					want := slices.Clone(kept[h])
					for p := range pl.Pages {
						if p < pl.Lo() || p >= pl.Hi() || (p >= hi0 && !ranking) {
							want = append(want, int32(p))
						}
					}
					slices.Sort(want)
					if !slices.Equal(got[h], want) {
						t.Fatalf("step %d head %d (pages %d, ranked at hi %d): attended %v, want %v", step, h, pl.Pages, hi0, got[h], want)
					}
					ref := refAttend(s, qs[0], h, g, d, ps, want)
					for j, x := range ref {
						if y := float64(res.O[h*d+j]); math.Abs(y-x) > 2e-5*max(1, math.Abs(x)) {
							t.Fatalf("step %d head %d: output %d %v, float64 over the pages %v", step, h, j, y, x)
						}
					}
				}
				if !ranking && pl.Pages > hi0+pl.Local && step%tc.r == tc.r-1 {
					t.Logf("step %d reads %d ranked pages (rank %d)", step, len(got[0])-pl.Sink-pl.Local, pl.Rank)
				}
			}
			if hi0 == 0 {
				t.Fatal("no ranking step")
			}
		})
	}
}

// TestReuseForkRollback: a fork's child ranks at its first step while the
// parent keeps reusing; a rollback of the parent makes its next step
// rank afresh, and the count starts again from there.
func TestReuseForkRollback(t *testing.T) {
	e := newPair(t, reuseCfg(2, 2, 4)).e
	rng := rand.New(rand.NewPCG(11, 3))
	parent := newReuseSeq(t, e, rng, 70)
	var res Result
	expect := func(what string, s *reuseSeq, reused int) {
		t.Helper()
		reuseStep(t, e, rng, []*reuseSeq{s}, nil, &res)
		if res.Time.Reused != reused || res.Time.RankSkipped != (reused == 1) {
			t.Fatalf("%s: reused %d (rank skipped %v), want %d", what, res.Time.Reused, res.Time.RankSkipped, reused)
		}
	}
	expect("parent step 0", parent, 0)
	expect("parent step 1", parent, 1)
	cid, err := e.Fork(parent.id)
	if err != nil {
		t.Fatal(err)
	}
	child := &reuseSeq{id: cid, k: slices.Clone(parent.k), v: slices.Clone(parent.v)}
	expect("child's first step", child, 0)
	expect("child step 1", child, 1)
	expect("parent step 2 after the fork", parent, 1)
	expect("parent step 3", parent, 1)
	expect("parent step 4 (the 4th after ranking)", parent, 0)
	expect("parent step 5", parent, 1)
	if err := e.Rollback(parent.id, 1); err != nil {
		t.Fatal(err)
	}
	parent.k, parent.v = parent.k[:len(parent.k)-1], parent.v[:len(parent.v)-1]
	expect("parent after rollback", parent, 0)
	for i := range 3 {
		expect(fmt.Sprintf("parent step %d after rollback", i+1), parent, 1)
	}
	expect("parent step 4 after rollback", parent, 0)
	expect("child step 2", child, 1)
}

// TestDistributedEqualsSingleShardReuse is invariant 8 with selection
// reuse: over CP x TP layouts, GQA modes, exact and replicated
// selection, batches whose sequences rank at different steps (one joins
// late, one's budget makes it dense), the engine attends the same pages
// as the single-shard engine with the same policy, its outputs agree
// within fp32 tolerance and it reports the same reuse counts.
func TestDistributedEqualsSingleShardReuse(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 5))
	trials := 10
	if testing.Short() {
		trials = 4
	}
	for trial := range trials {
		cp, tp := 1+rng.IntN(5), []int{1, 2, 4}[rng.IntN(3)]
		r := 2 + rng.IntN(4)
		mode := []Selection{Exact, Replicated}[rng.IntN(2)]
		gqa := []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[rng.IntN(2)]
		sink := rng.IntN(2)
		t.Run(fmt.Sprintf("trial%d_cp%d_tp%d_r%d_%v_%v", trial, cp, tp, r, mode, gqa), func(t *testing.T) {
			mk := func(cp, tp int) *Engine {
				cfg := reuseCfg(cp, tp, r)
				cfg.Selection, cfg.Policy.GQA, cfg.Policy.SinkPages = mode, gqa, sink
				return newPair(t, cfg).e
			}
			a, b := mk(cp, tp), mk(1, 1)
			seed := rng.Uint64()
			ra, rb := rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(seed, 1))
			lens := []int{40 + rng.IntN(60), 100 + rng.IntN(100), 30 + rng.IntN(50)}
			var sa, sb []*reuseSeq
			for _, n := range lens {
				sa, sb = append(sa, newReuseSeq(t, a, ra, n)), append(sb, newReuseSeq(t, b, rb, n))
			}
			budgets := []int{16, 24, 16}
			var resA, resB Result
			for step := range 12 {
				n := 2
				if step >= 3 {
					n = 3 // the third sequence joins late: its ranking steps differ
				}
				bud := slices.Clone(budgets[:n])
				if step == 7 {
					bud[0] = 4096 // dense at this step: its next sparse step ranks
				}
				reuseStep(t, a, ra, sa[:n], bud, &resA)
				reuseStep(t, b, rb, sb[:n], bud, &resB)
				if resA.Time.Reused != resB.Time.Reused || resA.Time.RankSkipped != resB.Time.RankSkipped {
					t.Fatalf("step %d: reused %d (skipped %v), single shard %d (%v)", step, resA.Time.Reused, resA.Time.RankSkipped, resB.Time.Reused, resB.Time.RankSkipped)
				}
				for i := range n {
					if resA.Plans[i] != resB.Plans[i] {
						t.Fatalf("step %d seq %d: plan %+v, single shard %+v", step, i, resA.Plans[i], resB.Plans[i])
					}
					for h, sel := range resA.Diag[i].Selected {
						if !slices.Equal(sel, resB.Diag[i].Selected[h]) {
							t.Fatalf("step %d seq %d head %d: pages %v, single shard %v", step, i, h, sel, resB.Diag[i].Selected[h])
						}
					}
				}
				for j := range resB.O {
					if math.Abs(float64(resA.O[j]-resB.O[j])) > 2e-5*max(1, math.Abs(float64(resB.O[j]))) {
						t.Fatalf("step %d output %d: %v, single shard %v", step, j, resA.O[j], resB.O[j])
					}
				}
				if step == 5 && resB.Time.Reused == 0 {
					t.Fatalf("step 5: no sequence reused")
				}
			}
		})
	}
}

// TestReuseAfterFailedStep: a step that fails in attention (every rank)
// leaves the grid deciding alike: the next step ranks afresh on every
// rank (no hang on the selection exchange) and reuse resumes after it.
func TestReuseAfterFailedStep(t *testing.T) {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer cpu.Close()
	fb := &faultyBackend{Backend: cpu}
	cfg := reuseCfg(2, 2, 3)
	cfg.Backend, cfg.StepTimeout = fb, failStepTimeout
	e := newPair(t, cfg).e
	rng := rand.New(rand.NewPCG(13, 1))
	s := newReuseSeq(t, e, rng, 50)
	var res Result
	reuseStep(t, e, rng, []*reuseSeq{s}, nil, &res)
	reuseStep(t, e, rng, []*reuseSeq{s}, nil, &res)
	if res.Time.Reused != 1 {
		t.Fatalf("step 1 reused %d, want 1", res.Time.Reused)
	}
	fb.mode.Store(1)
	c := e.Config()
	kv := c.KVHeads * c.HeadDim
	req := []Request{{Seq: s.id, Q: randVec(rng, c.QHeads*c.HeadDim), K: randVec(rng, kv), V: randVec(rng, kv)}}
	if err := e.Step(context.Background(), 0, req, StepOptions{}, &res); err == nil {
		t.Fatal("the injected failure did not fail the step")
	}
	fb.mode.Store(0)
	n, err := e.Len(s.id)
	if err != nil {
		t.Fatal(err)
	}
	if n > len(s.k) {
		s.k, s.v = append(s.k, req[0].K), append(s.v, req[0].V)
	}
	for i, want := range []int{0, 1, 1, 0} {
		reuseStep(t, e, rng, []*reuseSeq{s}, nil, &res)
		if res.Time.Reused != want {
			t.Fatalf("step %d after the failure reused %d, want %d", i, res.Time.Reused, want)
		}
	}
}

// TestReuseWithoutDiagnostics: the plain decode path (no diagnostics;
// on one shard the path a fusing backend would take) keeps and reuses
// selections alike: the same ranking steps, and outputs equal to those
// of the diagnosed run, whose attended pages the tests above check.
func TestReuseWithoutDiagnostics(t *testing.T) {
	for _, lay := range [][2]int{{1, 1}, {2, 2}} {
		t.Run(fmt.Sprintf("cp%d_tp%d", lay[0], lay[1]), func(t *testing.T) {
			var outs [2][][]float32
			var reused [2][]int
			for run, diag := range []bool{true, false} {
				e := newPair(t, reuseCfg(lay[0], lay[1], 3)).e
				rng := rand.New(rand.NewPCG(17, 2))
				s := newReuseSeq(t, e, rng, 66)
				var res Result
				for range 8 {
					reuseStepDiag(t, e, rng, []*reuseSeq{s}, nil, diag, &res)
					outs[run] = append(outs[run], slices.Clone(res.O))
					reused[run] = append(reused[run], res.Time.Reused)
				}
			}
			if want := []int{0, 1, 1, 0, 1, 1, 0, 1}; !slices.Equal(reused[1], want) || !slices.Equal(reused[0], want) {
				t.Fatalf("reused per step %v without diagnostics, %v with, want %v", reused[1], reused[0], want)
			}
			for st := range outs[0] {
				for j, x := range outs[0][st] {
					if y := outs[1][st][j]; math.Abs(float64(x-y)) > 2e-5*max(1, math.Abs(float64(x))) {
						t.Fatalf("step %d output %d: %v without diagnostics, %v with", st, j, y, x)
					}
				}
			}
		})
	}
}
