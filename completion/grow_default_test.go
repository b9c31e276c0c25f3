package completion

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// postWithin posts body to url with a client bounded by d, returning
// the completion or an error instead of failing the test (it runs in
// goroutines of the test).
func postWithin(url string, req map[string]any, d time.Duration) (Completion, error) {
	b, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(string(b)))
	if err != nil {
		return Completion{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return Completion{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Completion{}, err
	}
	var c Completion
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, &c); err != nil {
		return c, fmt.Errorf("answer %q: %w", body, err)
	}
	return c, nil
}

// concurrentRun starts a held server of cfg over the tiny model, sends
// reqs together, releases the scheduler once every request is queued and
// waits for all of them under deadline. It returns the answers, the
// server's stats after them and the most decode rows of one iteration.
func concurrentRun(t *testing.T, cfg Config, reqs []map[string]any, deadline time.Duration) ([]Completion, Stats, int) {
	t.Helper()
	m, tok := tinyModel(t)
	gate := make(chan struct{})
	var mu sync.Mutex
	maxRows := 0
	s, err := newServer(m, tok, cfg, hooks{
		iteration: func(ctx context.Context) {
			select {
			case <-gate:
			case <-ctx.Done():
			}
		},
		batched: func(rows, _ int) {
			mu.Lock()
			maxRows = max(maxRows, rows)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		hs.Close()
		s.Close()
	})
	ts := hs.URL
	got := make([]Completion, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { got[i], errs[i] = postWithin(ts, r, deadline) })
	}
	waitQueued(t, s, len(reqs))
	start := time.Now()
	close(gate)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(deadline + 5*time.Second):
		t.Fatalf("requests not answered %v after the release: %+v", deadline+5*time.Second, s.Stats())
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d after %v: %v (stats %+v)", i, time.Since(start), err, s.Stats())
		}
	}
	// The last answer may reach the client a moment before the
	// scheduler's books close.
	st := waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
	mu.Lock()
	defer mu.Unlock()
	return got, st, maxRows
}

// TestGrowReservationsDefault: growing reservations are the default
// (DefaultConfig), as in vLLM.
func TestGrowReservationsDefault(t *testing.T) {
	if !DefaultConfig().GrowReservations {
		t.Fatal("DefaultConfig().GrowReservations false, want growing reservations by default")
	}
}

// TestGrowReservationsFitTogether: four requests of 21-token prompts
// (BOS and 20 bytes) and max_tokens 200 that each end on a stop token
// after 5 to 10 tokens. Their whole contexts (221 tokens, 14 pages of 16) do not fit a pool of
// 20 pages two at a time, so with whole-context reservations they run
// one after the other (one decode row an iteration); with the default
// (growing reservations) each reserves 2 pages and all four decode in
// the same iterations. Both ways every request returns what it returns
// alone, no request is preempted, and nothing is left reserved.
func TestGrowReservationsFitTogether(t *testing.T) {
	m, tok := tinyModel(t)
	prompts := []string{"the quick brown fox ", "0123456789abcdefghij", "lorem ipsum dolor si", "jumps over the lazy "}
	_, refTS := startServer(t, m, tok, testConfig("tiny"))
	var reqs []map[string]any
	var want []Completion
	for _, p := range prompts {
		// The stop token: the first of the prompt's greedy run from its
		// 5th on that it did not generate before, so that the request
		// ends within a few tokens of its 200.
		probe := complete(t, refTS.URL, map[string]any{"model": "tiny", "prompt": p, "max_tokens": 16, "temperature": 0})
		out := record(t, refTS.URL, probe.ID).OutputTokens
		at := 4
		for at < len(out) && slices.Contains(out[:at], out[at]) {
			at++
		}
		if at >= 10 {
			t.Fatalf("prompt %q: greedy tokens %v repeat: pick another prompt", p, out)
		}
		r := map[string]any{"model": "tiny", "prompt": p, "max_tokens": 200, "temperature": 0, "stop_token_ids": []int{out[at]}}
		w := complete(t, refTS.URL, r)
		if w.Usage.CompletionTokens != at+1 || *w.Choices[0].FinishReason != "stop" || w.Usage.PromptTokens != 21 {
			t.Fatalf("prompt %q alone: usage %+v, finish %s; want a stop after %d tokens of a 21-token prompt", p, w.Usage, *w.Choices[0].FinishReason, at+1)
		}
		reqs, want = append(reqs, r), append(want, w)
	}
	for _, grow := range []bool{true, false} {
		t.Run(fmt.Sprintf("grow=%v", grow), func(t *testing.T) {
			cfg := testConfig("tiny")
			cfg.CapacityPages = 20
			if !grow {
				cfg.GrowReservations = false
			}
			got, st, rows := concurrentRun(t, cfg, reqs, 60*time.Second)
			for i := range reqs {
				if got[i].Choices[0].Text != want[i].Choices[0].Text || *got[i].Choices[0].FinishReason != "stop" {
					t.Errorf("request %d: %q (%s), alone %q", i, got[i].Choices[0].Text, *got[i].Choices[0].FinishReason, want[i].Choices[0].Text)
				}
			}
			wantRows := map[bool]int{true: 4, false: 1}[grow]
			if rows != wantRows {
				t.Errorf("at most %d decode rows an iteration, want %d", rows, wantRows)
			}
			if st.Completed != 4 || st.Preemptions != 0 || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.UsedPages != st.PrefixCachePages {
				t.Errorf("after the requests %+v, want 4 completed, no preemption, nothing held but the prefix cache's", st)
			}
		})
	}
}

