package completion

import (
	"fmt"
	"math"
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

// TestPrefixCacheMatchesSolo is the property test of prefix caching in
// the local layout (runPrefixMix): with a small pool (the cache must
// give way to running requests), unbounded and with a bound on the cache
// (evictions); at the end the pages in use are the cache's only.
func TestPrefixCacheMatchesSolo(t *testing.T) {
	m, tok := tinyModel(t)
	ref := testConfig("tiny")
	ref.PrefixCaching = false
	rs, refTS := startServer(t, m, tok, ref)
	for _, bound := range []int{0, 24} {
		t.Run(fmt.Sprintf("bound %d", bound), func(t *testing.T) {
			cfg := testConfig("tiny")
			cfg.CapacityPages = 200
			cfg.PrefixCachePages = bound
			cfg.MaxRunning = 4
			cfg.ChunkTokens = 128
			s, ts := startServer(t, m, tok, cfg)
			st := runPrefixMix(t, s, ts.URL, rs, refTS.URL, prefixMix{
				seed: uint64(bound), docs: []int{40, 300, 700, 900},
				requests: 40, questions: 7, maxTokens: 12, parallel: 6,
			})
			if st.UsedPages != st.PrefixCachePages {
				t.Errorf("%d pages in use, %d of them the cache's", st.UsedPages, st.PrefixCachePages)
			}
		})
	}
}

// TestPrefixCachePrefillsRest is prefixPrefillsRest in the local
// layout.
func TestPrefixCachePrefillsRest(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.CapacityPages = 256
	cfg.PrefixCachePages = 200 // room for the whole shared prefix
	s, ts := startServer(t, m, tok, cfg)
	ref := testConfig("tiny")
	ref.PrefixCaching = false
	_, refTS := startServer(t, m, tok, ref)
	prefixPrefillsRest(t, s, ts.URL, refTS.URL)
}

// cachedPages returns the physical pages, on the main engine's only
// shard, of the cache's entries (in cache order) and a copy of every
// (layer, page, KV head) summary they hold.
func cachedPages(t *testing.T, s *Server) ([]int32, map[[3]int][2][]float32) {
	t.Helper()
	st := shardStore(t, s)
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
	st := shardStore(t, s)
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
