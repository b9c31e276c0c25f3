package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRequestTimeoutOutcome: with a short --request-timeout a request
// still prefilling at its deadline gets 504 request_timeout whose
// message names the flag and the limit, logs outcome=timeout and counts
// as questrt_serve_requests_total{outcome="timeout"}; a request whose
// client leaves before its deadline logs outcome=cancelled and counts
// as cancelled.
func TestRequestTimeoutOutcome(t *testing.T) {
	v1 := passkeyModel(t)
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--request-timeout", "1s")...)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := serve(ctx, cfg, log, pw, prometheus.NewRegistry(), nil)
		pw.Close()
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	br := bufio.NewReader(pr)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, br)
	var ready map[string]string
	if err := json.Unmarshal([]byte(line), &ready); err != nil {
		t.Fatal(err)
	}
	base := "http://" + ready["http"]
	// A prompt of 4096 token ids takes seconds to prefill on the CPU;
	// each request's differs (no prefix cache hit).
	body := func(first int) string {
		ids := make([]int, 4096)
		for i := range ids {
			ids[i] = 65 + (first+i)%26
		}
		b, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": ids, "max_tokens": 16})
		return string(b)
	}
	// requestLine waits for the log line of the request with id.
	requestLine := func(id string) map[string]any {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			for _, l := range strings.Split(logs.String(), "\n") {
				var rec map[string]any
				if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "request" && (id == "" || rec["id"] == id) {
					return rec
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no request log line for %q in 30 s:\n%s", id, logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	t0 := time.Now()
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body(0)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if took := time.Since(t0); took > 10*time.Second {
		t.Errorf("the 504 came after %v, the limit is 1s", took)
	}
	var e struct {
		Error struct{ Message, Code string }
	}
	json.Unmarshal(b, &e)
	if resp.StatusCode != http.StatusGatewayTimeout || e.Error.Code != "request_timeout" || !strings.Contains(e.Error.Message, "questd --request-timeout 1s") {
		t.Errorf("past --request-timeout: %d %s; want 504 request_timeout naming questd --request-timeout 1s", resp.StatusCode, b)
	}
	if rec := requestLine(""); rec["outcome"] != "timeout" {
		t.Errorf("the timed-out request logged %v, want outcome=timeout", rec)
	}

	logs.mu.Lock()
	logs.b.Reset()
	logs.mu.Unlock()
	cctx, ccancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer ccancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body(1)))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the leaving client got %d", resp.StatusCode)
	}
	if rec := requestLine(""); rec["outcome"] != "cancelled" {
		t.Errorf("the leaving client's request logged %v, want outcome=cancelled", rec)
	}
	mf := scrape(t, ready["metrics"])
	for _, c := range []struct {
		outcome string
		want    float64
	}{{"admitted", 2}, {"timeout", 1}, {"cancelled", 1}, {"completed", 0}, {"failed", 0}} {
		if got := metric(t, mf, "questrt_serve_requests_total", "outcome", c.outcome).GetCounter().GetValue(); got != c.want {
			t.Errorf("questrt_serve_requests_total{outcome=%q} = %v, want %v", c.outcome, got, c.want)
		}
	}
}
