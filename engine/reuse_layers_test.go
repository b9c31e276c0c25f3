package engine

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Selection reuse across adjacent layers (plan.Policy.ReuseLayers).

// layerSeq is a test sequence with every layer's keys and values kept on
// the host, [layer][token][KVHeads*HeadDim].
type layerSeq struct {
	id   SeqID
	k, v [][][]float32
}

// layersCfg is an engine of layers sparse layers (no dense ones): pages
// of 4 tokens, budget 16 tokens (4 pages), the tail page forced; the
// listed layers reuse the layer before's selection.
func layersCfg(cp, tp, layers int, reuse []int) Config {
	cfg := reuseCfg(cp, tp, 0)
	cfg.Layers = layers
	cfg.Policy.ReuseLayers = reuse
	return cfg
}

func newLayerSeq(t *testing.T, e *Engine, rng *rand.Rand, n int) *layerSeq {
	t.Helper()
	c := e.Config()
	id, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	s := &layerSeq{id: id, k: make([][][]float32, c.Layers), v: make([][][]float32, c.Layers)}
	kv := c.KVHeads * c.HeadDim
	for l := range c.Layers {
		k, v := randVec(rng, n*kv), randVec(rng, n*kv)
		if err := e.Append(id, l, k, v); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			s.k[l] = append(s.k[l], k[i*kv:(i+1)*kv])
			s.v[l] = append(s.v[l], v[i*kv:(i+1)*kv])
		}
	}
	return s
}

// layerToken is one token's inputs of every layer for one sequence.
type layerToken struct{ q, k, v [][]float32 }

func newLayerToken(rng *rand.Rand, c Config) layerToken {
	var tk layerToken
	kv := c.KVHeads * c.HeadDim
	for range c.Layers {
		q := randVec(rng, c.QHeads*c.HeadDim)
		for j := range q {
			q[j] *= 2
		}
		tk.q, tk.k, tk.v = append(tk.q, q), append(tk.k, randVec(rng, kv)), append(tk.v, randVec(rng, kv))
	}
	return tk
}

// layerStepDiag runs one token through every layer, one diagnosed step
// per layer (as eval's harness does), and returns the layers' results.
func layerStepDiag(t *testing.T, e *Engine, seqs []*layerSeq, toks []layerToken, budgets []int) []Result {
	t.Helper()
	c := e.Config()
	out := make([]Result, c.Layers)
	for l := range c.Layers {
		var reqs []Request
		for i, s := range seqs {
			b := 0
			if budgets != nil {
				b = budgets[i]
			}
			reqs = append(reqs, Request{Seq: s.id, Q: toks[i].q[l], K: toks[i].k[l], V: toks[i].v[l], BudgetTokens: b})
		}
		if err := e.Step(context.Background(), l, reqs, StepOptions{Diagnostics: true}, &out[l]); err != nil {
			t.Fatalf("layer %d: %v", l, err)
		}
		out[l].O = slices.Clone(out[l].O)
	}
	for i, s := range seqs {
		for l := range c.Layers {
			s.k[l], s.v[l] = append(s.k[l], toks[i].k[l]), append(s.v[l], toks[i].v[l])
		}
	}
	return out
}

// layerStepWhole runs one token through every layer in one step of the
// decode.Stepper (no diagnostics) and returns each layer's output and
// times.
func layerStepWhole(t *testing.T, e *Engine, seqs []*layerSeq, toks []layerToken) ([][]float32, []decode.Times) {
	t.Helper()
	c := e.Config()
	ctx := context.Background()
	var rows []decode.Row
	for _, s := range seqs {
		rows = append(rows, decode.Row{Seq: s.id, New: true})
	}
	st, err := e.Begin(ctx, decode.Batch{Rows: rows})
	if err != nil {
		t.Fatal(err)
	}
	var outs [][]float32
	var times []decode.Times
	var res decode.Result
	for l := range c.Layers {
		var q, k, v []float32
		for i := range seqs {
			q, k, v = append(q, toks[i].q[l]...), append(k, toks[i].k[l]...), append(v, toks[i].v[l]...)
		}
		if err := st.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(v), &res); err != nil {
			st.End(ctx)
			t.Fatalf("layer %d: %v", l, err)
		}
		outs = append(outs, slices.Clone(res.O.Data))
		times = append(times, res.Time)
	}
	if err := st.End(ctx); err != nil {
		t.Fatal(err)
	}
	for i, s := range seqs {
		for l := range c.Layers {
			s.k[l], s.v[l] = append(s.k[l], toks[i].k[l]), append(s.v[l], toks[i].v[l])
		}
	}
	return outs, times
}

