package completion

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// alone generates a request's completion the way questctl generate
// does, on an engine of its own: the policy's dense layers and selector
// in the engine's policy, one-shot prefill, Model.Generate.
func alone(t *testing.T, m *model.Model, tok model.Tokenizer, pol plan.Policy, ids []int, maxTokens int) []int {
	t.Helper()
	pages := (len(ids) + maxTokens + pol.PageSize - 1) / pol.PageSize
	e, err := engine.New(engine.ModelConfig(m.Geometry(), pol, pages+2))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	attn, err := model.NewEngineAttention(e, m.Geometry())
	if err != nil {
		t.Fatal(err)
	}
	out, err := m.Generate(context.Background(), attn, ids, model.GenerateOptions{MaxTokens: maxTokens, StopTokens: model.StopIDs(tok, m.Config)})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBatchingMatchesAlone: eight greedy requests of different prompt
// lengths (200 to 2400 bytes, prefilled in chunks of 256 between decode
// steps) and quest settings, sent at once, each get exactly the tokens
// of the same request run alone through Model.Generate on its own
// engine.
func TestBatchingMatchesAlone(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	name := dir[strings.LastIndex(dir, "/")+1:]
	cfg := testConfig(name)
	cfg.Policy.BudgetTokens = 256
	cfg.ChunkTokens = 256
	cfg.MaxRunning = 8
	cfg.CapacityPages = 2048
	s, ts := startServer(t, m, tok, cfg)
	rng := rand.New(rand.NewPCG(9, 9))
	lengths := []int{200, 450, 700, 1000, 1300, 1600, 2000, 2400}
	quests := []map[string]any{nil, {"budget": 128}, {"dense_layers": 0}, {"selector": "dense"}, nil, {"budget": 512, "dense_layers": 4}, {"budget": 64, "dense_layers": 1}, nil}
	type result struct {
		c   Completion
		err string
	}
	results := make([]result, len(lengths))
	prompts := make([]eval.Prompt, len(lengths))
	var wg sync.WaitGroup
	for i, n := range lengths {
		p, err := eval.Passkey(rng, n, eval.PasskeyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		prompts[i] = p
		req := map[string]any{"model": name, "prompt": p.Text(), "max_tokens": 20 + 3*i, "temperature": 0}
		if quests[i] != nil {
			req["quest"] = quests[i]
		}
		b, _ := json.Marshal(req)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
			if err != nil {
				results[i].err = err.Error()
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				results[i].err = resp.Status
				return
			}
			if err := json.NewDecoder(resp.Body).Decode(&results[i].c); err != nil {
				results[i].err = err.Error()
			}
		}()
	}
	wg.Wait()
	right := 0
	for i, n := range lengths {
		if results[i].err != "" {
			t.Fatalf("request %d: %s", i, results[i].err)
		}
		pol := cfg.Policy
		if q := quests[i]; q != nil {
			if b, ok := q["budget"].(int); ok {
				pol.BudgetTokens = b
			}
			if d, ok := q["dense_layers"].(int); ok {
				pol.DenseLayers = d
			}
			if q["selector"] == "dense" {
				pol.Selector = plan.Dense
			}
		}
		ids := model.PromptIDs(tok, prompts[i].Text())
		want := alone(t, m, tok, pol, ids, 20+3*i)
		c := results[i].c
		wantText := tok.Decode(want)
		wantFinish := "length"
		if slices.Contains(model.StopIDs(tok, m.Config), want[len(want)-1]) {
			wantFinish = "stop"
		}
		if got := c.Choices[0]; got.Text != wantText || *got.FinishReason != wantFinish || c.Usage.CompletionTokens != len(want) || c.Usage.PromptTokens != len(ids) {
			t.Errorf("request %d (%d bytes, quest %v): %q %s, %d tokens; alone %q %s, %d tokens",
				i, n, quests[i], got.Text, *got.FinishReason, c.Usage.CompletionTokens, wantText, wantFinish, len(want))
		}
		if strings.HasPrefix(c.Choices[0].Text, prompts[i].Answer) {
			right++
		}
		u := c.Usage
		t.Logf("request %d: %d prompt tokens, quest %v: %q (answer %s), pages %d/%d, rho %.3f", i, u.PromptTokens, quests[i], c.Choices[0].Text, prompts[i].Answer, u.PagesRead, u.PagesTotal, u.BytesReadVsDense)
	}
	st := s.Stats()
	t.Logf("%d of %d passkeys right; %d decode steps of %.2f sequences on average, %d prefill chunks", right, len(lengths), st.Steps, float64(st.StepSequences)/float64(st.Steps), st.PrefillChunks)
	if st.StepSequences <= st.Steps {
		t.Errorf("no decode step ran more than one sequence: %+v", st)
	}
	unchanged(t, s, uint64(len(lengths)))
}

// TestPrefillInterleaves: while a long prompt is prefilled in chunks,
// a request already decoding keeps getting a token every iteration.
func TestPrefillInterleaves(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.ChunkTokens = 64
	s, ts := startServer(t, m, tok, cfg)
	body, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "short", "max_tokens": 3000, "temperature": 0, "stream": true})
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil { // the first token is out
		t.Fatal(err)
	}
	before := s.Stats()
	long := strings.Repeat("The grass is green. ", 100) // 2001 tokens: 32 chunks of 64
	c := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": long, "max_tokens": 1, "temperature": 0})
	after := s.Stats()
	chunks := after.PrefillChunks - before.PrefillChunks
	steps := after.Steps - before.Steps
	if c.Usage.PromptTokens != 2001 || chunks != 32 || steps < chunks-1 {
		t.Fatalf("a 2001-token prefill ran in %d chunks beside %d decode steps of the other request, want 32 chunks and as many steps", chunks, steps)
	}
	t.Logf("%d prefill chunks, %d decode steps meanwhile", chunks, steps)
	resp.Body.Close()
	waitStats(t, s, "the stream cancelled", func(st Stats) bool { return st.Running == 0 })
}
