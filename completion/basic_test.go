package completion

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestCompletionBasic: a greedy completion on the tiny model has
// OpenAI's shape, as many tokens as max_tokens, the extended usage, and
// a stream of the same request carries the same text.
func TestCompletionBasic(t *testing.T) {
	m, tok := tinyModel(t)
	s, ts := startServer(t, m, tok, testConfig("tiny"))
	req := map[string]any{"model": "tiny", "prompt": "Hello, world", "max_tokens": 7, "temperature": 0}
	c := complete(t, ts.URL, req)
	if c.Object != "text_completion" || c.Model != "tiny" || len(c.Choices) != 1 || c.Choices[0].FinishReason == nil || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("completion %+v", c)
	}
	u := c.Usage
	if u == nil || u.PromptTokens != 13 || u.CompletionTokens != 7 || u.TotalTokens != 20 || u.PagesTotal == 0 {
		t.Fatalf("usage %+v", u)
	}
	t.Logf("text %q usage %+v", c.Choices[0].Text, *u)
	req["stream"] = true
	req["stream_options"] = map[string]any{"include_usage": true}
	b, _ := json.Marshal(req)
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: status %d, content type %q", resp.StatusCode, ct)
	}
	text, finish, su := streamText(t, sseEvents(t, resp.Body))
	if text != c.Choices[0].Text || finish != "length" || su == nil || *su != *u {
		t.Fatalf("stream %q %q %+v, want %q length %+v", text, finish, su, c.Choices[0].Text, *u)
	}
	st := s.Stats()
	if st.Admitted != 2 || st.Completed != 2 || st.Running != 0 || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.UsedPages != st.PrefixCachePages {
		t.Fatalf("stats %+v", st)
	}
}

// TestSamplingAndPromptIDs: a seeded sampled completion repeats, and a
// prompt given as token ids (BOS included) completes as its string.
func TestSamplingAndPromptIDs(t *testing.T) {
	m, tok := tinyModel(t)
	_, ts := startServer(t, m, tok, testConfig("tiny"))
	req := map[string]any{"model": "tiny", "prompt": "seeded", "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": 7}
	a, b := complete(t, ts.URL, req), complete(t, ts.URL, req)
	if a.Choices[0].Text != b.Choices[0].Text {
		t.Errorf("seed 7 twice: %q and %q", a.Choices[0].Text, b.Choices[0].Text)
	}
	greedy := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": "seeded", "max_tokens": 12, "temperature": 0})
	ids := complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": []int{256, 's', 'e', 'e', 'd', 'e', 'd'}, "max_tokens": 12, "temperature": 0})
	if greedy.Choices[0].Text != ids.Choices[0].Text || ids.Usage.PromptTokens != 7 {
		t.Errorf("string prompt %q, ids %q (%d prompt tokens)", greedy.Choices[0].Text, ids.Choices[0].Text, ids.Usage.PromptTokens)
	}
}

// TestStopStrings: on passkey-llama-v1, a stop string inside the pass
// key ends the completion before it, with finish_reason stop, streamed
// or not; the usage counts the tokens generated.
func TestStopStrings(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	prompt, key := passkeyPrompt(t, dir)
	_, ts := startServer(t, m, tok, testConfig("v1"))
	req := map[string]any{"model": "v1", "prompt": prompt, "max_tokens": 8, "temperature": 0, "stop": []string{"zz", key[2:4]}}
	c := complete(t, ts.URL, req)
	if got := c.Choices[0]; got.Text != key[:2] || *got.FinishReason != "stop" || c.Usage.CompletionTokens != 4 {
		t.Errorf("stop %q: %q %s after %d tokens, want %q stop after 4", key[2:4], got.Text, *got.FinishReason, c.Usage.CompletionTokens, key[:2])
	}
	req["stream"] = true
	b, _ := json.Marshal(req)
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if text, finish, _ := streamText(t, sseEvents(t, resp.Body)); text != key[:2] || finish != "stop" {
		t.Errorf("streamed with stop: %q %s", text, finish)
	}
}
