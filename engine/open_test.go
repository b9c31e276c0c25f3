package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// openOver builds the workers of cfg's grid by hand, two ranks per worker
// where it can (worker w hosts CP rank c of every TP group when tpMajor
// is false), and opens an engine over them.
func openOver(t *testing.T, cfg Config, be kernels.Backend) *Engine {
	t.Helper()
	wc := cfg.workerConfig()
	wc.MemoryLimit = memlimit.NoLimit
	trs := make([][]collective.Transport, cfg.TP)
	for tp := range cfg.TP {
		trs[tp] = collective.NewInprocGroup(cfg.CP)
	}
	var hosts []Host
	for cp := range cfg.CP {
		var specs []worker.RankSpec
		var ranks []worker.Rank
		for tp := range cfg.TP {
			r := worker.Rank{TP: tp, CP: cp}
			specs = append(specs, worker.RankSpec{Rank: r, Backend: be, Transport: trs[tp][cp]})
			ranks = append(ranks, r)
		}
		l, err := worker.NewLocal(wc, specs)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		hosts = append(hosts, Host{Worker: l, Ranks: ranks})
	}
	t.Cleanup(func() {
		for _, g := range trs {
			for _, tr := range g {
				tr.Close()
			}
		}
	})
	e, err := Open(cfg, hosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// An engine opened over workers that host several ranks each gives the
// outputs and diagnostics of an engine that built one worker per rank.
func TestOpenEqualsNew(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	for _, mode := range []Selection{Exact, Union, Replicated} {
		cfg := DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 3, 8, 4, 16, 4
		cfg.CP, cfg.TP, cfg.CapacityPages, cfg.Selection = 3, 2, 64, mode
		cfg.Policy.PageSize, cfg.Policy.BudgetTokens, cfg.Policy.DenseLayers = 4, 16, 1
		cfg.Backend, cfg.MemoryLimit = be, memlimit.NoLimit
		ref, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer ref.Close()
		op := openOver(t, cfg, be)
		if op.Shard(0, 0) != nil {
			t.Fatal("Shard of an opened engine is not nil")
		}
		rng := rand.New(rand.NewPCG(7, uint64(mode)))
		a, _ := ref.Create(plan.Striped)
		b, _ := op.Create(plan.Striped)
		kv := cfg.KVHeads * cfg.HeadDim
		for l := range cfg.Layers {
			k, v := randVec(rng, 50*kv), randVec(rng, 50*kv)
			if err := ref.Append(a, l, k, v); err != nil {
				t.Fatal(err)
			}
			if err := op.Append(b, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
		for step := range 4 {
			for l := range cfg.Layers {
				q := randVec(rng, cfg.QHeads*cfg.HeadDim)
				k, v := randVec(rng, kv), randVec(rng, kv)
				opt := StepOptions{Diagnostics: step == 3}
				var ra, rb Result
				if err := ref.Step(context.Background(), l, []Request{{Seq: a, Q: q, K: k, V: v}}, opt, &ra); err != nil {
					t.Fatal(err)
				}
				if err := op.Step(context.Background(), l, []Request{{Seq: b, Q: q, K: k, V: v}}, opt, &rb); err != nil {
					t.Fatal(err)
				}
				for i := range ra.O {
					if math.Abs(float64(ra.O[i]-rb.O[i])) > 1e-5*(1+math.Abs(float64(ra.O[i]))) {
						t.Fatalf("%v step %d layer %d: o[%d] %g vs %g", mode, step, l, i, ra.O[i], rb.O[i])
					}
				}
				if opt.Diagnostics {
					da, db := ra.Diag[0], rb.Diag[0]
					if da.Recall != db.Recall || da.MassRecall != db.MassRecall || math.IsNaN(da.Recall) {
						t.Fatalf("recall %g / %g, mass %g / %g: new and open differ", da.Recall, db.Recall, da.MassRecall, db.MassRecall)
					}
					if da.SlackP90 != db.SlackP90 || math.IsNaN(da.SlackP90) || da.SlackP50 < 0 || da.SlackMax < da.SlackP90 {
						t.Fatalf("slack p50 %g p90 %g max %g, open p90 %g", da.SlackP50, da.SlackP90, da.SlackMax, db.SlackP90)
					}
					if math.Abs(da.RelL2-db.RelL2) > 1e-6 || len(rb.DenseLSE) != cfg.QHeads {
						t.Fatalf("rel_l2 %g vs %g, dense lse %d", da.RelL2, db.RelL2, len(rb.DenseLSE))
					}
					for h := range da.Selected {
						if len(da.Selected[h]) != len(db.Selected[h]) {
							t.Fatalf("head %d: selected %v vs %v", h, da.Selected[h], db.Selected[h])
						}
					}
				}
			}
		}
	}
}

func TestOpenRefusesBadHosts(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CP, cfg.TP = 2, 1
	l, err := worker.NewLocal(cfg.workerConfig(), nil)
	if err == nil {
		defer l.Close()
	}
	var w worker.Worker = l
	for name, hosts := range map[string][]Host{
		"missing rank": {{Worker: w, Ranks: []worker.Rank{{CP: 0}}}},
		"twice":        {{Worker: w, Ranks: []worker.Rank{{CP: 0}, {CP: 1}}}, {Worker: w, Ranks: []worker.Rank{{CP: 1}}}},
		"outside":      {{Worker: w, Ranks: []worker.Rank{{CP: 0}, {CP: 1}, {CP: 2}}}},
		"no worker":    {{Ranks: []worker.Rank{{CP: 0}, {CP: 1}}}},
	} {
		if _, err := Open(cfg, hosts); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
}
