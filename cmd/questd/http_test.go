package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/internal/testmodels"
)

// passkeyModel finds passkey-llama-v1 (testmodels.Dir), or skips.
func passkeyModel(t *testing.T) string {
	t.Helper()
	return filepath.Join(testmodels.Dir(t), "passkey-llama-v1")
}

// passkeyTestPrompt is a short passkey prompt whose greedy continuation
// by passkey-llama-v1 is the pass key, 48213.
const passkeyTestPrompt = "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. " +
	"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " +
	"The pass key is 48213. Remember it. 48213 is the pass key. " +
	"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " +
	"What is the pass key? The pass key is "

// TestServeCompletions: questd --model --http-addr serves the completions
// API next to the node (the ready line names it); a greedy completion of
// a passkey prompt returns the pass key; GET /v1/models lists the model
// under its directory's name; the latency histograms count it, on the
// API's port too (with /health); a signal drains and serve returns nil.
func TestServeCompletions(t *testing.T) {
	v1 := passkeyModel(t)
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0", "--max-running", "4", "--budget-tokens", "512")...)
	if err != nil {
		t.Fatal(err)
	}
	ready, _, stop := runServe(t, cfg)
	if ready["http"] == "" {
		t.Fatalf("ready line %v: want an http address", ready)
	}
	base := "http://" + ready["http"]
	code, body := httpGet(t, base+"/v1/models")
	if code != http.StatusOK || !strings.Contains(body, `"passkey-llama-v1"`) {
		t.Errorf("/v1/models: %d %s", code, body)
	}
	req, _ := json.Marshal(map[string]any{"model": "passkey-llama-v1", "prompt": passkeyTestPrompt, "max_tokens": 5, "temperature": 0})
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(req)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
			PagesRead        int `json:"pages_read"`
			PagesTotal       int `json:"pages_total"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) != 1 || out.Choices[0].Text != "48213" {
		t.Fatalf("completion: %d %s (%v)", resp.StatusCode, b, err)
	}
	if out.Usage.CompletionTokens != 5 || out.Usage.PagesTotal == 0 {
		t.Errorf("usage %+v", out.Usage)
	}
	// The API's counters on /metrics: one request admitted and
	// completed, its 5 tokens, nothing running or queued any more.
	mf := scrape(t, ready["metrics"])
	for _, c := range []struct {
		name, label, value string
		want               float64
	}{
		{"questrt_serve_requests_total", "outcome", "admitted", 1},
		{"questrt_serve_requests_total", "outcome", "completed", 1},
		{"questrt_serve_requests_total", "outcome", "failed", 0},
		{"questrt_serve_tokens_total", "kind", "completion", 5},
		{"questrt_request_retries_total", "reason", "grid_lost", 0},
		{"questrt_serve_pages_read_total", "kind", "read", float64(out.Usage.PagesRead)},
		{"questrt_serve_pages_read_total", "kind", "dense", float64(out.Usage.PagesTotal)},
	} {
		if got := metric(t, mf, c.name, c.label, c.value).GetCounter().GetValue(); got != c.want {
			t.Errorf("%s{%s=%q} = %v, want %v", c.name, c.label, c.value, got, c.want)
		}
	}
	if got := metric(t, mf, "questrt_serve_requests", "state", "running").GetGauge().GetValue(); got != 0 {
		t.Errorf("questrt_serve_requests{state=running} = %v after the request, want 0", got)
	}
	if got := metric(t, mf, "questrt_serve_tokens_total", "kind", "prompt").GetCounter().GetValue(); got < 50 {
		t.Errorf("questrt_serve_tokens_total{kind=prompt} = %v, want the prompt's tokens", got)
	}
	// The latency histograms, by model name, on the API's port too
	// (with /health): one first token, 4 gaps between the 5 tokens, one
	// request ended and queued.
	// (The observer runs just after the answer went out: wait for it.)
	api := scrape(t, ready["http"])
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if f, ok := api["questrt_serve_e2e_request_latency_seconds"]; ok && len(f.GetMetric()) > 0 {
			break
		}
		api = scrape(t, ready["http"])
	}
	for _, c := range []struct {
		name string
		want uint64
	}{
		{"questrt_serve_time_to_first_token_seconds", 1},
		{"questrt_serve_inter_token_latency_seconds", 4},
		{"questrt_serve_e2e_request_latency_seconds", 1},
		{"questrt_serve_request_queue_time_seconds", 1},
	} {
		h := metric(t, api, c.name, "model_name", "passkey-llama-v1").GetHistogram()
		if h.GetSampleCount() != c.want || h.GetSampleSum() <= 0 {
			t.Errorf("%s on the API port: %d samples (sum %v), want %d", c.name, h.GetSampleCount(), h.GetSampleSum(), c.want)
		}
	}
	if code, _ := httpGet(t, base+"/health"); code != http.StatusOK {
		t.Errorf("/health on the API port: %d", code)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve after the signal: %v", err)
	}
}

// TestServeCompletionsFlags: --model and --http-addr need each other, and
// the caps are checked with the flag named.
func TestServeCompletionsFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "/m"}, "--model"},
		{[]string{"--http-addr", "127.0.0.1:0"}, "--http-addr"},
		{[]string{"--model", "/m", "--http-addr", "nohost"}, "--http-addr"},
		{[]string{"--max-running", "0"}, "--max-running"},
		{[]string{"--max-queued", "-1"}, "--max-queued"},
		{[]string{"--prefill-chunk-tokens", "0"}, "--prefill-chunk-tokens"},
		{[]string{"--max-batched-tokens", "-1"}, "--max-batched-tokens"},
		{[]string{"--max-batched-tokens", "15"}, "--max-batched-tokens"},
		{[]string{"--max-running", "32", "--max-batched-tokens", "31"}, "--max-batched-tokens"},
		{[]string{"--max-batched-tokens", "many"}, "--max-batched-tokens"},
		{[]string{"--serve-capacity-pages", "-1"}, "--serve-capacity-pages"},
		{[]string{"--serve-memory-fraction", "0.99"}, "--serve-memory-fraction"},
		{[]string{"--default-max-tokens", "0"}, "--default-max-tokens"},
		{[]string{"--default-max-tokens", "-2"}, "--default-max-tokens"},
		{[]string{"--default-max-tokens", "500", "--max-model-len", "400"}, "--default-max-tokens"},
		{[]string{"--serve-memory-fraction", "0"}, "--serve-memory-fraction"},
		{[]string{"--gpu-memory-utilization", "0"}, "--gpu-memory-utilization"},
		{[]string{"--gpu-memory-utilization", "1.01"}, "--gpu-memory-utilization"},
		{[]string{"--prefix-cache-pages", "-1"}, "--prefix-cache-pages"},
		{[]string{"--serve-layout", "cluster", "--model", "/m", "--http-addr", "127.0.0.1:0", "--serve-capacity-pages", "4096", "--prefix-cache-pages", "4097"}, "--prefix-cache-pages"},
		{[]string{"--serve-capacity-pages", "64", "--prefix-cache-pages", "65"}, "--prefix-cache-pages"},
		{[]string{"--prefix-caching=maybe"}, "prefix-caching"},
		{[]string{"--max-model-len", "-1"}, "--max-model-len"},
		{[]string{"--max-request-bytes", "0"}, "--max-request-bytes"},
		{[]string{"--max-request-bytes", "2000000000"}, "--max-request-bytes"},
		{[]string{"--request-timeout", "-1s"}, "--request-timeout"},
		{[]string{"--sse-keepalive", "-1s"}, "--sse-keepalive"},
		{[]string{"--sse-keepalive", "1ns"}, "--sse-keepalive"},
		{[]string{"--log-stats-interval", "-1s"}, "--log-stats-interval"},
		{[]string{"--log-stats-interval", "500ms"}, "--log-stats-interval"},
		{[]string{"--cp", "100000"}, "--cp"},
		{[]string{"--layers", "1000000000"}, "--layers"},
		{[]string{"--head-dim", "1000000000"}, "--head-dim"},
		{[]string{"--suspicion-mult", "1000000000"}, "--suspicion-mult"},
		{[]string{"--page-size", "100000"}, "--page-size"},
	} {
		_, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// TestPrefixCachingFlags: prefix caching is on by default, unbounded
// but by the pool; --prefix-caching=false turns it off and
// --prefix-cache-pages bounds it, both reaching the server's config.
func TestPrefixCachingFlags(t *testing.T) {
	for _, c := range []struct {
		args  []string
		on    bool
		pages int
	}{
		{nil, true, 0},
		{[]string{"--prefix-caching=false"}, false, 0},
		{[]string{"--prefix-cache-pages", "100"}, true, 100},
		{[]string{"--serve-capacity-pages", "64", "--prefix-cache-pages", "64"}, true, 64},
	} {
		cfg, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		sc := cfg.serveConfig(nil)
		if sc.PrefixCaching != c.on || sc.PrefixCachePages != c.pages {
			t.Errorf("%v: caching %t, %d pages; want %t, %d", c.args, sc.PrefixCaching, sc.PrefixCachePages, c.on, c.pages)
		}
		if err := sc.Validate(); err != nil {
			t.Errorf("%v: the server's config: %v", c.args, err)
		}
	}
}

// TestServeLimits: --max-model-len bounds a request's prompt plus
// max_tokens (400 context_length_exceeded naming the bound),
// --max-request-bytes its body (413), and /v1/models reports the bound.
func TestServeLimits(t *testing.T) {
	v1 := passkeyModel(t)
	cfg, err := load(t, nil, append(append([]string(nil), smallNode...), "--model", v1, "--http-addr", "127.0.0.1:0",
		"--max-model-len", "300", "--max-request-bytes", "2000", "--request-timeout", "1m")...)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Serve.RequestTimeout != time.Minute {
		t.Fatalf("--request-timeout 1m read as %v", cfg.Serve.RequestTimeout)
	}
	ready, _, stop := runServe(t, cfg)
	base := "http://" + ready["http"]
	post := func(body string) (int, string) {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	long := strings.Repeat("a", 250)
	if code, body := post(`{"model": "passkey-llama-v1", "prompt": "` + long + `", "max_tokens": 100}`); code != 400 || !strings.Contains(body, "context_length_exceeded") || !strings.Contains(body, "300") {
		t.Errorf("prompt + max_tokens past --max-model-len: %d %s", code, body)
	}
	if code, body := post(`{"model": "passkey-llama-v1", "prompt": "` + long + `", "max_tokens": 10, "temperature": 0}`); code != 200 {
		t.Errorf("within --max-model-len: %d %s", code, body)
	}
	if code, body := post(`{"model": "passkey-llama-v1", "prompt": "` + strings.Repeat("a", 2100) + `"}`); code != 413 || !strings.Contains(body, "2000") {
		t.Errorf("a body past --max-request-bytes: %d %s", code, body)
	}
	if code, body := httpGet(t, base+"/v1/models"); code != 200 || !strings.Contains(body, `"max_model_len":300`) {
		t.Errorf("/v1/models: %d %s", code, body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestMaxITLFactorFlag: --max-itl-factor reaches the server's config
// (2 by default, 0 off, fractions kept), and a value outside 0 or
// 1..100 is refused in one line naming the flag, with no server config
// to build.
func TestMaxITLFactorFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want float64
	}{
		{nil, 2},
		{[]string{"--max-itl-factor", "0"}, 0},
		{[]string{"--max-itl-factor", "1"}, 1},
		{[]string{"--max-itl-factor", "3.5"}, 3.5},
		{[]string{"--max-itl-factor", "100", "--max-batched-tokens", "64"}, 100},
	} {
		cfg, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		sc := cfg.serveConfig(nil)
		if sc.MaxITLFactor != c.want {
			t.Errorf("%v: max ITL factor %v, want %v", c.args, sc.MaxITLFactor, c.want)
		}
		if err := sc.Validate(); err != nil {
			t.Errorf("%v: the server config is refused: %v", c.args, err)
		}
	}
	_, err := load(t, nil, "--insecure", "--max-itl-factor", "0.9")
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--max-itl-factor") {
		t.Errorf("--max-itl-factor 0.9: %v, want one line naming the flag", err)
	}
}

// TestMaxBatchedTokensFlag: --max-batched-tokens reaches the server's
// config (0 by default: the chunk plus --max-running), and a bad value
// is refused in one line naming the flag and the bound.
func TestMaxBatchedTokensFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 0},
		{[]string{"--max-batched-tokens", "16"}, 16},
		{[]string{"--max-running", "4", "--max-batched-tokens", "4"}, 4},
	} {
		cfg, err := load(t, nil, append([]string{"--insecure"}, c.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := cfg.serveConfig(nil).MaxBatchedTokens; got != c.want {
			t.Errorf("%v: max batched tokens %d, want %d", c.args, got, c.want)
		}
	}
	_, err := load(t, nil, "--insecure", "--max-running", "32", "--max-batched-tokens", "31")
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--max-batched-tokens") || !strings.Contains(err.Error(), "--max-running 32") {
		t.Errorf("--max-batched-tokens 31 with --max-running 32: %v, want one line naming both flags", err)
	}
}