// ranked returns the non-forced pages of sel under pl.
func rankedOf(sel []int32, pl plan.Plan) []int32 {
	var out []int32
	for _, p := range sel {
		if int(p) >= pl.Lo() && int(p) < pl.Hi() {
			out = append(out, p)
		}
	}
	return out
}

// TestReuseLayersAttendsPrevious: a listed layer attends exactly the
// pages the layer before it ranked (or itself reused) at the same token
// plus its own forced pages (a hand-built set), runs no score phase and
// no selection exchange, and its output equals float64 attention over
// exactly those pages of its own keys; the other layers rank. A chain
// (layers 2 and 3 listed) carries layer 1's pages to layer 3. Over CP x
// TP layouts and both GQA modes, with a sink page.
func TestReuseLayersAttendsPrevious(t *testing.T) {
	for _, tc := range []struct {
		cp, tp, sink int
		reuse        []int
		gqa          kernels.GQAMode
	}{
		{1, 1, 0, []int{1, 3}, kernels.GroupMax},
		{1, 1, 1, []int{2, 3}, kernels.PerHead},
		{3, 2, 1, []int{1, 3}, kernels.GroupMax},
		{2, 4, 0, []int{2, 3}, kernels.PerHead},
	} {
		t.Run(fmt.Sprintf("cp%d_tp%d_sink%d_%v_%v", tc.cp, tc.tp, tc.sink, tc.reuse, tc.gqa), func(t *testing.T) {
			cfg := layersCfg(tc.cp, tc.tp, 4, tc.reuse)
			cfg.Policy.SinkPages, cfg.Policy.GQA = tc.sink, tc.gqa
			e := newPair(t, cfg).e
			c := e.Config()
			g, d, ps := c.QHeads/c.KVHeads, c.HeadDim, c.PageSize
			rng := rand.New(rand.NewPCG(21, uint64(tc.sink)))
			s := newLayerSeq(t, e, rng, 57)
			for step := range 6 {
				toks := []layerToken{newLayerToken(rng, c)}
				res := layerStepDiag(t, e, []*layerSeq{s}, toks, nil)
				var prev [][]int32 // per query head, the ranked pages of the layer before
				for l := range c.Layers {
					r := &res[l]
					pl := r.Plans[0]
					if pl.Dense || pl.Rank == 0 {
						t.Fatalf("step %d layer %d: plan %+v is not sparse", step, l, pl)
					}
					listed := slices.Contains(tc.reuse, l)
					if listed != (r.Time.Reused == 1) || listed != r.Time.RankSkipped {
						t.Fatalf("step %d layer %d: listed %v, reused %d, rank skipped %v", step, l, listed, r.Time.Reused, r.Time.RankSkipped)
					}
					got := r.Diag[0].Selected
					var cur [][]int32
					for h := range c.QHeads {
						rk := rankedOf(got[h], pl)
						if !listed {
							if len(rk) != pl.Rank {
								t.Fatalf("step %d layer %d head %d: ranked %d pages %v, plan ranks %d", step, l, h, len(rk), got[h], pl.Rank)
							}
							cur = append(cur, rk)
							continue
						}
						want := slices.Clone(prev[h])
						for p := range pl.Pages {
							if p < pl.Lo() || p >= pl.Hi() {
								want = append(want, int32(p))
							}
						}
						slices.Sort(want)
						if !slices.Equal(got[h], want) {
							t.Fatalf("step %d layer %d head %d: attended %v, want layer %d's %v plus forced: %v", step, l, h, got[h], l-1, prev[h], want)
						}
						ref := refAttendLayer(s, l, toks[0].q[l], h, g, d, ps, want)
						for j, x := range ref {
							if y := float64(r.O[h*d+j]); math.Abs(y-x) > 2e-5*max(1, math.Abs(x)) {
								t.Fatalf("step %d layer %d head %d: output %d %v, float64 over the pages %v", step, l, h, j, y, x)
							}
						}
						cur = append(cur, prev[h])
					}
					prev = cur
				}
			}
		})
	}
}

