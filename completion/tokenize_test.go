package completion

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
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
		{"/tokenize", `{"model": "tiny", "prompt": "a", "return_token_strs": 1}`, "return_token_strs", 400},
		{"/tokenize", `{"model": "other", "prompt": "a"}`, "model", 404},
		{"/detokenize", `{"model": "tiny"}`, "tokens", 400},
		{"/detokenize", `{"model": "tiny", "tokens": "abc"}`, "tokens", 400},
		{"/detokenize", `{"model": "tiny", "tokens": [1, 100000]}`, "tokens", 400},
		{"/detokenize", `{"model": "tiny2", "tokens": [1]}`, "model", 404},
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

// TestModelOptional: as vLLM's (and llama.cpp's server), every endpoint
// takes a request without a model (or with an empty one) as one for the
// server's model: a completion, a chat, /tokenize and /detokenize answer
// as they do with the model named. /tokenize's return_token_strs gives
// one text a token, which join into the prompt (after BOS's empty text);
// unknown fields of /tokenize and /detokenize are ignored and named in
// X-Questrt-Ignored-Fields, as a completion's.
func TestModelOptional(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.ChatTemplate = passThrough(t)
	cfg.PrefixCaching = false // the same usage each time
	s, ts := startServer(t, m, tok, cfg)
	for _, c := range []struct{ path, named string }{
		{"/v1/completions", `"prompt": "Any model will do", "max_tokens": 4, "temperature": 0`},
		{"/v1/chat/completions", `"messages": [{"role": "user", "content": "Any model will do"}], "max_tokens": 4, "temperature": 0`},
		{"/tokenize", `"prompt": "Any model will do"`},
		{"/detokenize", `"tokens": [65, 110, 121]`},
	} {
		status, _, want := post(t, ts.URL+c.path, `{"model": "tiny", `+c.named+`}`)
		if status != http.StatusOK {
			t.Fatalf("%s with the model: %d %s", c.path, status, want)
		}
		for _, body := range []string{`{` + c.named + `}`, `{"model": "", ` + c.named + `}`} {
			status, _, got := post(t, ts.URL+c.path, body)
			if status != http.StatusOK || !sameAnswer(t, got, want) {
				t.Errorf("%s %s: %d %s; want %s", c.path, body, status, got, want)
			}
		}
	}
	status, h, body := post(t, ts.URL+"/tokenize", `{"prompt": "ab c", "return_token_strs": true, "truncation": true}`)
	var tr TokenizeResponse
	if err := json.Unmarshal(body, &tr); err != nil || status != http.StatusOK {
		t.Fatalf("tokenize with return_token_strs: %d %s", status, body)
	}
	if len(tr.TokenStrs) != tr.Count || tr.TokenStrs[0] != "" || strings.Join(tr.TokenStrs, "") != "ab c" || h.Get(IgnoredFieldsHeader) != "truncation" {
		t.Errorf("tokenize with return_token_strs: %s, ignored %q; want one text a token joining into \"ab c\", truncation ignored", body, h.Get(IgnoredFieldsHeader))
	}
	status, _, body = post(t, ts.URL+"/tokenize", `{"prompt": "ab c"}`)
	if !strings.Contains(string(body), `"token_strs":null`) || status != http.StatusOK {
		t.Errorf("tokenize without return_token_strs: %d %s; want token_strs null", status, body)
	}
	status, h, body = post(t, ts.URL+"/detokenize", `{"tokens": [97], "skip_special_tokens": true}`)
	if status != http.StatusOK || !strings.Contains(string(body), `"prompt":"a"`) || h.Get(IgnoredFieldsHeader) != "skip_special_tokens" {
		t.Errorf("detokenize with an unknown field: %d %s, ignored %q", status, body, h.Get(IgnoredFieldsHeader))
	}
	unchanged(t, s, 6)
}

// sameAnswer says whether two JSON answers are equal but for their ids
// and creation times.
func sameAnswer(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y map[string]any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		t.Fatalf("answers %s, %s: not JSON objects", a, b)
	}
	for _, k := range []string{"id", "created"} {
		delete(x, k)
		delete(y, k)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
