package main

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/serveengine"
	"github.com/questrt/questrt/model"
)

// TestBenchServeBadFlags: every bad setting exits 2 with one line on
// stderr that names its flag, before any request is sent (the address is
// a closed port: a run that got past the flags would fail with exit 1).
func TestBenchServeBadFlags(t *testing.T) {
	addr := closedAddr(t)
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{}, "--addr is required"},
		{[]string{"--addr", "localhost"}, "--addr"},
		{[]string{"--addr", ":8000"}, "--addr"},
		{[]string{"--addr", "host:port"}, "--addr"},
		{[]string{"--addr", addr, "--concurrency", "0"}, "--concurrency"},
		{[]string{"--addr", addr, "--concurrency", "1,x"}, "--concurrency"},
		{[]string{"--addr", addr, "--concurrency", "2000"}, "--concurrency"},
		{[]string{"--addr", addr, "--prompt-len", "10"}, "--prompt-len"},
		{[]string{"--addr", addr, "--prompt-len", "x"}, "--prompt-len"},
		{[]string{"--addr", addr, "--max-tokens", "0"}, "--max-tokens"},
		{[]string{"--addr", addr, "--requests", "-1"}, "--requests"},
		{[]string{"--addr", addr, "--warmup", "-1"}, "--warmup"},
		{[]string{"--addr", addr, "--warmup", "101"}, "--warmup"},
		{[]string{"--addr", addr, "--selector", "oracle"}, "--selector"},
		{[]string{"--addr", addr, "--selector", "quest,quest"}, "--selector"},
		{[]string{"--addr", addr, "--selector", "quest,"}, "--selector"},
		{[]string{"--addr", addr, "--budget", "-16"}, "--budget"},
		{[]string{"--addr", addr, "--background-prompt-len", "8"}, "--background-prompt-len"},
		{[]string{"--addr", addr, "--timeout", "0s"}, "--timeout"},
		{[]string{"--addr", addr, "--shared-prefix-len", "8"}, "--shared-prefix-len"},
		{[]string{"--addr", addr, "--shared-prefix-len", "1024", "--prefix-groups", "0"}, "--prefix-groups"},
		{[]string{"--addr", addr, "--shared-prefix-len", "1024", "--background-prompt-len", "1024"}, "--shared-prefix-len with --background-prompt-len"},
		{[]string{"--addr", addr, "--seed", "-1"}, "--seed"},
		{[]string{"--addr", addr, "--json=maybe"}, "json"},
		{[]string{"--addr", addr, "extra"}, "unexpected arguments"},
	} {
		code, stdout, stderr := runCLI(t, append([]string{"bench", "serve"}, tc.args...)...)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.flag) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want exit 2 and one line naming %s)", tc.args, code, stdout, stderr, tc.flag)
		}
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentAddr is a loopback address that accepts connections and never
// answers (as a TLS node does to a plaintext client); the listener and
// the connections it held close when the test ends.
func silentAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() { // accepts and holds until the listener closes
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	return lis.Addr().String()
}