// refAttendLayer is refAttend over layer l's keys and values of s.
func refAttendLayer(s *layerSeq, l int, q []float32, h, group, d, ps int, pages []int32) []float64 {
	return refAttend(&reuseSeq{k: s.k[l], v: s.v[l]}, q, h, group, d, ps, pages)
}

// TestReuseLayersRanksAfresh: a listed layer ranks when the layer before
// has no selection of its shape at this token: its own layer budget
// (another K), a row budget that makes the layer before dense, and a
// step forced dense as a whole (the diagnostics' dense pass) leaves the
// kept selection alone.
func TestReuseLayersRanksAfresh(t *testing.T) {
	t.Run("layer budget", func(t *testing.T) {
		cfg := layersCfg(2, 2, 3, []int{1, 2})
		cfg.Policy.LayerBudget = map[int]int{2: 24}
		e := newPair(t, cfg).e
		rng := rand.New(rand.NewPCG(23, 1))
		s := newLayerSeq(t, e, rng, 60)
		res := layerStepDiag(t, e, []*layerSeq{s}, []layerToken{newLayerToken(rng, e.Config())}, nil)
		for l, want := range []int{0, 1, 0} {
			if res[l].Time.Reused != want {
				t.Fatalf("layer %d reused %d, want %d", l, res[l].Time.Reused, want)
			}
		}
	})
	t.Run("dense before", func(t *testing.T) {
		cfg := layersCfg(1, 1, 2, []int{1})
		e := newPair(t, cfg).e
		rng := rand.New(rand.NewPCG(23, 2))
		s := newLayerSeq(t, e, rng, 60)
		// Budget 4096 makes both layers dense: nothing to reuse, no reuse
		// counted; the next token ranks layer 0 and reuses at layer 1.
		res := layerStepDiag(t, e, []*layerSeq{s}, []layerToken{newLayerToken(rng, e.Config())}, []int{4096})
		if res[1].Time.Reused != 0 || !res[1].Plans[0].Dense {
			t.Fatalf("dense token: layer 1 reused %d, plan %+v", res[1].Time.Reused, res[1].Plans[0])
		}
		res = layerStepDiag(t, e, []*layerSeq{s}, []layerToken{newLayerToken(rng, e.Config())}, nil)
		if res[1].Time.Reused != 1 {
			t.Fatalf("sparse token: layer 1 reused %d, want 1", res[1].Time.Reused)
		}
	})
	t.Run("layer skipped", func(t *testing.T) {
		// Layer 2 reuses layer 1's selection only: after a token whose
		// steps ran layer 0 and then layer 2 (layer 1 not yet), layer 2
		// ranks.
		cfg := layersCfg(1, 1, 3, []int{1, 2})
		e := newPair(t, cfg).e
		c := e.Config()
		rng := rand.New(rand.NewPCG(23, 4))
		s := newLayerSeq(t, e, rng, 60)
		tk := newLayerToken(rng, c)
		var res Result
		ctx := context.Background()
		for _, l := range []int{0, 2} {
			if err := e.Step(ctx, l, []Request{{Seq: s.id, Q: tk.q[l], K: tk.k[l], V: tk.v[l]}}, StepOptions{Diagnostics: true}, &res); err != nil {
				t.Fatal(err)
			}
		}
		if res.Time.Reused != 0 {
			t.Fatalf("layer 2 after layer 0 reused %d, want 0 (it reuses layer 1 only)", res.Time.Reused)
		}
	})
	t.Run("forced dense step", func(t *testing.T) {
		cfg := layersCfg(2, 1, 2, []int{1})
		e := newPair(t, cfg).e
		c := e.Config()
		rng := rand.New(rand.NewPCG(23, 3))
		s := newLayerSeq(t, e, rng, 60)
		tk := newLayerToken(rng, c)
		var r0, rd, r1 Result
		ctx := context.Background()
		if err := e.Step(ctx, 0, []Request{{Seq: s.id, Q: tk.q[0], K: tk.k[0], V: tk.v[0]}}, StepOptions{Diagnostics: true}, &r0); err != nil {
			t.Fatal(err)
		}
		// A dense query of layer 0 (no token) between: as the harness's
		// comparison pass.
		if err := e.Step(ctx, 0, []Request{{Seq: s.id, Q: tk.q[0]}}, StepOptions{ForceDense: true}, &rd); err != nil {
			t.Fatal(err)
		}
		if err := e.Step(ctx, 1, []Request{{Seq: s.id, Q: tk.q[1], K: tk.k[1], V: tk.v[1]}}, StepOptions{Diagnostics: true}, &r1); err != nil {
			t.Fatal(err)
		}
		if r1.Time.Reused != 1 {
			t.Fatalf("layer 1 after a forced dense pass of layer 0 reused %d, want 1", r1.Time.Reused)
		}
		pl := r1.Plans[0]
		for h, sel := range r1.Diag[0].Selected {
			if !slices.Equal(rankedOf(sel, pl), rankedOf(r0.Diag[0].Selected[h], r0.Plans[0])) {
				t.Fatalf("head %d: layer 1 ranked pages %v, layer 0's %v", h, rankedOf(sel, pl), rankedOf(r0.Diag[0].Selected[h], r0.Plans[0]))
			}
		}
	})
}

