package model

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// newEngine builds an engine for m with the given policy, room for
// tokens tokens of a few sequences, and cp x tp shards.
func newEngine(t testing.TB, m *Model, p plan.Policy, tokens, cp, tp int) *engine.Engine {
	t.Helper()
	cfg := engine.ModelConfig(m.Geometry(), p, 4*(tokens/p.PageSize+2))
	cfg.CP, cfg.TP = cp, tp
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// decodeRun prefills ids into attn and runs steps greedy decode steps,
// returning the logits of the prefill's last token and of every step.
func decodeRun(t testing.TB, m *Model, attn Attention, ids []int, steps int) ([][]float32, []int) {
	t.Helper()
	ctx := context.Background()
	logits, err := m.Forward(ctx, attn, ids, ForwardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all := [][]float32{logits}
	var toks []int
	for range steps {
		id := Argmax(logits)
		toks = append(toks, id)
		if logits, err = m.Forward(ctx, attn, []int{id}, ForwardOptions{}); err != nil {
			t.Fatal(err)
		}
		all = append(all, logits)
	}
	return all, toks
}

// TestEngineFullBudgetMatchesDense: with a budget covering the context
// the engine's decode steps equal dense attention (DESIGN invariant 2):
// the greedy continuation is the reference's, and the logits of the
// prefill and of every decode step match the float64 reference within
// 1e-4, on one shard and on CP 2 x TP 2.
func TestEngineFullBudgetMatchesDense(t *testing.T) {
	modelsDir(t) // skip the whole test, not only its subtests, without checkpoints
	names := []string{"passkey-llama-v1", "passkey-llama-v2"}
	if raceEnabled {
		// The engine's goroutines are raced on the small checkpoint;
		// v2's numbers (about two thirds of the test's 4 minutes
		// under race on 2 cores) are checked without the detector.
		names = names[:1]
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			m, ref := testModel(t, name)
			steps := len(ref.Greedy)
			want, wantToks := decodeRun(t, m, NewReference(m.Geometry()), ref.InputIDs, steps)
			if !slices.Equal(wantToks, ref.Greedy) {
				t.Fatalf("reference attention continues with %v, reference.json %v", wantToks, ref.Greedy)
			}
			last := ref.Logits[strconv.Itoa(len(ref.InputIDs)-1)]
			if abs, _ := logitErr(want[0], last); abs > 1e-4 {
				t.Fatalf("prefill logits off the reference by %.3g", abs)
			}
			p := plan.DefaultPolicy()
			p.DenseLayers = 0
			p.BudgetTokens = 2048 // > 1002 tokens: every plan is dense
			for _, lay := range [][2]int{{1, 1}, {2, 2}} {
				e := newEngine(t, m, p, 2048, lay[0], lay[1])
				a, err := NewEngineAttention(e, m.Geometry())
				if err != nil {
					t.Fatal(err)
				}
				got, toks := decodeRun(t, m, a, ref.InputIDs, steps)
				if !slices.Equal(toks, wantToks) {
					t.Errorf("cp %d tp %d: tokens %v, dense %v", lay[0], lay[1], toks, wantToks)
				}
				worst := 0.0
				for i := range got {
					abs, _ := logitErr(got[i], want[i])
					worst = max(worst, abs)
					if abs > 1e-4 {
						t.Errorf("cp %d tp %d: step %d logits off the dense reference by %.3g", lay[0], lay[1], i, abs)
					}
				}
				for l, st := range a.Steps() {
					if !st.Plan.Dense || st.PagesRead != st.PagesTotal {
						t.Errorf("layer %d: plan %+v reads %d of %d pages, want dense", l, st.Plan, st.PagesRead, st.PagesTotal)
					}
				}
				t.Logf("cp %d tp %d: max abs logit error vs float64 dense over prefill + %d decode steps: %.3g", lay[0], lay[1], steps, worst)
				a.Release()
			}
		})
	}
}

// TestEngineSparseDecode: at a budget of 16 pages of about 63 the sparse
// layers read fewer pages than dense, the diagnostics are in range, the
// reference prompt's passkey still comes out, and CP 2 x TP 2 (exact
// selection) gives the single shard's tokens and logits.
func TestEngineSparseDecode(t *testing.T) {
	m, ref := testModel(t, "passkey-llama-v1")
	p := plan.DefaultPolicy()
	p.BudgetTokens = 256
	var base [][]float32
	var baseToks []int
	for _, lay := range [][2]int{{1, 1}, {2, 2}} {
		e := newEngine(t, m, p, 2048, lay[0], lay[1])
		a, err := NewEngineAttention(e, m.Geometry())
		if err != nil {
			t.Fatal(err)
		}
		a.Options.Diagnostics = true
		a.Compare = true
		got, toks := decodeRun(t, m, a, ref.InputIDs, len(ref.Greedy))
		if !slices.Equal(toks, ref.Greedy) {
			t.Errorf("cp %d tp %d: tokens %v, want %v", lay[0], lay[1], toks, ref.Greedy)
		}
		for l, st := range a.Steps() {
			sparse := l >= p.DenseLayers
			if sparse == st.Plan.Dense || (sparse && st.PagesRead >= st.PagesTotal) {
				t.Errorf("layer %d: plan %+v reads %d of %d pages", l, st.Plan, st.PagesRead, st.PagesTotal)
			}
			if !st.Diag || st.MassRecall <= 0 || st.MassRecall > 1+1e-9 || st.Recall < 0 || st.Recall > 1 || len(st.Cosine) != m.Config.Heads {
				t.Errorf("layer %d: diagnostics %+v", l, st)
			}
			if !sparse && (st.MassRecall < 1-1e-5 || slices.Min(st.Cosine) < 1-1e-6) {
				t.Errorf("dense layer %d: mass recall %v, cosine %v", l, st.MassRecall, st.Cosine)
			}
			t.Logf("cp %d tp %d layer %d: pages %d/%d recall %.3f mass %.4f (min %.4f) cos min %.5f",
				lay[0], lay[1], l, st.PagesRead, st.PagesTotal, st.Recall, st.MassRecall, st.MinMassRecall, slices.Min(st.Cosine))
		}
		if base == nil {
			base, baseToks = got, toks
			continue
		}
		if !slices.Equal(toks, baseToks) {
			t.Errorf("cp %d tp %d: tokens %v, one shard %v", lay[0], lay[1], toks, baseToks)
		}
		for i := range got {
			if abs, _ := logitErr(got[i], base[i]); abs > 1e-4 {
				t.Errorf("cp %d tp %d step %d: logits differ from one shard by %.3g", lay[0], lay[1], i, abs)
			}
		}
	}
}
