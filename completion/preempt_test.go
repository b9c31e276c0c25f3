package completion

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
)

// TestGrowReservationsPreempt: with Config.GrowReservations a request
// reserves the pages of its prompt and next token, and each decode step
// the page it opens. Two requests of 20-token prompts and 40 tokens
// (60 tokens, 4 pages of 16, each) start together in a pool of 6
// pages, reserving 2 pages each; at 48 tokens the older needs its 4th
// page while the pool has none, and the newer is preempted (its pages
// back to the pool), waits in the queue until the older ends, is
// prefilled again with its generated tokens fed back, and completes.
// Both return the tokens they return alone (the newer streamed, its text
// neither repeated nor cut: a greedy request and a seeded sampled one),
// and afterwards nothing is reserved or held in the engine; the log
// names the preempted request, which is not the older. Without
// the option the same two requests run one after the other (4 pages
// each, all reserved at their start) with the same texts and no
// preemption.
func TestGrowReservationsPreempt(t *testing.T) {
	older := map[string]any{"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 40, "temperature": 0}
	for _, setup := range []struct {
		name   string
		config func(t *testing.T, m *model.Model, c *Config)
	}{
		{"cpu", func(t *testing.T, m *model.Model, c *Config) { c.PrefixCaching = false }},
		// The prefix cache gives way first: it holds the prompts' full
		// page after they are prefilled, until a growing request needs
		// the pool.
		{"cpu prefix cache", func(t *testing.T, m *model.Model, c *Config) {}},
		// The device executor on the CPU twin, prompts prefilled there.
		{"device", func(t *testing.T, m *model.Model, c *Config) {
			dev, x := twinExecutor(t, m, 32)
			dec := &gpu.Decoder{X: x}
			c.Backend, c.DeviceResident, c.Decoder, c.Prefiller, c.PrefixCaching = dev, true, dec, dec, false
		}},
	} {
		for _, newer := range []map[string]any{
			{"model": "tiny", "prompt": "0123456789abcdefgh ", "max_tokens": 40, "temperature": 0},
			{"model": "tiny", "prompt": "0123456789abcdefgh ", "max_tokens": 40, "temperature": 0.9, "seed": 11},
			// 28 prompt tokens and 32: the newer opens its 3rd and 4th
			// pages before the older does, and preempts itself.
			{"model": "tiny", "prompt": "0123456789abcdefghijklmnopq", "max_tokens": 32, "temperature": 0},
		} {
			m, tok := tinyModel(t)
			ref := testConfig("tiny")
			setup.config(t, m, &ref)
			_, refTS := startServer(t, m, tok, ref)
			want := []Completion{complete(t, refTS.URL, older), complete(t, refTS.URL, newer)}
			for i, w := range want {
				if w.Usage.TotalTokens != 60 || w.Usage.CompletionTokens != []int{40, newer["max_tokens"].(int)}[i] {
					t.Fatalf("reference %d: usage %+v, want 60 tokens (4 pages), max_tokens of them generated", i, w.Usage)
				}
			}
			for _, grow := range []bool{true, false} {
				cfg := ref
				cfg.CapacityPages, cfg.GrowReservations = 6, grow
				var logs syncBuffer
				cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				s, ts, release := heldModel(t, m, tok, cfg)
				var wg sync.WaitGroup
				var got Completion
				var text, finish string
				wg.Go(func() { got = complete(t, ts.URL, older) })
				waitQueued(t, s, 1)
				wg.Go(func() {
					b, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": newer["prompt"], "max_tokens": newer["max_tokens"], "temperature": newer["temperature"],
						"seed": newer["seed"], "stream": true})
					resp, err := http.Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(b))
					if err != nil {
						t.Error(err)
						return
					}
					defer resp.Body.Close()
					text, finish, _ = streamText(t, sseEvents(t, resp.Body))
				})
				waitQueued(t, s, 2)
				release()
				wg.Wait()
				what := fmt.Sprintf("%s, grow %v, newer %v", setup.name, grow, newer)
				if got.Choices[0].Text != want[0].Choices[0].Text {
					t.Errorf("%s: the older request %q, alone %q", what, got.Choices[0].Text, want[0].Choices[0].Text)
				}
				if text != want[1].Choices[0].Text || finish != "length" {
					t.Errorf("%s: the newer request streamed %q (%s), alone %q", what, text, finish, want[1].Choices[0].Text)
				}
				st := s.Stats()
				// Growing, the two ran batched until the newer was
				// preempted, whose prompt was prefilled twice (the
				// prefix cache gave way before it, its full page
				// evicted); else one after the other.
				once := uint64(want[0].Usage.PromptTokens + want[1].Usage.PromptTokens)
				if grow && (st.Preemptions != 1 || st.StepSequences <= st.Steps || st.PromptTokens != once+uint64(want[1].Usage.PromptTokens) ||
					st.PrefixCacheEvictedPages == 0 && setup.name == "cpu prefix cache") ||
					!grow && (st.Preemptions != 0 || st.StepSequences != st.Steps || st.PromptTokens != once) {
					t.Errorf("%s: %d preemptions, %d decode rows in %d steps, %d prompt tokens prefilled", what, st.Preemptions, st.StepSequences, st.Steps, st.PromptTokens)
				}
				if st.Completed != 2 || st.Running != 0 || st.Queued != 0 || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.UsedPages != st.PrefixCachePages {
					t.Errorf("%s: after both requests %+v, want nothing held but the prefix cache's", what, st)
				}
				var pre []string
				for _, l := range strings.Split(logs.String(), "\n") {
					if strings.Contains(l, "preempting") {
						pre = append(pre, l)
					}
				}
				if grow && (len(pre) != 1 || strings.Contains(pre[0], got.ID) || !strings.Contains(pre[0], "request=cmpl-")) || !grow && len(pre) != 0 {
					t.Errorf("%s: the older request is %s; log:\n%s", what, got.ID, logs.String())
				}
				t.Logf("%s: %d preemptions, %d decode rows in %d steps, %d prompt tokens prefilled, prefix cache %d pages", what, st.Preemptions, st.StepSequences, st.Steps, st.PromptTokens, st.PrefixCachePages)
			}
		}
	}
}

