package gpu

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// testPolicy makes the test prompts sparse: pages of 16 tokens, a budget
// of 256 tokens, the first layer dense.
func testPolicy() plan.Policy {
	p := plan.DefaultPolicy()
	p.PageSize, p.BudgetTokens, p.DenseLayers = 16, 256, 1
	return p
}

// cpuGreedy decodes steps greedy tokens after prompt with the CPU
// executor over an in-process engine on the CPU, returning the tokens
// and the logits of the first decode step.
func cpuGreedy(t *testing.T, m *model.Model, prompt []int, steps int) ([]int, []float32) {
	toks, first, _ := cpuGreedyPrefill(t, m, prompt, steps)
	return toks, first
}

// cpuGreedyPrefill is cpuGreedy that also returns the prefill's logits.
func cpuGreedyPrefill(t *testing.T, m *model.Model, prompt []int, steps int) ([]int, []float32, []float32) {
	t.Helper()
	ctx := context.Background()
	e, err := engine.New(engine.ModelConfig(m.Geometry(), testPolicy(), 512))
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
	pre := append([]float32(nil), logits...)
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
	return toks, first, pre
}

// testDevice is a backend that holds pages and runs the model's kernels.
type testDevice interface {
	kernels.Backend
	kernels.ModelDevice
}

// compareGreedy prefills prompts with the CPU executor (or, with
// prefill, the executor's Prefill on the device in chunks of
// prefill.chunk) into an engine on dev (pages device-resident), decodes steps greedy tokens of all of them
// in one batch with the executor, and compares with each prompt decoded
// alone by the CPU executor over a CPU engine: the first decode step's
// logits within tol when tol > 0, and every token equal with float32
// weights (most of them with bf16). It returns the executor's
// host synchronisations per step when dev counts them.
func compareGreedy(t *testing.T, dev testDevice, m *model.Model, prompts [][]int, steps int, f32 bool, tol float64) {
	compareGreedyWith(t, dev, m, prompts, steps, f32, tol, devicePrefill{})
}

// devicePrefill is how compareGreedyWith prefills: on the device in
// chunks of chunk tokens when on, with the engine's pages in dtype
// (zero: the engine's default).
type devicePrefill struct {
	on    bool
	chunk int
	dtype plan.DType
}

