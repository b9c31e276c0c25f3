package eval

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// TestPasskeyFP8KV: passkey-llama-v1 at 2K with the fp8 KV cache
// (plan.FP8) and with f32 K/V, on the same prompts, at B = 128 and 512
// and a budget covering every page. On fp8 the full budget answers as
// dense over the same stored pages (invariant 2 end to end) and its
// teacher-forced logits match dense. QUESTRT_FP8_N sets the prompts
// (default 3); the accuracies are logged for the quality figure
// (bench/results/2026-12-06-fp8-kv-cpu.md).
func TestPasskeyFP8KV(t *testing.T) {
	if testing.Short() {
		t.Skip("prefills of 2K tokens")
	}
	if raceEnabled {
		// As TestPasskeyAccuracy2K: numbers the run without the
		// detector checks (8 minutes under race on a loaded 2-core
		// machine).
		t.Skip("prefills of 2K tokens: checked without -race")
	}
	n := 3
	if s := os.Getenv("QUESTRT_FP8_N"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("QUESTRT_FP8_N=%q", s)
		}
	}
	m, err := model.Load(filepath.Join(modelsDir(t), "passkey-llama-v1"), model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := model.NewByteTokenizer(m.Config)
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		dt  plan.DType
		h   *Harness
		agg *Aggregate
	}
	var runs []run
	for _, dt := range []plan.DType{plan.Float32, plan.FP8} {
		cfg := DefaultConfig()
		cfg.Budgets = []int{4096, 128, 512}
		cfg.KVDType = dt
		cfg.NewRunner = newEngineRunner
		h, err := NewHarness(m, tok, cfg, 2200)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		runs = append(runs, run{dt, h, NewAggregate(cfg)})
	}
	rng := rand.New(rand.NewPCG(26, 1))
	for range n {
		p, err := Passkey(rng, 2048, PasskeyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			res, err := r.h.Evaluate(context.Background(), p)
			if err != nil {
				t.Fatalf("%v: %v", r.dt, err)
			}
			if r.dt == plan.FP8 && res.Runs[0].Output != res.Dense.Output {
				t.Errorf("fp8: full budget answered %q, dense over the same pages %q", res.Runs[0].Output, res.Dense.Output)
			}
			r.agg.Add(res)
		}
	}
	for _, r := range runs {
		recs := r.agg.Records(2048)
		line := fmt.Sprintf("kv %v, n=%d:", r.dt, n)
		for _, rec := range recs {
			line += fmt.Sprintf(" %s B=%d acc %.3f", rec.Selector, rec.Budget, rec.Accuracy)
			if tf := rec.TeacherForced; tf != nil && len(tf.Layers) > 2 && tf.Layers[2].MassRecall != nil {
				line += fmt.Sprintf(" (mass recall L2 %.4f)", *tf.Layers[2].MassRecall)
			}
			line += ";"
		}
		t.Log(line)
		if r.dt == plan.FP8 {
			if tf := recs[1].TeacherForced; recs[1].Budget != 4096 || *tf.MaxLogitErr > 1e-3 || *tf.TokenAgreement != 1 {
				t.Errorf("fp8 full budget: %+v (max logit err %v, agreement %v)", recs[1].Budget, *tf.MaxLogitErr, *tf.TokenAgreement)
			}
		}
	}
}
