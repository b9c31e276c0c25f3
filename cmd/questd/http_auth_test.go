package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeCompletionsToken: with --token-file the completions API wants
// "Authorization: Bearer <token>" on every endpoint but /health (as the
// gRPC client API does; /metrics on the API port too): without it, or
// with another token, 401 in OpenAI's error
// shape (code invalid_api_key) and nothing served; with it, the model
// list and a completion of the passkey prompt as without a token.
func TestServeCompletionsToken(t *testing.T) {
	v1 := passkeyModel(t)
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--budget-tokens", "512", "--token-file", tok)...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	base := "http://" + ready["http"]
	do := func(method, path, auth, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		req.Header.Set("Content-Type", "application/json")
		c := &http.Client{Timeout: 30 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	prompt, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "max_tokens": 5, "temperature": 0,
		"prompt": "The grass is green. The pass key is 48213. Remember it. 48213 is the pass key. The sky is blue. What is the pass key? The pass key is "})
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/models", ""},
		{http.MethodPost, "/v1/completions", string(prompt)},
		{http.MethodGet, "/admin/requests", ""},
		{http.MethodGet, "/metrics", ""},
		{http.MethodPost, "/v1/chat/completions", `{"model": "passkey-llama-v1", "messages": [{"role": "user", "content": "x"}]}`},
		{http.MethodPost, "/tokenize", `{"model": "passkey-llama-v1", "prompt": "x"}`},
	} {
		for _, auth := range []string{"", "Bearer wrong", "s3cret-token", "Basic s3cret-token"} {
			code, body := do(c.method, c.path, auth, c.body)
			var e struct {
				Error struct{ Code, Type string } `json:"error"`
			}
			if code != http.StatusUnauthorized || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != "invalid_api_key" {
				t.Errorf("%s %s with Authorization %q: %d %s, want 401 invalid_api_key", c.method, c.path, auth, code, body)
			}
		}
	}
	if code, body := do(http.MethodGet, "/v1/models", "Bearer s3cret-token", ""); code != http.StatusOK || !strings.Contains(body, "passkey-llama-v1") {
		t.Errorf("/v1/models with the token: %d %s", code, body)
	}
	// A load balancer's probe needs no token; the metrics need it.
	if code, body := do(http.MethodGet, "/health", "", ""); code != http.StatusOK {
		t.Errorf("/health without the token: %d %s", code, body)
	}
	if code, body := do(http.MethodGet, "/metrics", "Bearer s3cret-token", ""); code != http.StatusOK || !strings.Contains(body, "questrt_serve_requests") {
		t.Errorf("/metrics with the token: %d %.200s", code, body)
	}
	code, body := do(http.MethodPost, "/v1/completions", "Bearer s3cret-token", string(prompt))
	if code != http.StatusOK || !strings.Contains(body, `"object":"text_completion"`) {
		t.Errorf("completion with the token: %d %s", code, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve after the signal: %v", err)
	}
}
