package completion

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/worker/remote"
)

// killMidStream starts a server on a 2-node cluster whose CP = 2 grid
// spans both nodes, with retries grid retries. Once armed (arm(n)), its
// scheduler kills node 1 (as a crash: no leave, no goodbye to the grid)
// before the first iteration at which n requests are running and each
// has generated 3 tokens or more, after the streaming client that
// closes the channel arm returns has read text; killed reports the
// kill.
func killMidStream(t *testing.T, prefix string, retries int) (s *Server, url string, nodes []*node.Node, arm func(n int) chan struct{}, killed *atomic.Bool) {
	t.Helper()
	m, tok, _ := passkeyModel(t)
	nodes = startCluster(t, prefix)
	cfg := testConfig("v1")
	cfg.CP = 2
	cfg.CapacityPages = 256
	cfg.Policy.BudgetTokens = 128
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	cfg.GridRetries = retries
	var want atomic.Int64
	var streamed atomic.Pointer[chan struct{}]
	killed = new(atomic.Bool)
	var srv atomic.Pointer[Server]
	s, err := newServer(m, tok, cfg, hooks{iteration: func(ctx context.Context) {
		n := int(want.Load())
		if n == 0 {
			return
		}
		// On the scheduler goroutine: the jobs' counts are its own.
		running := srv.Load().live()
		if len(running) != n || slices.ContainsFunc(running, func(j *job) bool { return j.tokens < 3 }) {
			return
		}
		want.Store(0)
		select {
		case <-*streamed.Load():
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Second):
			t.Error("the client read no text in 10 s")
			return
		}
		nodes[1].Kill()
		killed.Store(true)
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Store(s)
	ts := httptestServer(t, s)
	arm = func(n int) chan struct{} {
		ch := make(chan struct{})
		streamed.Store(&ch)
		want.Store(int64(n))
		return ch
	}
	return s, ts, nodes, arm, killed
}

// httptestServer serves s until the test ends (then closes both).
func httptestServer(t *testing.T, s *Server) string {
	t.Helper()
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return ts.URL
}

// streamUntilEnd posts req as a stream, closes read once a chunk with
// text has come, and returns the text, the finish reason, the usage and
// the error event the stream ended with (nil when it ended with
// [DONE]), or err when the stream is not one. It may run on any
// goroutine.
func streamUntilEnd(url string, req map[string]any, read chan struct{}) (text, finish string, usage *Usage, errEvent *ErrorDetail, err error) {
	req["stream"] = true
	req["stream_options"] = map[string]any{"include_usage": true}
	b, _ := json.Marshal(req)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		return "", "", nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", "", nil, nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if d == "[DONE]" {
			return sb.String(), finish, usage, nil, nil
		}
		var e ErrorBody
		if json.Unmarshal([]byte(d), &e) == nil && e.Error.Message != "" {
			return sb.String(), finish, usage, &e.Error, nil
		}
		var c Completion
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			return "", "", nil, nil, fmt.Errorf("chunk %s: %w", d, err)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			sb.WriteString(ch.Text)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		if sb.Len() > 0 && read != nil {
			close(read)
			read = nil
		}
	}
	return "", "", nil, nil, fmt.Errorf("stream ended without [DONE] or an error (%v) after %q", sc.Err(), sb.String())
}

