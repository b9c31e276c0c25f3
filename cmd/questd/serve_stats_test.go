package main

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/serveengine"
)

// TestStatsLineNext: the stats line's rates are the counters' growth
// over the seconds between two readings, its percentages the reserved
// pages over the pool and the prefix cache's hit tokens over its query
// tokens in the interval; an idle interval (nothing running or queued
// at either reading, no counter moved) gives no line, one with work
// running and no token yet does.
func TestStatsLineNext(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := &statsLine{last: completion.Stats{CapacityPages: 200}, lastAt: t0}
	attrs := func(a []any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(a); i += 2 {
			m[a[i].(string)] = a[i+1]
		}
		return m
	}
	if _, ok := l.next(completion.Stats{CapacityPages: 200}, t0.Add(10*time.Second)); ok {
		t.Errorf("an idle interval gave a line")
	}
	if _, ok := l.next(completion.Stats{CapacityPages: 200, Queued: 1}, t0.Add(20*time.Second)); !ok {
		t.Errorf("an interval with a queued sequence gave no line")
	}
	st := completion.Stats{Running: 2, PromptTokens: 1000, CompletionTokens: 40, Completed: 3, Failed: 1, Refused: 2,
		ReservedPages: 50, CapacityPages: 200, PrefixCacheQueryTokens: 800, PrefixCacheHitTokens: 600}
	a, ok := l.next(st, t0.Add(24*time.Second)) // 4 s after the last reading
	if !ok {
		t.Fatal("a busy interval gave no line")
	}
	want := map[string]any{"prompt_tokens_per_s": 250.0, "generation_tokens_per_s": 10.0, "running": 2, "queued": 0,
		"finished": uint64(4), "refused": uint64(2), "kv_pages_reserved_pct": 25.0, "prefix_cache_hit_pct": 75.0}
	if got := attrs(a); len(got) != len(want) {
		t.Errorf("line %v, want %v", got, want)
	} else {
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s = %v (%T), want %v", k, got[k], got[k], v)
			}
		}
	}
	// The next interval counts from this reading: 2 s, 20 more tokens.
	st.Running, st.CompletionTokens = 0, 60
	a, ok = l.next(st, t0.Add(26*time.Second))
	if got := attrs(a); !ok || got["generation_tokens_per_s"] != 10.0 || got["prompt_tokens_per_s"] != 0.0 || got["finished"] != uint64(0) || got["prefix_cache_hit_pct"] != 0.0 {
		t.Errorf("second line %v (%v)", got, ok)
	}
	// Nothing running at either end, no counter moved: quiet again.
	if _, ok := l.next(st, t0.Add(36*time.Second)); ok {
		t.Errorf("an idle interval after work gave a line")
	}
}

// TestServeStatsLog: logServeStats writes no line while the API is
// idle, a stats line with the generated tokens' rate and the finished
// request once a completion ran, and none again once idle; stop ends
// its goroutine.
func TestServeStatsLog(t *testing.T) {
	sc := completion.DefaultConfig()
	sc.Engines = serveengine.Engines()
	sc.CapacityPages = 256
	sc.MemoryLimit = -1
	srv, err := completion.Load(passkeyModel(t), sc)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ts := httptest.NewServer(srv)
	defer ts.Close()
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	stop := logServeStats(srv, 100*time.Millisecond, log)
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	lines := func() []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var m map[string]any
			if l != "" && json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "stats" {
				out = append(out, m)
			}
		}
		return out
	}
	time.Sleep(350 * time.Millisecond)
	if n := len(lines()); n != 0 {
		t.Fatalf("idle: %d stats lines: %s", n, buf.String())
	}
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "The pass key is", "max_tokens": 8, "temperature": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
	// The lines until one counts the request finished (the next
	// interval's at the latest).
	var got []map[string]any
	var gen, finished float64
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && finished == 0; time.Sleep(50 * time.Millisecond) {
		got, gen, finished = lines(), 0, 0
		for _, l := range got {
			g, _ := l["generation_tokens_per_s"].(float64)
			f, _ := l["finished"].(float64)
			gen, finished = gen+g, finished+f
		}
	}
	if gen <= 0 || finished != 1 {
		t.Errorf("stats lines %v: want a generation rate and the one request finished", got)
	}
	// Idle again: no new line after the one that saw the request end.
	time.Sleep(300 * time.Millisecond)
	n := len(lines())
	time.Sleep(350 * time.Millisecond)
	if m := len(lines()); m != n {
		t.Errorf("idle after the request: %d more stats lines: %s", m-n, buf.String())
	}
	stop()
	stop = nil
}
