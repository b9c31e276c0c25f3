package completion

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// This file holds the prefix-cache workloads that the local layout
// (prefix_test.go, prefix_bench_test.go) and the cluster layout
// (cluster_prefix_test.go, cluster_prefix_bench_test.go) both run, with
// the same assertions: each layout only starts its servers.

// prefixRequest is one request of the mixed workload.
type prefixRequest struct {
	body   map[string]any
	cancel bool // the client goes away after the answer starts
}

// prefixMix sizes runPrefixMix's workload.
type prefixMix struct {
	seed      uint64
	docs      []int // the shared documents' lengths, in bytes
	requests  int
	questions int // distinct question numbers after the documents
	maxTokens int // each request asks for 1 to maxTokens tokens
	parallel  int // requests in flight at once
}

// runPrefixMix is the property test of prefix caching: random requests
// over a few shared documents (different questions after them, n of 1
// or 2, greedy or seeded sampling, a few echoing their prompt's
// log-probabilities), some cancelled by their client, run concurrently
// against s (at ts) each give exactly the output and usage (cached
// tokens aside) of the same request run alone on rs (at refTS), a
// server without caching. The cache served some of their prompt tokens
// and evicted pages, keeps within its bound, and once every request
// ended s holds only its cache's sequences and rs none. It returns s's
// stats then, for the layout's own checks.
func runPrefixMix(t *testing.T, s *Server, ts string, rs *Server, refTS string, p prefixMix) Stats {
	t.Helper()
	rng := rand.New(rand.NewPCG(p.seed, 29))
	words := strings.Fields("the quick brown fox jumps over a lazy dog while seven tall ships sail north past old harbour lights")
	doc := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	docs := make([]string, len(p.docs))
	for i, n := range p.docs {
		docs[i] = doc(n)
	}
	var reqs []prefixRequest
	for i := range p.requests {
		prompt := docs[rng.IntN(len(docs))] + fmt.Sprintf("Question %d: %s?", i%p.questions, doc(rng.IntN(40)))
		body := map[string]any{"model": s.name, "prompt": prompt, "max_tokens": 1 + rng.IntN(p.maxTokens)}
		switch rng.IntN(4) {
		case 0:
			body["temperature"] = 0
		case 1:
			body["temperature"], body["seed"], body["n"] = 0.9, rng.IntN(100), 2
		case 2:
			body["echo"], body["logprobs"], body["temperature"] = true, 1, 0
		default:
			body["temperature"], body["seed"] = 1.0, rng.IntN(100)
		}
		reqs = append(reqs, prefixRequest{body: body, cancel: rng.IntN(6) == 0})
	}
	type answer struct {
		texts []string
		usage Usage
		ok    bool
	}
	got := make([]answer, len(reqs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, p.parallel)
	for i, r := range reqs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if r.cancel {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				b, _ := json.Marshal(with(r.body, "stream", true, "max_tokens", 200))
				req, _ := http.NewRequestWithContext(ctx, "POST", ts+"/v1/completions", bytes.NewReader(b))
				if resp, err := http.DefaultClient.Do(req); err == nil {
					buf := make([]byte, 64)
					_, _ = resp.Body.Read(buf)
					cancel()
					resp.Body.Close()
				}
				return
			}
			c := complete(t, ts, r.body)
			a := answer{usage: *c.Usage, ok: true}
			for _, ch := range c.Choices {
				a.texts = append(a.texts, ch.Text)
			}
			got[i] = a
		})
	}
	wg.Wait()
	cached := 0
	for i, r := range reqs {
		if !got[i].ok {
			continue
		}
		want := complete(t, refTS, r.body)
		for c, ch := range want.Choices {
			if c >= len(got[i].texts) || got[i].texts[c] != ch.Text {
				t.Errorf("request %d choice %d (%d prompt tokens, %d cached): %q, alone without caching %q",
					i, c, got[i].usage.PromptTokens, got[i].usage.PromptTokensDetails.CachedTokens, got[i].texts, ch.Text)
			}
		}
		if uncached(got[i].usage) != uncached(*want.Usage) {
			t.Errorf("request %d: usage %+v, alone %+v", i, got[i].usage, *want.Usage)
		}
		cached += got[i].usage.PromptTokensDetails.CachedTokens
	}
	st := waitStats(t, s, "every request ended", func(st Stats) bool { return st.Running == 0 && st.Queued == 0 })
	t.Logf("%d prompt tokens cached; %+v", cached, st)
	// Which requests hit depends on their order under load (with a small
	// bound, evictions can leave a single hit): at least one hit and one
	// eviction.
	if cached == 0 || st.PrefixCacheHits == 0 || st.PrefixCacheEvictedPages == 0 {
		t.Errorf("cached %d tokens, %d hits, %d pages evicted: the workload shows nothing", cached, st.PrefixCacheHits, st.PrefixCacheEvictedPages)
	}
	if bound := s.cfg.PrefixCachePages; bound > 0 && st.PrefixCachePages > bound {
		t.Errorf("the cache holds %d pages, bound %d", st.PrefixCachePages, bound)
	}
	if st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries {
		t.Errorf("left behind beside the cache: %+v", st)
	}
	rst := waitStats(t, rs, "every reference request ended", func(st Stats) bool { return st.Running == 0 && st.Queued == 0 && st.EngineSequences == 0 })
	if rst.PrefixCacheHits+rst.PrefixCacheMisses != 0 {
		t.Errorf("the server without caching: %+v", rst)
	}
	return st
}

