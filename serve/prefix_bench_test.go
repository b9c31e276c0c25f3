package serve

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkPrefixCacheTTFT measures the target of prefix
// caching on passkey-llama-v1 (CPU): two requests whose prompts share
// an 8,192-token prefix (then a different question each), one after
// the other on one server after a warm-up request of another text; it
// reports both times to first token (the server's, RequestTiming) and
// their ratio (target: at most 0.2). With -benchtime=1x one pair.
func BenchmarkPrefixCacheTTFT(b *testing.B) {
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
	for range b.N {
		cfg := testConfig("passkey")
		cfg.CapacityPages = 4096
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