// TestClusterGridLostRetried: a greedy and a sampled stream served
// together through a CP = 2 grid over two nodes, one of which is killed
// mid-decode (each request has 3 tokens or more, and the greedy one's
// client has read text), complete on a new grid (both ranks on the
// surviving node) with exactly the text, finish reason and usage each
// got when run before without a loss (the sampled one's sampler goes on
// with its own stream); both retries are counted, and nothing is left
// on the surviving node.
func TestClusterGridLostRetried(t *testing.T) {
	s, url, nodes, arm, killed := killMidStream(t, "retry", 1)
	greedy := map[string]any{"model": "v1", "prompt": longPrompt(t), "max_tokens": 24, "temperature": 0}
	sampled := map[string]any{"model": "v1", "prompt": longPrompt(t), "max_tokens": 12, "temperature": 0.8, "seed": 11}
	want := []Completion{complete(t, url, greedy), complete(t, url, sampled)}
	for _, w := range want {
		if w.Usage.PagesRead >= w.Usage.PagesTotal || w.Usage.CompletionTokens < 6 {
			t.Fatalf("uninterrupted %q, usage %+v: want 6 tokens or more and fewer pages read than dense (page selection at work)", w.Choices[0].Text, *w.Usage)
		}
	}
	read := arm(2)
	type out struct {
		text, finish string
		usage        *Usage
		ev           *ErrorDetail
		err          error
	}
	got := make([]out, 2)
	var wg sync.WaitGroup
	for i, req := range []map[string]any{greedy, sampled} {
		ch := read
		if i > 0 {
			ch = nil
		}
		wg.Go(func() {
			var o out
			o.text, o.finish, o.usage, o.ev, o.err = streamUntilEnd(url, req, ch)
			got[i] = o
		})
	}
	wg.Wait()
	if !killed.Load() {
		t.Fatal("node 1 was not killed while the requests ran")
	}
	for i, o := range got {
		w := want[i]
		if o.err != nil || o.ev != nil {
			t.Errorf("request %d failed after %q: %v %+v", i, o.text, o.err, o.ev)
			continue
		}
		if o.text != w.Choices[0].Text || o.finish != *w.Choices[0].FinishReason || o.usage == nil || uncached(*o.usage) != uncached(*w.Usage) {
			t.Errorf("request %d after the loss: %q %s %+v; uninterrupted: %q %s %+v", i, o.text, o.finish, o.usage, w.Choices[0].Text, *w.Choices[0].FinishReason, *w.Usage)
		}
		// Both forked the cached prompt on the grid that was lost; run
		// again, they found its entry gone with it and prefilled anew
		// (together: neither found the other's entry yet).
		if o.usage != nil && o.usage.PromptTokensDetails.CachedTokens != 0 {
			t.Errorf("request %d after the loss: %d cached tokens, want 0 (the lost grid's prefix dropped)", i, o.usage.PromptTokensDetails.CachedTokens)
		}
	}
	// The prompt cached on the new grid serves the next request.
	if again := complete(t, url, with(greedy, "stream", false, "stream_options", nil)); again.Choices[0].Text != want[0].Choices[0].Text || again.Usage.PromptTokensDetails.CachedTokens != 992 {
		t.Errorf("after the loss: %q with %d cached tokens, want %q with 992 (997 prompt tokens: 62 pages of 16 on the new grid)",
			again.Choices[0].Text, again.Usage.PromptTokensDetails.CachedTokens, want[0].Choices[0].Text)
	}
	tokens := 3*uint64(want[0].Usage.CompletionTokens) + 2*uint64(want[1].Usage.CompletionTokens)
	if st := s.Stats(); st.GridRetries != 2 || st.Completed != 5 || st.Failed != 0 || st.CompletionTokens != tokens || st.PrefixCacheLost != 1 || st.PrefixCacheHits != 4 {
		t.Errorf("stats %+v: want 2 grid retries, 5 completed, %d completion tokens, 1 cached prefix lost with its grid, 4 hits", st, tokens)
	}
	waitNodes(t, nodes[:1], s)
}