// prefixPrefillsRest: of two requests whose prompts share a long
// prefix, the second (to s at ts) forks the first's cached pages and
// prefills only the rest of its prompt: its cached_tokens is the shared
// prefix's full pages (from the token ids, computed here), the server's
// prefilled prompt tokens grow by the rest only, and each text and
// usage is that of a server without caching (at refTS).
func prefixPrefillsRest(t *testing.T, s *Server, ts, refTS string) {
	t.Helper()
	doc := strings.Repeat("a long shared document about ships, harbours and the lights that guide them home; ", 20)
	first := doc + "Where do the ships go?"
	second := doc + "Who keeps the lights?"
	ids := func(p string) []int { // the prompt's ids as the server prefills them (BOS first)
		b, _ := json.Marshal(map[string]any{"model": s.name, "prompt": p})
		status, _, body := post(t, refTS+"/tokenize", string(b))
		var tr TokenizeResponse
		if err := json.Unmarshal(body, &tr); err != nil || status != http.StatusOK {
			t.Fatalf("tokenize: %d %s", status, body)
		}
		return tr.Tokens
	}
	a, b := ids(first), ids(second)
	common := 0
	for common < min(len(a), len(b)) && a[common] == b[common] {
		common++
	}
	ps := s.cfg.Policy.PageSize
	want := min(common/ps, (len(b)-1)/ps) * ps
	if want < 1000 {
		t.Fatalf("the prompts share %d tokens (%d in full pages): too short to show anything", common, want)
	}
	req := func(p string) map[string]any {
		return map[string]any{"model": s.name, "prompt": p, "max_tokens": 12, "temperature": 0}
	}
	c1 := complete(t, ts, req(first))
	before := s.Stats().PromptTokens
	c2 := complete(t, ts, req(second))
	prefilled := s.Stats().PromptTokens - before
	if c1.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("the first request got %d cached tokens", c1.Usage.PromptTokensDetails.CachedTokens)
	}
	if got := c2.Usage.PromptTokensDetails.CachedTokens; got != want || c2.Usage.PromptTokens != len(b) {
		t.Errorf("the second request: %d of %d prompt tokens cached, want %d of %d", got, c2.Usage.PromptTokens, want, len(b))
	}
	if prefilled != uint64(len(b)-want) {
		t.Errorf("the second request prefilled %d tokens, want the %d after the cached prefix", prefilled, len(b)-want)
	}
	for i, p := range []string{first, second} {
		got := []Completion{c1, c2}[i]
		if w := complete(t, refTS, req(p)); got.Choices[0].Text != w.Choices[0].Text || uncached(*got.Usage) != uncached(*w.Usage) {
			t.Errorf("request %d: %q %+v, without caching %q %+v", i, got.Choices[0].Text, *got.Usage, w.Choices[0].Text, *w.Usage)
		}
	}
}

// benchPrefixTTFT measures the target of prefix caching on
// passkey-llama-v1 (CPU): two requests whose prompts share an
// 8,192-token prefix (then a different question each), one after the
// other on one server after a warm-up request of another text; it
// reports both times to first token (the server's, RequestTiming),
// their ratio (target: at most 0.2) and the second's cached tokens.
// layout adjusts the config of the i-th iteration's server (a testConfig
// of the model) to the layout measured. With -benchtime=1x one pair.
func benchPrefixTTFT(b *testing.B, layout func(b *testing.B, i int, cfg *Config)) {
	m, tok, _ := passkeyModel(b)
	const prefixTokens = 8192
	var sb strings.Builder
	for i := 0; len(tok.Encode(sb.String())) < prefixTokens; i++ {
		fmt.Fprintf(&sb, "Line %d of the shared document: the grass is green, the sky is blue. ", i)
	}
	ids := tok.Encode(sb.String())
	prefix := tok.Decode(ids[:prefixTokens])
	if got := len(tok.Encode(prefix)); got != prefixTokens {
		b.Fatalf("the prefix encodes to %d tokens, want %d", got, prefixTokens)
	}
	var first, second time.Duration
	var hit int
	for i := range b.N {
		cfg := testConfig("passkey")
		layout(b, i, &cfg)
		var mu sync.Mutex
		var ttft []time.Duration
		cfg.Observe = func(rt RequestTiming) {
			mu.Lock()
			ttft = append(ttft, rt.FirstToken)
			mu.Unlock()
		}
		_, ts := startServer(b, m, tok, cfg)
		complete(b, ts.URL, map[string]any{"model": "passkey", "prompt": "A warm-up of another text.", "max_tokens": 4, "temperature": 0})
		a := complete(b, ts.URL, map[string]any{"model": "passkey", "prompt": prefix + " What is the first colour?", "max_tokens": 4, "temperature": 0})
		c := complete(b, ts.URL, map[string]any{"model": "passkey", "prompt": prefix + " And what is the second one?", "max_tokens": 4, "temperature": 0})
		mu.Lock()
		if len(ttft) != 3 {
			b.Fatalf("%d timings, want 3", len(ttft))
		}
		first, second = first+ttft[1], second+ttft[2]
		mu.Unlock()
		if a.Usage.PromptTokensDetails.CachedTokens != 0 {
			b.Fatalf("the first request got %d cached tokens", a.Usage.PromptTokensDetails.CachedTokens)
		}
		hit += c.Usage.PromptTokensDetails.CachedTokens
	}
	n := time.Duration(b.N)
	b.ReportMetric(float64((first / n).Milliseconds()), "ttft-first-ms")
	b.ReportMetric(float64((second / n).Milliseconds()), "ttft-second-ms")
	b.ReportMetric(float64(second)/float64(first), "ttft-ratio")
	b.ReportMetric(float64(hit/b.N), "cached-tokens")
}
