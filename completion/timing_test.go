package completion

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestObserve: Config.Observe gets each admitted request's timing once,
// at its end: a completion of 5 tokens has a first token, 4 gaps between
// tokens, a queue time before its first token and a total past the last
// token; a chat request says so; a request whose client leaves is
// cancelled. GET /health answers 200 while the server admits requests and
// 503 once it drains.
func TestObserve(t *testing.T) {
	m, tok, mdir := passkeyModel(t)
	name := filepath.Base(mdir)
	var mu sync.Mutex
	var got []RequestTiming
	cfg := testConfig(name)
	cfg.ChatTemplate = passThrough(t)
	cfg.Observe = func(rt RequestTiming) {
		mu.Lock()
		got = append(got, rt)
		mu.Unlock()
	}
	s, ts := startServer(t, m, tok, cfg)
	if code := getStatus(t, ts.URL+"/health"); code != http.StatusOK {
		t.Fatalf("/health while serving: %d", code)
	}
	prompt, _ := passkeyPrompt(t, mdir)
	t0 := time.Now()
	c := complete(t, ts.URL, map[string]any{"model": name, "prompt": prompt, "max_tokens": 5, "temperature": 0})
	wall := time.Since(t0)
	b, _ := json.Marshal(map[string]any{"model": name, "messages": []any{map[string]any{"role": "user", "content": prompt}}, "max_tokens": 2, "temperature": 0})
	if status, _, body := post(t, ts.URL+"/v1/chat/completions", string(b)); status != 200 {
		t.Fatalf("chat: %d %s", status, body)
	}
	// A client that leaves while its long request runs: a prompt that
	// shares no page with the ones before (the prefix cache would serve
	// them) and takes longer to prefill than the client waits.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	b, _ = json.Marshal(map[string]any{"model": name, "prompt": "Q" + strings.Repeat(prompt, 3), "max_tokens": 1000, "temperature": 0})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		bb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("the leaving client got %d %s", resp.StatusCode, bb)
	}
	// Observe runs after the answer: wait for the third.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("observed %d requests, want 3: %+v", len(got), got)
	}
	first := got[0]
	var gaps time.Duration
	for _, d := range first.InterToken {
		gaps += d
	}
	switch {
	case first.ID != c.ID || first.Chat || first.Outcome != "completed" || first.Finish != "length" || first.Usage != *c.Usage:
		t.Errorf("completion observed as %+v, want id %s, completed, length, usage %+v", first, c.ID, *c.Usage)
	case first.FirstToken <= 0 || len(first.InterToken) != 4 || first.Queue > first.FirstToken:
		t.Errorf("completion timing: queue %v, first token %v, %d gaps, want queue <= first token and 4 gaps", first.Queue, first.FirstToken, len(first.InterToken))
	case first.Total < first.FirstToken+gaps || first.Total > wall:
		t.Errorf("completion total %v: not between first token + gaps (%v) and the client's wall time %v", first.Total, first.FirstToken+gaps, wall)
	}
	if ch := got[1]; !ch.Chat || !strings.HasPrefix(ch.ID, "chatcmpl-") || ch.Outcome != "completed" || len(ch.InterToken) != 1 {
		t.Errorf("chat observed as %+v", ch)
	}
	if gone := got[2]; gone.Outcome != "cancelled" || gone.Usage.CompletionTokens >= 1000 {
		t.Errorf("the leaving client's request observed as %+v, want cancelled", gone)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	if err := s.Drain(dctx); err != nil {
		t.Fatal(err)
	}
	if code := getStatus(t, ts.URL+"/health"); code != http.StatusServiceUnavailable {
		t.Errorf("/health while draining: %d, want 503", code)
	}
}
