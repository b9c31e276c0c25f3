package main

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/serveengine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// TestServeCompletionsFP8: questd --kv-cache-dtype fp8 (--backend cpu,
// --serve-layout local) serves a greedy completion of the passkey
// prompt over fp8 pages: its tokens and log-probabilities are those of
// the in-process engine's own fp8 run of the model (within float
// rounding of the serving path's chunked prefill and forced-dense
// layers), and differ from the f32 run's (the pages are fp8).
func TestServeCompletionsFP8(t *testing.T) {
	v1 := passkeyModel(t)
	ref := passkeyReference(t, v1)
	steps := len(ref.Greedy)
	args := append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--budget-tokens", "256",
		"--kv-cache-dtype", "fp8", "--prefill-chunk-tokens", "4096")
	cfg, err := load(t, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	out := greedyLogprobs(t, ready["http"], ref)
	got := out.Logprobs.TokenLogprobs
	if len(got) != steps || !strings.Contains(out.Text, "48213") {
		t.Fatalf("completion %q with %d log-probabilities, want the pass key in %d tokens", out.Text, len(got), steps)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// The engine's own runs: the served grid (completion's gridSpec) on fp8
	// and on f32 pages, the policy's dense layers planned dense.
	m, err := model.Load(v1, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own := func(dt plan.DType) (toks []int, lps []float64) {
		layers, geo := m.Geometry().Shape()
		pol := cfg.engineConfig().Policy
		geo.PageSize, geo.DType = pol.PageSize, dt
		e, err := serveengine.Engines().New(completion.GridSpec{Layers: layers, Geometry: geo, Policy: pol, CapacityPages: 1024, CP: 1, TP: 1, MemoryLimit: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		a, err := e.NewAttention(context.Background(), m.Geometry())
		if err != nil {
			t.Fatal(err)
		}
		ids := ref.InputIDs
		for range steps {
			logits, err := m.Forward(context.Background(), a, ids, model.ForwardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			id := model.Argmax(logits)
			toks, lps = append(toks, id), append(lps, logSoftmaxAt(logits, id))
			ids = []int{id}
		}
		return toks, lps
	}
	fp8Toks, fp8LP := own(plan.FP8)
	_, f32LP := own(plan.Float32)
	worst, apart := 0.0, 0.0
	for i := range got {
		worst = max(worst, math.Abs(got[i]-fp8LP[i]))
		apart = max(apart, math.Abs(fp8LP[i]-f32LP[i]))
	}
	t.Logf("served fp8 tokens: %q; engine fp8 tokens %v; |served - engine fp8| <= %.3g, |fp8 - f32| up to %.3g", out.Text, fp8Toks, worst, apart)
	if worst > 1e-4 {
		t.Errorf("served log-probabilities %v, the engine's fp8 run %v", got, fp8LP)
	}
	if apart <= 10*worst {
		t.Errorf("fp8 and f32 runs differ by %.3g only: the served pages may not be fp8", apart)
	}
}

// greedyCompletion is a completion's text, tokens and their
// log-probabilities.
type greedyCompletion struct {
	Text     string `json:"text"`
	Logprobs struct {
		Tokens        []string  `json:"tokens"`
		TokenLogprobs []float64 `json:"token_logprobs"`
	} `json:"logprobs"`
}

// greedyLogprobs returns the greedy completion of ref's prompt (its
// continuation's length) that the completions API at addr serves, with
// the log-probabilities of its tokens.
func greedyLogprobs(t *testing.T, addr string, ref passkeyRef) greedyCompletion {
	t.Helper()
	req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": ref.InputIDs, "max_tokens": len(ref.Greedy), "temperature": 0, "logprobs": 0})
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(string(req)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		Choices []greedyCompletion `json:"choices"`
	}
	if err := json.Unmarshal(body, &out); err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) != 1 {
		t.Fatalf("completion: %d %s (%v)", resp.StatusCode, body, err)
	}
	return out.Choices[0]
}

// passkeyRef is a passkey model's reference.json: the prompt's token
// ids and its greedy continuation's.
type passkeyRef struct {
	InputIDs []int `json:"input_ids"`
	Greedy   []int `json:"greedy_continuation_ids"`
}

// passkeyReference reads the reference.json of the model at dir.
func passkeyReference(t *testing.T, dir string) passkeyRef {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref passkeyRef
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

// logSoftmaxAt returns log softmax(logits)[i] in float64.
func logSoftmaxAt(logits []float32, i int) float64 {
	mx := math.Inf(-1)
	for _, x := range logits {
		mx = max(mx, float64(x))
	}
	s := 0.0
	for _, x := range logits {
		s += math.Exp(float64(x) - mx)
	}
	return float64(logits[i]) - mx - math.Log(s)
}