// TestDistributedEqualsSingleShardReuseLayers is invariant 8 with
// selection reuse across layers (and, in some trials, across steps
// too): over CP x TP layouts, GQA modes, exact and replicated selection,
// batches of sequences of different lengths and budgets (one joins
// late, one's budget makes it dense for a token), the engine attends the
// same pages as the single-shard engine with the same policy, its
// outputs agree within fp32 tolerance and it reports the same reuse
// counts.
func TestDistributedEqualsSingleShardReuseLayers(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 7))
	trials := 8
	if testing.Short() {
		trials = 3
	}
	for trial := range trials {
		cp, tp := 1+rng.IntN(5), []int{1, 2, 4}[rng.IntN(3)]
		mode := []Selection{Exact, Replicated}[rng.IntN(2)]
		gqa := []kernels.GQAMode{kernels.GroupMax, kernels.PerHead}[rng.IntN(2)]
		sink := rng.IntN(2)
		reuse := [][]int{{1, 3}, {2}, {1, 2, 3}}[rng.IntN(3)]
		steps := []int{0, 3}[rng.IntN(2)]
		t.Run(fmt.Sprintf("trial%d_cp%d_tp%d_%v_%v_layers%v_steps%d", trial, cp, tp, mode, gqa, reuse, steps), func(t *testing.T) {
			mk := func(cp, tp int) *Engine {
				cfg := layersCfg(cp, tp, 4, reuse)
				cfg.Selection, cfg.Policy.GQA, cfg.Policy.SinkPages, cfg.Policy.ReuseSteps = mode, gqa, sink, steps
				return newPair(t, cfg).e
			}
			a, b := mk(cp, tp), mk(1, 1)
			c := a.Config()
			seed := rng.Uint64()
			ra, rb := rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(seed, 1))
			lens := []int{40 + rng.IntN(60), 100 + rng.IntN(100), 30 + rng.IntN(50)}
			var sa, sb []*layerSeq
			for _, n := range lens {
				sa, sb = append(sa, newLayerSeq(t, a, ra, n)), append(sb, newLayerSeq(t, b, rb, n))
			}
			trng := rand.New(rand.NewPCG(seed, 2))
			reusedAny := false
			for step := range 8 {
				n := 2
				if step >= 3 {
					n = 3
				}
				bud := []int{16, 24, 16}[:n]
				if step == 5 {
					bud = slices.Clone(bud)
					bud[0] = 4096
				}
				var toks []layerToken
				for range n {
					toks = append(toks, newLayerToken(trng, c))
				}
				resA := layerStepDiag(t, a, sa[:n], toks, bud)
				resB := layerStepDiag(t, b, sb[:n], toks, bud)
				for l := range c.Layers {
					ta, tb := resA[l].Time, resB[l].Time
					if ta.Reused != tb.Reused || ta.RankSkipped != tb.RankSkipped {
						t.Fatalf("step %d layer %d: reused %d (skipped %v), single shard %d (%v)", step, l, ta.Reused, ta.RankSkipped, tb.Reused, tb.RankSkipped)
					}
					reusedAny = reusedAny || tb.Reused > 0
					for i := range n {
						if resA[l].Plans[i] != resB[l].Plans[i] {
							t.Fatalf("step %d layer %d seq %d: plan %+v, single shard %+v", step, l, i, resA[l].Plans[i], resB[l].Plans[i])
						}
						for h, sel := range resA[l].Diag[i].Selected {
							if !slices.Equal(sel, resB[l].Diag[i].Selected[h]) {
								t.Fatalf("step %d layer %d seq %d head %d: pages %v, single shard %v", step, l, i, h, sel, resB[l].Diag[i].Selected[h])
							}
						}
					}
					for j := range resB[l].O {
						if math.Abs(float64(resA[l].O[j]-resB[l].O[j])) > 2e-5*max(1, math.Abs(float64(resB[l].O[j]))) {
							t.Fatalf("step %d layer %d output %d: %v, single shard %v", step, l, j, resA[l].O[j], resB[l].O[j])
						}
					}
				}
			}
			if !reusedAny {
				t.Fatal("no layer reused")
			}
		})
	}
}