// TestClusterGridLostNotRetried: with GridRetries 0, the same loss ends
// the stream with the cluster_unavailable error event after the text
// already sent (a prefix of the uninterrupted run's), and nothing is
// retried.
func TestClusterGridLostNotRetried(t *testing.T) {
	s, url, nodes, arm, killed := killMidStream(t, "noretry", 0)
	req := map[string]any{"model": "v1", "prompt": longPrompt(t), "max_tokens": 24, "temperature": 0}
	want := complete(t, url, req)
	read := arm(1)
	text, _, _, errEv, err := streamUntilEnd(url, req, read)
	if err != nil {
		t.Fatal(err)
	}
	if !killed.Load() {
		t.Fatal("node 1 was not killed while the request ran")
	}
	if errEv == nil || errEv.Code == nil || *errEv.Code != "cluster_unavailable" || !strings.Contains(errEv.Message, "retries are off") {
		t.Fatalf("stream ended with %+v after %q: want the cluster_unavailable error saying it was not retried", errEv, text)
	}
	if text == "" || !strings.HasPrefix(want.Choices[0].Text, text) || text == want.Choices[0].Text {
		t.Errorf("text before the error %q: want a proper prefix of %q", text, want.Choices[0].Text)
	}
	if st := s.Stats(); st.GridRetries != 0 || st.Failed != 1 || st.Completed != 1 {
		t.Errorf("stats %+v", st)
	}
	waitNodes(t, nodes[:1], s)
}

// longPrompt is the passkey prompt: longer than the budget, so that the
// decode steps select pages.
func longPrompt(t *testing.T) string {
	_, _, dir := passkeyModel(t)
	p, _ := passkeyPrompt(t, dir)
	return p
}

// TestRetryDecision: which failures of a job run it again on a new
// grid. Only a grid's loss, on a cluster, of a request of one choice,
// within GridRetries, while the job and the server go on; a loss not
// retried says why, anything else is not a loss at all.
func TestRetryDecision(t *testing.T) {
	lost := fmt.Errorf("decode step: %w", clusterErr(fmt.Errorf("grid g: %w", coord.ErrGridLost)))
	other := fmt.Errorf("decode step: %w", clusterErr(remote.ErrNodeFull))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name     string
		cluster  bool
		retries  int // GridRetries
		n        int // the request's choices per prompt
		done     int // the job's retries so far
		ctx      context.Context
		err      error
		retried  bool
		whyNames string // in the reason ("" for none)
	}{
		{"lost", true, 1, 1, 0, context.Background(), lost, true, ""},
		{"lost twice, 2 retries", true, 2, 1, 1, context.Background(), lost, true, ""},
		{"exhausted", true, 1, 1, 1, context.Background(), lost, false, "retried on a new grid 1 times"},
		{"retries off", true, 0, 1, 0, context.Background(), lost, false, "retries are off"},
		{"n = 2", true, 1, 2, 0, context.Background(), lost, false, "n = 2 choices"},
		{"not a loss", true, 1, 1, 0, context.Background(), other, false, ""},
		{"plain error", true, 1, 1, 0, context.Background(), errors.New("boom"), false, ""},
		{"client gone", true, 1, 1, 0, cancelled, lost, false, ""},
		{"in process", false, 1, 1, 0, context.Background(), lost, false, ""},
	} {
		s := &Server{ctx: context.Background(), log: slog.New(slog.DiscardHandler)}
		s.cfg.GridRetries = c.retries
		if c.cluster {
			s.cfg.Cluster = CoordinatorCluster(nil)
		}
		j := &job{ctx: c.ctx, retries: c.done, tokens: 3, filled: 40, gen: []int{7, 8, 9}, replay: []int{7}}
		j.p.n = c.n
		retried, why := s.retry(j, c.err)
		if retried != c.retried || (c.whyNames == "") != (why == "") || !strings.Contains(why, c.whyNames) {
			t.Errorf("%s: retried %v, why %q; want %v, a reason naming %q", c.name, retried, why, c.retried, c.whyNames)
		}
		if retried {
			if st := s.Stats(); st.GridRetries != 1 || j.retries != c.done+1 || j.filled != 0 || j.replay != nil || j.attn != nil || j.tokens != 3 {
				t.Errorf("%s: stats %d retries, job retries %d filled %d replay %v tokens %d: want one more retry, the prefill and replay to redo, the tokens kept",
					c.name, st.GridRetries, j.retries, j.filled, j.replay, j.tokens)
			}
		} else if s.Stats().GridRetries != 0 || j.retries != c.done || j.filled != 40 {
			t.Errorf("%s: not retried but the job or the count changed", c.name)
		}
	}
}
