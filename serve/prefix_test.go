package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/questrt/questrt/pagestore"
)

// TestPrefixKeysChain: a page's key names its tokens and every page
// before it; only full pages get one.
func TestPrefixKeysChain(t *testing.T) {
	a := []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
	b := []int{1, 2, 3, 4, 5, 6, 7, 9, 9}
	c := []int{0, 2, 3, 4, 5, 6, 7, 8, 9}
	ka, kb, kc := prefixKeys(a, 4, 10), prefixKeys(b, 4, 10), prefixKeys(c, 4, 10)
	if len(ka) != 2 || len(prefixKeys(a, 4, 1)) != 1 || len(prefixKeys(a[:3], 4, 10)) != 0 {
		t.Fatalf("%d keys of 9 tokens in pages of 4, want 2", len(ka))
	}
	if ka[0] != kb[0] || ka[1] == kb[1] {
		t.Errorf("pages 0 equal and 1 different: keys equal %t, %t", ka[0] == kb[0], ka[1] == kb[1])
	}
	if ka[1] == kc[1] {
		t.Error("page 1 equal after a different page 0: same key (the chain is broken)")
	}
}

// prefixRequest is one request of the mixed workload.
type prefixRequest struct {
	body   map[string]any
	cancel bool // the client goes away after the answer starts
}

