package completion

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/model"
)

// TestMaxBatchedTokens: with a per-iteration budget of 7 tokens, five
// greedy requests of different prompt lengths (one with n = 2), sent at
// once, never make an iteration run more than 7 tokens (decode rows plus
// prompt tokens, as the scheduler reports them), the budget binds (some
// iteration prefills exactly what the decoding rows leave), and each
// choice gets exactly the tokens of the same request run alone.
func TestMaxBatchedTokens(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	name := dir[strings.LastIndex(dir, "/")+1:]
	const budget = 7
	cfg := testConfig(name)
	cfg.Policy.BudgetTokens = 256
	cfg.ChunkTokens = 256
	cfg.MaxRunning = 6
	cfg.MaxBatchedTokens = budget
	cfg.CapacityPages = 1024
	var mu sync.Mutex
	type iter struct{ rows, prompt int }
	var iters []iter
	s, err := newServer(m, tok, cfg, hooks{batched: func(rows, prompt int) {
		mu.Lock()
		iters = append(iters, iter{rows, prompt})
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	rng := rand.New(rand.NewPCG(29, 1))
	lengths := []int{60, 150, 260, 400, 90}
	ns := []int{1, 1, 2, 1, 1}
	prompts := make([]eval.Prompt, len(lengths))
	results := make([]Completion, len(lengths))
	errs := make([]error, len(lengths))
	var wg sync.WaitGroup
	for i, n := range lengths {
		p, err := eval.Passkey(rng, n, eval.PasskeyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		prompts[i] = p
		b, _ := json.Marshal(map[string]any{"model": name, "prompt": p.Text(), "max_tokens": 12 + 2*i, "temperature": 0, "n": ns[i]})
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				errs[i] = fmt.Errorf("status %s", resp.Status)
				return
			}
			errs[i] = json.NewDecoder(resp.Body).Decode(&results[i])
		}()
	}
	wg.Wait()
	for i := range lengths {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		ids := model.PromptIDs(tok, prompts[i].Text())
		want := tok.Decode(alone(t, m, tok, cfg.Policy, ids, 12+2*i))
		if len(results[i].Choices) != ns[i] {
			t.Fatalf("request %d: %d choices, want %d", i, len(results[i].Choices), ns[i])
		}
		for _, c := range results[i].Choices {
			if c.Text != want {
				t.Errorf("request %d choice %d: %q; alone %q", i, c.Index, c.Text, want)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	most, bound, mixed := 0, 0, 0
	for k, it := range iters {
		if it.rows+it.prompt > budget {
			t.Errorf("iteration %d ran %d decode rows and %d prompt tokens: %d, over the budget %d", k, it.rows, it.prompt, it.rows+it.prompt, budget)
		}
		most = max(most, it.rows+it.prompt)
		if it.rows > 0 && it.prompt > 0 {
			mixed++
			if it.rows+it.prompt == budget {
				bound++
			}
		}
	}
	t.Logf("%d iterations, %d with decode rows and prompt tokens (%d of them filling the budget), at most %d tokens", len(iters), mixed, bound, most)
	if most != budget || bound == 0 {
		t.Errorf("no iteration filled the budget beside decoding rows (%d iterations, at most %d tokens)", len(iters), most)
	}
}
