//go:build cuda

package gpu

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// testModel loads the checkpoint named by QUESTRT_TEST_MODEL (a passkey
// model of ../shared/models, copied where the GPU host can read it) and
// its reference prompt; the test is skipped without it.
func testModel(t *testing.T) (*model.Model, []int) {
	t.Helper()
	dir := os.Getenv("QUESTRT_TEST_MODEL")
	if dir == "" {
		t.Skip("QUESTRT_TEST_MODEL names no checkpoint")
	}
	m, err := model.Load(dir, model.LoadOptions{MemoryLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		InputIDs []int `json:"input_ids"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return m, ref.InputIDs
}

// testPolicy makes the reference prompt sparse: pages of 16 tokens, a
// budget of 256 tokens over about 60 pages, the first layer dense.
func testPolicy() plan.Policy {
	p := plan.DefaultPolicy()
	p.PageSize, p.BudgetTokens, p.DenseLayers = 16, 256, 1
	return p
}

// cpuGreedy decodes steps greedy tokens after prompt with the CPU
// executor over an in-process engine on the CPU, returning the tokens
// and the logits of the first decode step.
func cpuGreedy(t *testing.T, m *model.Model, prompt []int, steps int) ([]int, []float32) {
	t.Helper()
	ctx := context.Background()
	e, err := engine.New(model.EngineConfig(m.Geometry(), testPolicy(), 512))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	attn, err := model.NewEngineAttention(e, m.Geometry())
	if err != nil {
		t.Fatal(err)
	}
	logits, err := m.Forward(ctx, attn, prompt, model.ForwardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	toks := []int{model.Argmax(logits)}
	var first []float32
	for len(toks) < steps {
		if logits, err = m.Forward(ctx, attn, toks[len(toks)-1:], model.ForwardOptions{}); err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = append([]float32(nil), logits...)
		}
		toks = append(toks, model.Argmax(logits))
	}
	return toks, first
}

// TestGreedyMatchesCPU decodes the reference prompt (and a shorter one
// in the same batch) greedily on the GPU, the prompts prefilled by the
// CPU executor into an engine whose pages live on the GPU, and compares
// with the CPU executor over a CPU engine under the same policy: with
// float32 weights every token equals the CPU's and the first step's
// logits agree to 1e-3; with bf16 weights the share of equal tokens is
// reported (and must be most of them).
func TestGreedyMatchesCPU(t *testing.T) {
	m, prompt := testModel(t)
	const steps = 48
	prompts := [][]int{prompt, prompt[:500]}
	var want [][]int
	var wantLogits [][]float32
	for _, p := range prompts {
		toks, l := cpuGreedy(t, m, p, steps)
		want, wantLogits = append(want, toks), append(wantLogits, l)
	}
	for _, f32 := range []bool{true, false} {
		name := "bf16"
		if f32 {
			name = "f32"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			be, err := cuda.New(cuda.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			cfg := model.EngineConfig(m.Geometry(), testPolicy(), 512)
			cfg.Backend, cfg.DeviceResident = be, true
			e, err := engine.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			x, err := New(ctx, be, m, Options{Float32Weights: f32})
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close(ctx)
			t.Logf("weights: %d bytes on the device", x.WeightBytes())
			rows := make([]Row, len(prompts))
			got := make([][]int, len(prompts))
			for i, p := range prompts {
				attn, err := model.NewEngineAttention(e, m.Geometry())
				if err != nil {
					t.Fatal(err)
				}
				logits, err := m.Forward(ctx, attn, p, model.ForwardOptions{})
				if err != nil {
					t.Fatal(err)
				}
				stp, row, _, ok := attn.DecodeRow()
				if !ok || stp != e {
					t.Fatal("the engine attention has no decode row on the engine")
				}
				rows[i] = Row{Seq: row.Seq, Token: model.Argmax(logits), Pos: len(p)}
				got[i] = []int{rows[i].Token}
			}
			for s := 1; s < steps; s++ {
				next, err := x.Decode(ctx, e, rows)
				if err != nil {
					t.Fatalf("step %d: %v", s, err)
				}
				if s == 1 {
					l, err := x.Logits(ctx, len(rows))
					if err != nil {
						t.Fatal(err)
					}
					v := m.Config.VocabSize
					for i := range rows {
						d := maxDiff(l[i*v:(i+1)*v], wantLogits[i])
						t.Logf("row %d: first decode step's logits within %.3g of the CPU's", i, d)
						if f32 && d > 1e-3 {
							t.Errorf("row %d: logits differ from the CPU's by %g", i, d)
						}
					}
				}
				for i := range rows {
					got[i] = append(got[i], next[i])
					rows[i].Token, rows[i].Pos = next[i], rows[i].Pos+1
				}
			}
			for i := range rows {
				same := 0
				for j := range want[i] {
					if got[i][j] == want[i][j] {
						same++
					}
				}
				t.Logf("row %d (prompt of %d): %d of %d greedy tokens equal the CPU's", i, len(prompts[i]), same, steps)
				if f32 && same != steps {
					t.Errorf("row %d: tokens %v, CPU %v", i, got[i], want[i])
				}
				if !f32 && same < steps/2 {
					t.Errorf("row %d: only %d of %d tokens equal the CPU's: %v vs %v", i, same, steps, got[i], want[i])
				}
			}
		})
	}
}

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}
