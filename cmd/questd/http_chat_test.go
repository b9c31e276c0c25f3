package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestServeChat: questd --chat-template FILE serves POST
// /v1/chat/completions with it: a chat of the passkey prompt through a
// pass-through template answers the pass key; a template file
// that does not compile stops the start with one error naming the flag,
// and one that is missing too.
func TestServeChat(t *testing.T) {
	v1 := passkeyModel(t)
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "chat.jinja")
	// The byte model knows no chat turns: the template passes the
	// messages' contents through.
	if err := os.WriteFile(tmpl, []byte("{% for m in messages %}{{ m['content'] }}{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--budget-tokens", "512", "--chat-template", tmpl)...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "messages": []any{map[string]any{"role": "user", "content": passkeyTestPrompt}}, "max_tokens": 5, "temperature": 0})
	resp, err := http.Post("http://"+ready["http"]+"/v1/chat/completions", "application/json", strings.NewReader(string(req)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role, Content string
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK || out.Object != "chat.completion" || len(out.Choices) != 1 ||
		out.Choices[0].Message.Role != "assistant" || out.Choices[0].Message.Content != "48213" {
		t.Fatalf("chat: %d %s (%v)", resp.StatusCode, b, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve after the signal: %v", err)
	}

	bad := filepath.Join(dir, "bad.jinja")
	if err := os.WriteFile(bad, []byte("{% for m in messages %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{bad, filepath.Join(dir, "missing.jinja")} {
		cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--chat-template", file)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := serveErr(t, cfg); err == nil || !strings.Contains(err.Error(), "--chat-template") {
			t.Errorf("--chat-template %s: %v, want an error naming the flag", filepath.Base(file), err)
		}
	}
}

// serveErr runs serve for cfg, which must fail before it is ready, and
// returns its error (nil when it ran until the deadline).
func serveErr(t *testing.T, cfg Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := serve(ctx, cfg, slog.New(slog.DiscardHandler), io.Discard, prometheus.NewRegistry(), nil)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