// TestGrowReservationsExhaustion: with the default config, eight greedy
// and seeded sampled requests of 21-token prompts and max_tokens 40 to
// 80 (61 to 101 tokens, 4 to 7 pages) arrive together at a pool of 12
// pages with up to 8 running: six start (2 pages each), the pool runs
// out while they generate, and the newest are preempted and run again,
// over and over. Within a deadline (no hang, no deadlock) every request
// returns what it returns alone, preemptions happened, and afterwards
// nothing but the prefix cache's pages is held.
func TestGrowReservationsExhaustion(t *testing.T) {
	m, tok := tinyModel(t)
	var reqs []map[string]any
	for i := range 8 {
		r := map[string]any{"model": "tiny", "prompt": fmt.Sprintf("request %d of eight: ", i), "max_tokens": 40 + 10*(i%5), "temperature": 0}
		if i%2 == 1 {
			r["temperature"], r["seed"] = 0.8, i
		}
		reqs = append(reqs, r)
	}
	_, refTS := startServer(t, m, tok, testConfig("tiny"))
	var want []Completion
	for _, r := range reqs {
		want = append(want, complete(t, refTS.URL, r))
	}
	cfg := testConfig("tiny")
	cfg.CapacityPages, cfg.MaxRunning = 12, 8
	got, st, rows := concurrentRun(t, cfg, reqs, 60*time.Second)
	for i := range reqs {
		if got[i].Choices[0].Text != want[i].Choices[0].Text || got[i].Usage.CompletionTokens != want[i].Usage.CompletionTokens {
			t.Errorf("request %d: %q (%d tokens), alone %q (%d)", i, got[i].Choices[0].Text, got[i].Usage.CompletionTokens, want[i].Choices[0].Text, want[i].Usage.CompletionTokens)
		}
	}
	if st.Preemptions == 0 || rows < 5 {
		t.Errorf("%d preemptions, at most %d decode rows an iteration: want the pool to run out with more than 4 decoding", st.Preemptions, rows)
	}
	if st.Completed != uint64(len(reqs)) || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.UsedPages != st.PrefixCachePages {
		t.Errorf("after the requests %+v, want nothing held but the prefix cache's", st)
	}
	t.Logf("%d preemptions, at most %d decode rows, %d decode rows in %d steps, %d prompt tokens prefilled", st.Preemptions, rows, st.StepSequences, st.Steps, st.PromptTokens)
}
