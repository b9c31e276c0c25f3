package completion

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDefaultMaxTokens: a request without max_tokens generates 16
// tokens by default (finish_reason "length"); with DefaultMaxTokens
// RestOfContext (vLLM's default) it generates the rest of the context
// after its prompt (after the longest prompt of a batch), and a prompt
// that fills the context gets 400 context_length_exceeded; the request
// reserves those pages (it runs with its whole context reserved).
func TestDefaultMaxTokens(t *testing.T) {
	m, tok := tinyModel(t) // its greedy decode never ends on EOS
	ids := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 'a' + i%26
		}
		return out
	}
	_, ts := startServer(t, m, tok, testConfig("tiny"))
	c := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": ids(10), "temperature": 0})
	if c.Usage.CompletionTokens != 16 || *c.Choices[0].FinishReason != "length" {
		t.Errorf("default: %d tokens (%s), want 16 (length)", c.Usage.CompletionTokens, *c.Choices[0].FinishReason)
	}

	const maxLen = 100
	cfg := testConfig("tiny")
	cfg.DefaultMaxTokens, cfg.MaxContext = RestOfContext, maxLen
	_, ts = startServer(t, m, tok, cfg)
	for _, n := range []int{1, 10, 99} {
		c := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": ids(n), "temperature": 0})
		if c.Usage.PromptTokens != n || c.Usage.CompletionTokens != maxLen-n || *c.Choices[0].FinishReason != "length" {
			t.Errorf("rest of the context after %d prompt tokens: usage %+v (%s), want %d tokens (length)", n, c.Usage, *c.Choices[0].FinishReason, maxLen-n)
		}
	}
	// A batch: the rest after its longest prompt, for every choice.
	c = complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": [][]int{ids(10), ids(40)}, "temperature": 0})
	if len(c.Choices) != 2 || c.Usage.CompletionTokens != 2*(maxLen-40) {
		t.Errorf("batch of 10 and 40 tokens: usage %+v, want %d tokens each", c.Usage, maxLen-40)
	}
	// An explicit max_tokens is used as given.
	c = complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": ids(10), "max_tokens": 3, "temperature": 0})
	if c.Usage.CompletionTokens != 3 {
		t.Errorf("max_tokens 3: %d tokens", c.Usage.CompletionTokens)
	}
	b, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": ids(maxLen)})
	status, _, body := post(t, ts.URL+"/v1/completions", string(b))
	checkError(t, "a prompt filling the context", status, body, 400, typeInvalid, "prompt", "context_length_exceeded")

	// The rest of the context needs a bound.
	cfg.MaxContext = 0
	m2, tok2 := loadModel(t, writeTinyModel(t, "unbounded", 0))
	if _, err := New(m2, tok2, cfg); err == nil || !strings.Contains(err.Error(), "--max-model-len") {
		t.Errorf("RestOfContext without a context bound: %v, want an error naming --max-model-len", err)
	}
}
