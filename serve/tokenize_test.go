package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/questrt/questrt/model"
)

// TestTokenize: POST /tokenize gives a prompt's ids as a completion
// prefills them (the byte tokenizer's BOS, 256, first; without it under
// add_special_tokens false), a chat's as the chat template renders them,
// and max_model_len; /detokenize inverts it; bad bodies get 400 naming
// the field, an unknown model 404; nothing is admitted.
func TestTokenize(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.ChatTemplate = passThrough(t)
	s, ts := startServer(t, m, tok, cfg)
	var tr TokenizeResponse
	status, _, body := post(t, ts.URL+"/tokenize", `{"model": "tiny", "prompt": "héllo"}`)
	if err := json.Unmarshal(body, &tr); err != nil || status != 200 {
		t.Fatalf("tokenize: %d %s", status, body)
	}
	want := model.PromptIDs(tok, "héllo")
	if !slices.Equal(tr.Tokens, want) || tr.Count != len(want) || tr.Tokens[0] != model.ByteBOS || tr.Count != 7 || tr.MaxModelLen != m.Config.MaxPositions {
		t.Errorf("tokenize: %+v, want %v (BOS and 6 bytes), max_model_len %d (the model's)", tr, want, m.Config.MaxPositions)
	}
	status, _, body = post(t, ts.URL+"/tokenize", `{"model": "tiny", "prompt": "héllo", "add_special_tokens": false}`)
	if err := json.Unmarshal(body, &tr); err != nil || status != 200 || !slices.Equal(tr.Tokens, want[1:]) {
		t.Errorf("tokenize without special tokens: %d %s", status, body)
	}
	status, _, body = post(t, ts.URL+"/tokenize", `{"model": "tiny", "messages": [{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]}`)
	if err := json.Unmarshal(body, &tr); err != nil || status != 200 || !slices.Equal(tr.Tokens, []int{model.ByteBOS, 'a', 'b', 'c'}) {
		t.Errorf("tokenize messages: %d %s", status, body)
	}
	ids, _ := json.Marshal(map[string]any{"model": "tiny", "tokens": want})
	var dr DetokenizeResponse
	status, _, body = post(t, ts.URL+"/detokenize", string(ids))
	if err := json.Unmarshal(body, &dr); err != nil || status != 200 || dr.Prompt != "héllo" {
		t.Errorf("detokenize: %d %s", status, body)
	}
	for _, c := range []struct {
		path, body, param string
		status            int
	}{
		{"/tokenize", `{"model": "tiny"}`, "prompt", 400},
		{"/tokenize", `{"model": "tiny", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}`, "prompt", 400},
		{"/tokenize", `{"model": "tiny", "prompt": 5}`, "prompt", 400},
		{"/tokenize", `{"model": "tiny", "prompt": "a", "truncate": 3}`, "truncate", 400},
		{"/tokenize", `{"model": "other", "prompt": "a"}`, "model", 404},
		{"/detokenize", `{"model": "tiny"}`, "tokens", 400},
		{"/detokenize", `{"model": "tiny", "tokens": "abc"}`, "tokens", 400},
		{"/detokenize", `{"model": "tiny", "tokens": [1, 100000]}`, "tokens", 400},
		{"/detokenize", `{"tokens": [1]}`, "model", 400},
	} {
		status, _, body := post(t, ts.URL+c.path, c.body)
		var e ErrorBody
		if err := json.Unmarshal(body, &e); err != nil || status != c.status || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s %s: %d %s, want %d naming %s", c.path, c.body, status, body, c.status, c.param)
		}
	}
	if code := getStatus(t, ts.URL+"/tokenize"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /tokenize: %d, want 405", code)
	}
	unchanged(t, s, 0)
}

// getStatus GETs url and returns the status (the body read and closed).
func getStatus(t testing.TB, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}