func compareGreedyWith(t *testing.T, dev testDevice, m *model.Model, prompts [][]int, steps int, f32 bool, tol float64, pf devicePrefill) {
	t.Helper()
	var want [][]int
	var wantLogits, wantPre [][]float32
	for _, p := range prompts {
		toks, l, pre := cpuGreedyPrefill(t, m, p, steps)
		want, wantLogits, wantPre = append(want, toks), append(wantLogits, l), append(wantPre, pre)
	}
	ctx := context.Background()
	cfg := engine.ModelConfig(m.Geometry(), testPolicy(), 512)
	cfg.Backend, cfg.DeviceResident = dev, true
	if pf.dtype != 0 {
		cfg.Geometry.DType = pf.dtype
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	x, err := New(ctx, dev, m, Options{Float32Weights: f32, PrefillChunk: pf.chunk})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	t.Logf("weights: %d bytes on the device", x.WeightBytes())
	rows := make([]Row, len(prompts))
	got := make([][]int, len(prompts))
	for i, p := range prompts {
		if pf.on {
			id, err := e.Create(plan.Striped)
			if err != nil {
				t.Fatal(err)
			}
			logits, err := x.Prefill(ctx, e, id, p, 0)
			if err != nil {
				t.Fatal(err)
			}
			d := maxDiff(logits, wantPre[i])
			t.Logf("row %d: device prefill's logits within %.3g of the CPU's", i, d)
			if tol > 0 && d > tol {
				t.Errorf("row %d: device prefill's logits differ from the CPU's by %g (> %g)", i, d, tol)
			}
			if n, err := e.Len(id); err != nil || n != len(p) {
				t.Fatalf("row %d: the sequence holds %d tokens (%v) after a prefill of %d", i, n, err, len(p))
			}
			rows[i] = Row{Seq: id, Token: model.Argmax(logits), Pos: len(p)}
			got[i] = []int{rows[i].Token}
			continue
		}
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
	syncs, _ := dev.(interface{ Syncs() int })
	for s := 1; s < steps; s++ {
		before := 0
		if syncs != nil {
			before = syncs.Syncs()
		}
		next, err := x.Decode(ctx, e, rows)
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		if syncs != nil {
			// The Stepper's End and the argmax, nothing per layer.
			if n := syncs.Syncs() - before; n != 2 {
				t.Fatalf("step %d: %d host synchronisations, want 2 (End and the argmax)", s, n)
			}
		}
		if s == 1 {
			l, err := x.Logits(ctx, len(rows))
			if err != nil {
				t.Fatal(err)
			}
			v := m.Config.VocabSize
			for i := range rows {
				checkSteps(t, x.LastSteps(i), m.Config.Layers, rows[i].Pos, testPolicy())
				d := maxDiff(l[i*v:(i+1)*v], wantLogits[i])
				t.Logf("row %d: first decode step's logits within %.3g of the CPU's", i, d)
				if tol > 0 && d > tol {
					t.Errorf("row %d: logits differ from the CPU's by %g (> %g)", i, d, tol)
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
		if f32 && !pf.on && same != steps {
			t.Errorf("row %d: tokens %v, CPU %v", i, got[i], want[i])
		}
		if !f32 && same < steps/2 {
			t.Errorf("row %d: only %d of %d tokens equal the CPU's: %v vs %v", i, same, steps, got[i], want[i])
		}
	}
}

// checkSteps checks a row's per-layer plans of a step at position pos
// (pos+1 tokens, the new one included): the first DenseLayers read every
// page, the others the budget's pages out of all.
func checkSteps(t *testing.T, steps []model.StepInfo, layers, pos int, pol plan.Policy) {
	t.Helper()
	if len(steps) != layers {
		t.Fatalf("%d layer steps, want %d", len(steps), layers)
	}
	pages := (pos + 1 + pol.PageSize - 1) / pol.PageSize
	for l, st := range steps {
		if st.Layer != l || st.Plan.Pages != pages {
			t.Fatalf("layer %d: step of layer %d over %d pages, want %d", l, st.Layer, st.Plan.Pages, pages)
		}
		k := pol.BudgetTokens / pol.PageSize
		switch {
		case l < pol.DenseLayers || k >= pages:
			if !st.Plan.Dense || st.PagesRead != st.PagesTotal {
				t.Errorf("layer %d: dense expected, read %d of %d", l, st.PagesRead, st.PagesTotal)
			}
		case st.Plan.Dense || st.PagesRead >= st.PagesTotal || st.Plan.Reads() > k:
			t.Errorf("layer %d: sparse expected (K %d), plan %+v, read %d of %d", l, k, st.Plan, st.PagesRead, st.PagesTotal)
		}
	}
}

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// twin is the CPU twin of a device, closed with the test.
func twin(t *testing.T) *backendtest.QueuedDevice {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	t.Cleanup(func() { cpu.Close() })
	return &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}
}

// twinExecutor is an executor of m with opt on the CPU twin of a device
// and an engine of 64 pages there (testPolicy), both closed with the
// test.
func twinExecutor(t *testing.T, m *model.Model, opt Options) (*engine.Engine, *Executor) {
	t.Helper()
	ctx := context.Background()
	dev := twin(t)
	cfg := engine.ModelConfig(m.Geometry(), testPolicy(), 64)
	cfg.Backend, cfg.DeviceResident = dev, true
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	x, err := New(ctx, dev, m, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close(ctx) })
	return e, x
}

// tinyConfig is a small Llama shape (GQA, 2 layers) for the twin.
func tinyConfig(t *testing.T) model.Config {
	t.Helper()
	c, err := model.ParseConfig([]byte(`{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
		"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
		"max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
		"hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTwinMatchesCPU runs the executor on the CPU twin of a device (CI:
// everything of the GPU path but the kernels): a random model's prompts
// of 700 and 300 tokens prefilled into pages "on the device", 24 greedy
// steps of both in one batch, compared with each decoded alone by the
// CPU executor: every token equal, logits within 1e-4, and two host
// synchronisations a step whatever the layers (End and the argmax).
func TestTwinMatchesCPU(t *testing.T) {
	c := tinyConfig(t)
	m, err := model.NewRandom(c, model.RandomOptions{Seed: 5, Std: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int, 700)
	for i := range prompt {
		prompt[i] = 3 + (i*7+i*i/5)%290
	}
	for _, f32 := range []bool{true, false} {
		compareGreedy(t, twin(t), m, [][]int{prompt, prompt[:300]}, 24, f32, 1e-4)
	}
}

// TestTwinPrefillMatchesCPU is TestTwinMatchesCPU with the prompts
// prefilled by the executor on the twin, in chunks of 256 tokens (a
// partial last chunk, chunks that end inside a page): the prefill's
// logits within 1e-4 of the CPU executor's, then the same greedy tokens.
func TestTwinPrefillMatchesCPU(t *testing.T) {
	c := tinyConfig(t)
	m, err := model.NewRandom(c, model.RandomOptions{Seed: 5, Std: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int, 700)
	for i := range prompt {
		prompt[i] = 3 + (i*7+i*i/5)%290
	}
	for _, f32 := range []bool{true, false} {
		compareGreedyWith(t, twin(t), m, [][]int{prompt, prompt[:300], prompt[:7]}, 24, f32, 1e-4, devicePrefill{on: true, chunk: 250})
	}
}

// TestTwinBadInput: rows the executor refuses change nothing: the same
// rows decode afterwards as if the refused call had not been made.
func TestTwinBadInput(t *testing.T) {
	c := tinyConfig(t)
	m, err := model.NewRandom(c, model.RandomOptions{Seed: 6, Std: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e, x := twinExecutor(t, m, Options{MaxBatch: 2})
	attn, err := model.NewEngineAttention(e, m.Geometry())
	if err != nil {
		t.Fatal(err)
	}
	logits, err := m.Forward(ctx, attn, []int{5, 6, 7, 8, 9}, model.ForwardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, row, _, _ := attn.DecodeRow()
	good := Row{Seq: row.Seq, Token: model.Argmax(logits), Pos: 5}
	for name, rows := range map[string][]Row{
		"no rows":        nil,
		"too many rows":  {good, good, good},
		"token negative": {{Seq: row.Seq, Token: -1, Pos: 5}},
		"token past":     {{Seq: row.Seq, Token: c.VocabSize, Pos: 5}},
		"position past":  {{Seq: row.Seq, Token: 1, Pos: c.MaxPositions}},
		"temperature":    {{Seq: row.Seq, Token: 1, Pos: 5, Sample: kernels.SampleParams{Temperature: -1}}},
		"draw":           {{Seq: row.Seq, Token: 1, Pos: 5, Sample: kernels.SampleParams{Temperature: 1, U: 1}}},
	} {
		if _, err := x.Decode(ctx, e, rows); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
	if _, err := x.Decode(ctx, e, []Row{{Seq: row.Seq + 1000, Token: 1, Pos: 5}}); err == nil {
		t.Error("an unknown sequence decoded")
	}
	want, _ := cpuGreedy(t, m, []int{5, 6, 7, 8, 9}, 4)
	got := []int{good.Token}
	for len(got) < 4 {
		next, err := x.Decode(ctx, e, []Row{good})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, next[0])
		good.Token, good.Pos = next[0], good.Pos+1
	}
	if !slices.Equal(got, want) {
		t.Errorf("after the refused calls: %v, CPU %v", got, want)
	}
}

// TestAdmission: Need counts every byte the executor allocates (the
// twin's allocations after New equal it), and a device without room for
// them (and Reserve) refuses the model with ErrNoMemory and one line
// naming the sizes, with nothing allocated.
func TestAdmission(t *testing.T) {
	ctx := context.Background()
	c := tinyConfig(t)
	for _, opt := range []Options{{}, {Float32Weights: true, MaxBatch: 3}} {
		dev := twin(t)
		x, err := NewRandom(ctx, dev, c, 1, opt)
		if err != nil {
			t.Fatal(err)
		}
		w, a := Need(c, opt)
		if got := dev.Allocated(); got != w+a {
			t.Errorf("%+v: allocated %d bytes, Need says %d + %d", opt, got, w, a)
		}
		if w != x.WeightBytes() {
			t.Errorf("%+v: weights %d bytes, Need says %d", opt, x.WeightBytes(), w)
		}
		x.Close(ctx)
		if got := dev.Allocated(); got != 0 {
			t.Errorf("%+v: %d bytes left after Close", opt, got)
		}
		small := twin(t)
		small.Capacity = w + a + Reserve - 1
		m, err := model.NewRandom(c, model.RandomOptions{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		for name, f := range map[string]func() error{
			"NewRandom": func() error { _, err := NewRandom(ctx, small, c, 1, opt); return err },
			"New":       func() error { _, err := New(ctx, small, m, opt); return err },
		} {
			err := f()
			if !errors.Is(err, ErrNoMemory) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "GB free") {
				t.Errorf("%s on a device 1 byte short: %v", name, err)
			}
			if got := small.Allocated(); got != 0 {
				t.Errorf("%s refused with %d bytes allocated", name, got)
			}
		}
		small.Capacity = w + a + Reserve
		if x, err := NewRandom(ctx, small, c, 1, opt); err != nil {
			t.Errorf("a device with exactly the room: %v", err)
		} else {
			x.Close(ctx)
		}
	}
}

// TestTwinPrefillBadInput: prompts the executor's Prefill refuses (no
// tokens, a token outside the vocabulary, positions past the model's,
// a negative position) change nothing: the sequence stays empty and
// prefills afterwards as if the refused calls had not been made.
func TestTwinPrefillBadInput(t *testing.T) {
	c := tinyConfig(t)
	m, err := model.NewRandom(c, model.RandomOptions{Seed: 8, Std: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e, x := twinExecutor(t, m, Options{MaxBatch: 2, PrefillChunk: 16})
	id, err := e.Create(plan.Striped)
	if err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"no tokens":         func() error { _, err := x.Prefill(ctx, e, id, nil, 0); return err },
		"token negative":    func() error { _, err := x.Prefill(ctx, e, id, []int{5, -1}, 0); return err },
		"token past":        func() error { _, err := x.Prefill(ctx, e, id, []int{5, c.VocabSize}, 0); return err },
		"positions past":    func() error { _, err := x.Prefill(ctx, e, id, []int{5, 6}, c.MaxPositions-1); return err },
		"position negative": func() error { _, err := x.Prefill(ctx, e, id, []int{5, 6}, -1); return err },
	} {
		if err := call(); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
		if n, err := e.Len(id); err != nil || n != 0 {
			t.Fatalf("%s: the sequence holds %d tokens (%v) after a refused prefill", name, n, err)
		}
	}
	prompt := []int{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}
	got, err := x.Prefill(ctx, e, id, prompt, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _, want := cpuGreedyPrefill(t, m, prompt, 1)
	if d := maxDiff(got, want); d > 1e-4 {
		t.Errorf("after the refused calls the prefill's logits differ from the CPU's by %g", d)
	}
}

// TestTwinSampledMatchesHost: rows sampled on the device (Row.Sample, the
// parameters of seeded model.Samplers) pick, step after step, the token
// that the same sampler picks on the host from the step's logits, with
// two host synchronisations a step (End and the sampling) and a greedy
// row beside them taking its argmax.
func TestTwinSampledMatchesHost(t *testing.T) {
	c := tinyConfig(t)
	m, err := model.NewRandom(c, model.RandomOptions{Seed: 9, Std: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dev := twin(t)
	cfg := engine.ModelConfig(m.Geometry(), testPolicy(), 64)
	cfg.Backend, cfg.DeviceResident = dev, true
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	x, err := New(ctx, dev, m, Options{MaxBatch: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	params := [][2]float64{{0.8, 0.9}, {1.3, 0}, {0, 0}}
	rows := make([]Row, len(params))
	onDev, onHost := make([]*model.Sampler, len(params)), make([]*model.Sampler, len(params))
	for i, p := range params {
		attn, err := model.NewEngineAttention(e, m.Geometry())
		if err != nil {
			t.Fatal(err)
		}
		prompt := []int{5 + i, 6, 7, 8, 9 + 2*i}
		logits, err := m.Forward(ctx, attn, prompt, model.ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, row, _, _ := attn.DecodeRow()
		rows[i] = Row{Seq: row.Seq, Token: model.Argmax(logits), Pos: len(prompt)}
		if onDev[i], err = model.NewSampler(p[0], p[1], uint64(40+i)); err != nil {
			t.Fatal(err)
		}
		onHost[i], _ = model.NewSampler(p[0], p[1], uint64(40+i))
	}
	distinct := map[int]bool{}
	for s := range 30 {
		for i := range rows {
			rows[i].Sample = onDev[i].Params()
		}
		before := dev.Syncs()
		next, err := x.Decode(ctx, e, rows)
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		if n := dev.Syncs() - before; n != 2 {
			t.Fatalf("step %d: %d host synchronisations, want 2", s, n)
		}
		logits, err := x.Logits(ctx, len(rows))
		if err != nil {
			t.Fatal(err)
		}
		for i := range rows {
			l := logits[i*c.VocabSize : (i+1)*c.VocabSize]
			if want := onHost[i].Sample(l); next[i] != want {
				t.Fatalf("step %d row %d (T %v, top-p %v): device sampled %d, the host sampler %d", s, i, params[i][0], params[i][1], next[i], want)
			}
			if i == 1 {
				distinct[next[i]] = true
			}
			rows[i].Token, rows[i].Pos = next[i], rows[i].Pos+1
		}
	}
	if len(distinct) < 5 {
		t.Errorf("the T 1.3 row drew %d distinct tokens in 30 steps: not sampling", len(distinct))
	}
}