// TestPrefixCacheMatchesSolo is the property test of prefix caching:
// random requests over a few shared documents (different questions
// after them, n of 1 or 2, greedy or seeded sampling, a few echoing
// their prompt's log-probabilities), run concurrently against a server
// with a small pool (the cache must give way to running requests) and a
// bound on the cache (evictions), some of them cancelled by their
// client, each give exactly the output of the same request run alone on
// a server without caching; the cache served some of their prompt
// tokens, evicted pages, and holds nothing else at the end.
func TestPrefixCacheMatchesSolo(t *testing.T) {
	m, tok := tinyModel(t)
	ref := testConfig("tiny")
	ref.PrefixCaching = false
	_, refTS := startServer(t, m, tok, ref)
	for _, bound := range []int{0, 24} {
		t.Run(fmt.Sprintf("bound %d", bound), func(t *testing.T) {
			cfg := testConfig("tiny")
			cfg.CapacityPages = 200
			cfg.PrefixCachePages = bound
			cfg.MaxRunning = 4
			cfg.ChunkTokens = 128
			s, ts := startServer(t, m, tok, cfg)
			rng := rand.New(rand.NewPCG(uint64(bound), 29))
			words := strings.Fields("the quick brown fox jumps over a lazy dog while seven tall ships sail north past old harbour lights")
			doc := func(n int) string {
				var b strings.Builder
				for b.Len() < n {
					b.WriteString(words[rng.IntN(len(words))])
					b.WriteByte(' ')
				}
				return b.String()
			}
			docs := []string{doc(40), doc(300), doc(700), doc(900)}
			var reqs []prefixRequest
			for i := range 40 {
				prompt := docs[rng.IntN(len(docs))] + fmt.Sprintf("Question %d: %s?", i%7, doc(rng.IntN(40)))
				body := map[string]any{"model": "tiny", "prompt": prompt, "max_tokens": 1 + rng.IntN(12)}
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
			sem := make(chan struct{}, 6)
			for i, r := range reqs {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					if r.cancel {
						ctx, cancel := context.WithCancel(context.Background())
						b, _ := json.Marshal(with(r.body, "stream", true, "max_tokens", 200))
						req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", bytes.NewReader(b))
						resp, err := http.DefaultClient.Do(req)
						if err == nil {
							buf := make([]byte, 64)
							_, _ = resp.Body.Read(buf)
							cancel()
							resp.Body.Close()
						}
						cancel()
						return
					}
					c := complete(t, ts.URL, r.body)
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
				want := complete(t, refTS.URL, r.body)
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
			if cached == 0 || st.PrefixCacheHits == 0 || st.PrefixCacheEvictedPages == 0 {
				t.Errorf("cached %d tokens, %d hits, %d pages evicted: the workload shows nothing", cached, st.PrefixCacheHits, st.PrefixCacheEvictedPages)
			}
			if bound > 0 && st.PrefixCachePages > bound {
				t.Errorf("the cache holds %d pages, bound %d", st.PrefixCachePages, bound)
			}
			if st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.UsedPages != st.PrefixCachePages {
				t.Errorf("left behind beside the cache: %+v", st)
			}
		})
	}
}

// cachedPages returns the physical pages, on the main engine's only
// shard, of the cache's entries (in cache order) and a copy of every
// (layer, page, KV head) summary they hold.
func cachedPages(t *testing.T, s *Server) ([]int32, map[[3]int][2][]float32) {
	t.Helper()
	st := s.eng.Shard(0, 0).Store()
	var pages []int32
	sums := map[[3]int][2][]float32{}
	for _, e := range s.pc.live {
		_, row, _, ok := e.attn.DecodeRow()
		if !ok {
			t.Fatal("a cached prefix without an engine row")
		}
		table, err := st.AppendPageTable(nil, pagestore.SeqID(row.Seq))
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, table...)
		for _, p := range table {
			for l := range st.Config().Layers {
				for h := range st.Config().KVHeads {
					mn, mx := st.PageSummary(l, int(p), h)
					sums[[3]int{l, int(p), h}] = [2][]float32{slices.Clone(mn), slices.Clone(mx)}
				}
			}
		}
	}
	return pages, sums
}

// TestPrefixSharingInvariants: DESIGN.md invariants 5 and 6 under
// prefix caching. The pages of a cached prefix and their summaries do
// not change while requests that fork it write after it (a Quest budget
// small enough that selection depends on the scores), and each of
// those requests answers as it does alone without caching (a write in
// one never changes another's scores). Once the cache gave its pages
// up for a request that needs the whole pool, pages reused by a later
// prompt have the summaries of their own keys only (fresh).
func TestPrefixSharingInvariants(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.CapacityPages = 256 // the tiny model's 4,096 positions
	s, ts := startServer(t, m, tok, cfg)
	ref := testConfig("tiny")
	ref.PrefixCaching = false
	_, refTS := startServer(t, m, tok, ref)
	doc := strings.Repeat("a shared document about ships and harbours; ", 12) // 540 bytes: 33 full pages
	quest := map[string]any{"budget": 64}
	req := func(q string, n int) map[string]any {
		return map[string]any{"model": "tiny", "prompt": doc + q, "max_tokens": n, "temperature": 0, "quest": quest}
	}
	complete(t, ts.URL, req("First?", 2))
	pages, before := cachedPages(t, s)
	if len(pages) == 0 {
		t.Fatal("nothing cached")
	}
	var wg sync.WaitGroup
	qs := []string{"Where do the ships go?", "Who keeps the lights?", "Why?"}
	got := make([]Completion, len(qs))
	for i, q := range qs {
		wg.Go(func() { got[i] = complete(t, ts.URL, req(q, 150)) })
	}
	wg.Wait()
	for i, q := range qs {
		want := complete(t, refTS.URL, req(q, 150))
		if c := got[i].Usage.PromptTokensDetails.CachedTokens; c == 0 {
			t.Errorf("%q: no cached tokens", q)
		}
		if got[i].Choices[0].Text != want.Choices[0].Text {
			t.Errorf("%q: %q beside the others on the shared prefix, %q alone without caching", q, got[i].Choices[0].Text, want.Choices[0].Text)
		}
	}
	st := s.eng.Shard(0, 0).Store()
	for k, v := range before {
		mn, mx := st.PageSummary(k[0], k[1], k[2])
		if !slices.Equal(mn, v[0]) || !slices.Equal(mx, v[1]) {
			t.Fatalf("layer %d page %d head %d: a shared page's summary changed while its forks wrote", k[0], k[1], k[2])
		}
	}
	// A request of the whole pool: the cache gives way (and the freed
	// pages, shared ones included, go to it).
	big := map[string]any{"model": "tiny", "prompt": "x", "max_tokens": 256*16 - 2, "temperature": 0}
	complete(t, ts.URL, big)
	if n := s.Stats().PrefixCacheEvictedPages; n == 0 {
		t.Fatal("no page evicted for a request of the whole pool")
	}
	// That request held every page of the pool, so a new prompt's pages
	// are all recycled: their summaries are its keys' only.
	complete(t, ts.URL, map[string]any{"model": "tiny", "prompt": strings.Repeat("zq", 200), "max_tokens": 1, "temperature": 0})
	now, _ := cachedPages(t, s)
	for _, p := range now {
		for l := range st.Config().Layers {
			for h := range st.Config().KVHeads {
				k, _ := st.PageKV(l, int(p), h)
				mn, mx := st.PageSummary(l, int(p), h)
				d := st.Config().HeadDim
				for j := range d {
					lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
					for r := range st.Config().PageSize {
						lo, hi = min(lo, k[r*d+j]), max(hi, k[r*d+j])
					}
					if mn[j] != lo || mx[j] != hi {
						t.Fatalf("layer %d page %d head %d dim %d: summary [%g, %g], its keys' [%g, %g]", l, p, h, j, mn[j], mx[j], lo, hi)
					}
				}
			}
		}
	}
	if len(now) == 0 {
		t.Error("the new prompt's pages are not cached: the test shows nothing")
	}
}