// TestBenchServeUnreachable: no server at --addr is one clear line
// (exit 1) and no JSON; neither is a server that is no completions API.
func TestBenchServeUnreachable(t *testing.T) {
	addr := closedAddr(t)
	code, stdout, stderr := runCLI(t, "bench", "serve", "--addr", addr)
	if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "questctl bench serve: the server at http://"+addr+" is unreachable") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	ts := httptest.NewServer(nil) // 404 everywhere
	defer ts.Close()
	code, stdout, stderr = runCLI(t, "bench", "serve", "--addr", strings.TrimPrefix(ts.URL, "http://"))
	if code != 1 || stdout != "" || !strings.Contains(stderr, "not a completions API") {
		t.Errorf("not an API: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// serveTestServer serves passkey-llama-v1 through package completion on an
// httptest server (skipping without the checkpoints); it returns the
// address and the server.
func serveTestServer(t *testing.T) (string, *completion.Server) {
	t.Helper()
	return serveTestServerWith(t, nil)
}

// serveTestServerWith is serveTestServer with edit applied to the
// serving config (nil: none).
func serveTestServerWith(t *testing.T, edit func(*completion.Config)) (string, *completion.Server) {
	t.Helper()
	dir := filepath.Join(testModels(t), "passkey-llama-v1")
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	tok, err := model.LoadTokenizer(dir, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := completion.DefaultConfig()
	cfg.Engines = serveengine.Engines()
	cfg.ModelName = "passkey-llama-v1"
	cfg.CapacityPages = 1024
	cfg.MemoryLimit = -1
	cfg.MaxRunning = 4
	cfg.ChunkTokens = 256
	if edit != nil {
		edit(&cfg)
	}
	s, err := completion.New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return strings.TrimPrefix(ts.URL, "http://"), s
}

// benchServeTestTimeout is --timeout of the tests' bench serve runs: a
// request prefills 1-4K tokens on the CPU (seconds of CPU time), which on
// a loaded 2-core CI machine took past a minute once.
const benchServeTestTimeout = 5 * time.Minute

// serveLines decodes bench serve's JSON lines.
func serveLines(t *testing.T, stdout string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

// TestBenchServeRun: against passkey-llama-v1 served in process, a small
// run (after one warm-up request per selector) prints one JSON line per
// (concurrency, selector) with the
// documented fields, positive TTFT and inter-token latencies, the tokens
// counted (from the usage chunk: up to max_tokens per request, fewer
// where the model ends on EOS), and leaves the server with nothing
// running.
func TestBenchServeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("serves a model")
	}
	addr, s := serveTestServer(t)
	code, stdout, stderr := runCLI(t, "bench", "serve", "--addr", addr, "--concurrency", "1,3", "--prompt-len", "512",
		"--max-tokens", "8", "--requests", "3", "--seed", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rows := serveLines(t, stdout)
	if len(rows) != 4 {
		t.Fatalf("%d JSON lines, want 4:\n%s", len(rows), stdout)
	}
	for i, r := range rows {
		wantSel, wantConc := []string{"quest", "dense"}[i%2], []float64{1, 3}[i/2]
		if r["selector"] != wantSel || r["concurrency"] != wantConc {
			t.Errorf("line %d: selector %v concurrency %v, want %s %v", i, r["selector"], r["concurrency"], wantSel, wantConc)
		}
		for _, k := range []string{"requests", "completed", "errors", "prompt_len", "prompt_tokens", "cached_tokens", "max_tokens", "ttft_p50_ms", "ttft_p99_ms",
			"itl_p50_ms", "itl_p99_ms", "tpot_mean_ms", "e2e_p50_ms", "output_tokens", "output_tokens_per_s", "wall_s", "correct", "accuracy",
			"bytes_read_vs_dense", "background_prompt_len", "loadavg_1m", "retries_429"} {
			if _, ok := r[k]; !ok {
				t.Fatalf("line %d lacks %s: %v", i, k, r)
			}
		}
		if r["requests"] != 3.0 || r["completed"] != 3.0 || r["errors"] != 0.0 {
			t.Errorf("line %d: requests %v completed %v errors %v", i, r["requests"], r["completed"], r["errors"])
		}
		if o := r["output_tokens"].(float64); o < 3 || o > 24 || r["prompt_tokens"].(float64) < 500 || r["prompt_tokens"].(float64) > 600 {
			t.Errorf("line %d: output_tokens %v (want 3..3 x 8), prompt_tokens %v (want about 512 + BOS)", i, r["output_tokens"], r["prompt_tokens"])
		}
		for _, k := range []string{"ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_mean_ms", "output_tokens_per_s", "wall_s"} {
			if v := r[k].(float64); !(v > 0) {
				t.Errorf("line %d: %s %v, want positive", i, k, v)
			}
		}
		if r["ttft_p99_ms"].(float64) < r["ttft_p50_ms"].(float64) || r["itl_p99_ms"].(float64) < r["itl_p50_ms"].(float64) {
			t.Errorf("line %d: p99 below p50: %v", i, r)
		}
		if rho := r["bytes_read_vs_dense"].(float64); wantSel == "dense" && rho < 1 {
			t.Errorf("line %d: dense reads %v of dense's bytes", i, rho)
		}
	}
	if !strings.Contains(stderr, "| selector | concurrency |") || !strings.Contains(stderr, "| quest | 3 | - | 3 | 3 |") {
		t.Errorf("no table on stderr:\n%s", stderr)
	}
	// 12 measured requests and one warm-up per selector before them.
	// The prefix cache's sequences stay (questd's default: caching on).
	if st := s.Stats(); st.Running != 0 || st.Queued != 0 || st.EngineSequences != st.PrefixCacheEntries || st.Completed != 14 {
		t.Errorf("server after the run: %+v", st)
	}
}

// TestBenchServeBackground: with --background-prompt-len each level runs
// alone, then while the long prompt is prefilled; the second line tells
// the background's ttft, the requests sent during its prefill and their
// ttft against the level alone.
func TestBenchServeBackground(t *testing.T) {
	if testing.Short() {
		t.Skip("serves a model")
	}
	addr, _ := serveTestServer(t)
	code, stdout, stderr := runCLI(t, "bench", "serve", "--addr", addr, "--concurrency", "1", "--prompt-len", "256",
		"--max-tokens", "4", "--requests", "2", "--selector", "quest", "--background-prompt-len", "4096", "--json", "--timeout", benchServeTestTimeout.String())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rows := serveLines(t, stdout)
	if len(rows) != 2 || rows[0]["background_prompt_len"] != 0.0 || rows[1]["background_prompt_len"] != 4096.0 {
		t.Fatalf("lines %v", rows)
	}
	bg := rows[1]
	if bg["background_ttft_ms"].(float64) <= 0 || bg["during_prefill"].(float64) < 1 || bg["ttft_during_prefill_p50_ms"].(float64) <= 0 || bg["ttft_vs_alone"].(float64) <= 0 {
		t.Errorf("background line %v", bg)
	}
	if strings.Contains(stderr, "| selector |") {
		t.Error("--json printed the table")
	}
}

// TestBenchServeSharedPrefix: with --shared-prefix-len 1024 and
// --prefix-groups 2, the 4 requests of a level (one in flight) share 2
// documents: against a server with its prefix cache (the default) the
// first request of each document misses and the 2 after them hit, each
// with cached_tokens a whole number of 16-token pages covering nearly
// all of its ~1,024-byte document (the byte tokenizer: a token a
// byte) and below its prompt tokens; against questd
// --prefix-caching=false none hits. Each line reports the TTFT of hits
// and misses and the table on stderr shows them.
func TestBenchServeSharedPrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("serves a model")
	}
	args := []string{"--concurrency", "1", "--selector", "quest", "--shared-prefix-len", "1024", "--prefix-groups", "2",
		"--requests", "4", "--max-tokens", "2", "--seed", "3", "--timeout", benchServeTestTimeout.String()}
	for _, caching := range []bool{true, false} {
		addr, s := serveTestServerWith(t, func(c *completion.Config) { c.PrefixCaching = caching })
		code, stdout, stderr := runCLI(t, append([]string{"bench", "serve", "--addr", addr}, args...)...)
		if code != 0 {
			t.Fatalf("caching %t: exit %d: %s", caching, code, stderr)
		}
		rows := serveLines(t, stdout)
		if len(rows) != 1 {
			t.Fatalf("caching %t: %d lines, want 1", caching, len(rows))
		}
		r := rows[0]
		if r["shared_prefix_len"] != 1024.0 || r["prefix_groups"] != 2.0 || r["completed"] != 4.0 {
			t.Fatalf("caching %t: line %v", caching, r)
		}
		var cached []int
		for _, v := range r["cached_tokens_per_request"].([]any) {
			cached = append(cached, int(v.(float64)))
		}
		prompt := r["prompt_tokens"].(float64)
		wantHits := 0
		for i, c := range cached {
			switch {
			case !caching || i < 2:
				if c != 0 {
					t.Errorf("caching %t: request %d got %d cached tokens, want 0 (a miss)", caching, i, c)
				}
			case c%16 != 0 || c < 900 || float64(c) >= prompt:
				t.Errorf("request %d: %d cached tokens, want whole pages of the ~1024-byte document, below the %v prompt tokens", i, c, prompt)
			default:
				wantHits++
			}
		}
		if len(cached) != 4 || int(r["hits"].(float64)) != wantHits || (caching && wantHits != 2) {
			t.Errorf("caching %t: hits %v, cached tokens per request %v", caching, r["hits"], cached)
		}
		if r["ttft_miss_p50_ms"].(float64) <= 0 || caching && r["ttft_hit_p50_ms"].(float64) <= 0 {
			t.Errorf("caching %t: TTFT of hits %v, of misses %v", caching, r["ttft_hit_p50_ms"], r["ttft_miss_p50_ms"])
		}
		if !strings.Contains(stderr, "| selector | concurrency | shared prefix |") || !strings.Contains(stderr, "| quest | 1 | 1024 B x 2 | 4 |") {
			t.Errorf("no shared-prefix table on stderr:\n%s", stderr)
		}
		if st := s.Stats(); caching && st.PrefixCacheHits < 2 || !caching && st.PrefixCacheHits != 0 {
			t.Errorf("caching %t: the server counted %d hits", caching, st.PrefixCacheHits)
		}
	}
}