// TestReuseLayersWholeStep: the whole-model step of the decode.Stepper
// (one Begin, a Layer call per layer, no diagnostics; on one shard the
// path a fusing backend would take) reuses alike: the same reuse counts
// per layer and outputs equal to the diagnosed per-layer run's, whose
// attended pages the tests above check.
func TestReuseLayersWholeStep(t *testing.T) {
	for _, lay := range [][2]int{{1, 1}, {2, 2}} {
		t.Run(fmt.Sprintf("cp%d_tp%d", lay[0], lay[1]), func(t *testing.T) {
			var outs [2][][][]float32
			var reused [2][][]int
			for run := range 2 {
				e := newPair(t, layersCfg(lay[0], lay[1], 4, []int{1, 3})).e
				c := e.Config()
				rng := rand.New(rand.NewPCG(29, 4))
				s := newLayerSeq(t, e, rng, 66)
				for range 5 {
					toks := []layerToken{newLayerToken(rng, c)}
					var o [][]float32
					var rs []int
					if run == 0 {
						for _, r := range layerStepDiag(t, e, []*layerSeq{s}, toks, nil) {
							o, rs = append(o, r.O), append(rs, r.Time.Reused)
						}
					} else {
						var ts []decode.Times
						o, ts = layerStepWhole(t, e, []*layerSeq{s}, toks)
						for _, tm := range ts {
							rs = append(rs, tm.Reused)
						}
					}
					outs[run], reused[run] = append(outs[run], o), append(reused[run], rs)
				}
			}
			for st := range outs[0] {
				if want := []int{0, 1, 0, 1}; !slices.Equal(reused[0][st], want) || !slices.Equal(reused[1][st], want) {
					t.Fatalf("step %d: reused per layer %v diagnosed, %v whole step, want %v", st, reused[0][st], reused[1][st], want)
				}
				for l := range outs[0][st] {
					for j, x := range outs[0][st][l] {
						if y := outs[1][st][l][j]; math.Abs(float64(x-y)) > 2e-5*max(1, math.Abs(float64(x))) {
							t.Fatalf("step %d layer %d output %d: %v whole step, %v diagnosed", st, l, j, y, x)
						}
					}
				}
			}
		})
	}
}