// heldModel is held (the scheduler waits for release before its first
// iteration) for a server of m.
func heldModel(t testing.TB, m *model.Model, tok model.Tokenizer, cfg Config) (s *Server, ts *httptest.Server, release func()) {
	t.Helper()
	gate := make(chan struct{})
	s, err := newServer(m, tok, cfg, hooks{iteration: func(ctx context.Context) {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ts = httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	var once sync.Once
	return s, ts, func() { once.Do(func() { close(gate) }) }
}

// waitQueued waits until s has n requests queued.
func waitQueued(t *testing.T, s *Server, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.Stats().Queued < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued after 10s, want %d", s.Stats().Queued, n)
		}
	}
}

// TestGrowReservationsCancelPreempted: a preempted request whose client
// leaves while it waits in the queue ends cancelled, holding nothing;
// the older request completes as alone.
func TestGrowReservationsCancelPreempted(t *testing.T) {
	m, tok := tinyModel(t)
	older := map[string]any{"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 40, "temperature": 0}
	ref := testConfig("tiny")
	ref.PrefixCaching = false
	_, refTS := startServer(t, m, tok, ref)
	want := complete(t, refTS.URL, older)

	cfg := ref
	cfg.CapacityPages, cfg.GrowReservations = 6, true
	start, resume := make(chan struct{}), make(chan struct{})
	var s *Server
	s, err := newServer(m, tok, cfg, hooks{iteration: func(ctx context.Context) {
		select {
		case <-start:
		case <-ctx.Done():
			return
		}
		if s.Stats().Preemptions > 0 {
			select { // hold the scheduler while the preempted request waits
			case <-resume:
			case <-ctx.Done():
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	var wg sync.WaitGroup
	var got Completion
	wg.Go(func() { got = complete(t, ts.URL, older) })
	waitQueued(t, s, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wg.Go(func() {
		b, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "0123456789abcdefgh ", "max_tokens": 40, "temperature": 0})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("the cancelled request answered %d", resp.StatusCode)
		}
	})
	waitQueued(t, s, 2)
	close(start)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st := s.Stats(); st.Preemptions == 1 && st.Queued == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request preempted and queued after 10s: %+v", s.Stats())
		}
	}
	cancel()
	time.Sleep(20 * time.Millisecond) // the handler sees its context end
	close(resume)
	wg.Wait()
	if got.Choices[0].Text != want.Choices[0].Text {
		t.Errorf("the older request %q, alone %q", got.Choices[0].Text, want.Choices[0].Text)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		st := s.Stats()
		if st.Completed == 1 && st.Cancelled == 1 && st.Running == 0 && st.Queued == 0 && st.ReservedPages == 0 && st.EngineSequences == 0 && st.UsedPages == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the cancelled preempted request: %+v, want 1 completed, 1 cancelled, nothing held", st)
		}
	}
}

// TestGrowReservationsMix: growing reservations under a pool of 10 pages
// with up to 4 running requests, a mix of 8 requests arriving together:
// greedy and seeded sampled requests of one sequence (which grow and
// may be preempted), n = 2 and a request with its own sink pages (which
// reserve their whole context), and one whose prompt starts with
// another's. Every choice returns what it returns
// alone on a server with a pool of 512 pages and the whole contexts
// reserved, and afterwards nothing but the prefix cache's pages is held.
func TestGrowReservationsMix(t *testing.T) {
	m, tok := tinyModel(t)
	long := "the quick brown fox jumps over the lazy dog "
	reqs := []map[string]any{
		{"prompt": long, "max_tokens": 50, "temperature": 0},
		{"prompt": "0123456789", "max_tokens": 60, "temperature": 0},
		{"prompt": long + "again", "max_tokens": 30, "temperature": 0},
		{"prompt": "abc", "max_tokens": 70, "temperature": 0.8, "seed": 3},
		{"prompt": "xyz xyz", "max_tokens": 40, "temperature": 0, "n": 2},
		{"prompt": "sink", "max_tokens": 40, "temperature": 0, "quest": map[string]any{"sink": 1}},
		{"prompt": "hello there", "max_tokens": 55, "temperature": 0.7, "top_p": 0.9, "seed": 9},
		{"prompt": "0123", "max_tokens": 45, "temperature": 0},
	}
	for _, r := range reqs {
		r["model"] = "tiny"
	}
	_, refTS := startServer(t, m, tok, testConfig("tiny"))
	want := make([]Completion, len(reqs))
	for i, r := range reqs {
		want[i] = complete(t, refTS.URL, r)
	}
	cfg := testConfig("tiny")
	cfg.CapacityPages, cfg.MaxRunning, cfg.GrowReservations = 10, 4, true
	s, ts, release := heldModel(t, m, tok, cfg)
	got := make([]Completion, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { got[i] = complete(t, ts.URL, r) })
	}
	waitQueued(t, s, len(reqs)+1) // n = 2: two sequences
	release()
	wg.Wait()
	for i := range reqs {
		for c := range want[i].Choices {
			if got[i].Choices[c].Text != want[i].Choices[c].Text {
				t.Errorf("request %d choice %d: %q, alone %q", i, c, got[i].Choices[c].Text, want[i].Choices[c].Text)
			}
		}
	}
	st := s.Stats()
	if st.Completed != uint64(len(reqs)) || st.Running != 0 || st.Queued != 0 || st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.UsedPages != st.PrefixCachePages || st.OwnEnginesOpen != 0 {
		t.Errorf("after the requests %+v, want nothing held but the prefix cache's", st)
	}
	if st.Preemptions == 0 {
		t.Errorf("no preemption in a pool of 10 pages: %+v", st)
	}
	t.Logf("%d preemptions, %d decode rows in %d steps, %d prompt tokens prefilled, prefix cache %d hits", st.Preemptions, st.StepSequences, st.Steps, st.PromptTokens, st.PrefixCacheHits)
}
