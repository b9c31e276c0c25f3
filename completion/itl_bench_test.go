package completion

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkPrefillITL measures the target of the per-iteration
// token budget (Config.MaxBatchedTokens) on passkey-llama-v1 (CPU): four
// greedy streams decode on one server; their inter-token gaps (as the
// client reads the events) are taken for 5 s alone, then while one long
// prompt (tokens=N) is prefilled beside them, then for 5 s alone again,
// in the same run. The streams' decode step grows with their context
// (the Quest scores read every page), which grows by thousands of
// tokens during a long prefill, so the gaps without the prefill are
// those of both windows around it (itl-alone-*; the first window alone:
// itl-before-*). It reports the p99 gaps, their ratio (p99-ratio,
// target: at most 3; p99-ratio-before against the first window) and
// the long prompt's time to its answer (its prefill and one token).
// batched=0 is the server without a budget (ChunkTokens, 512, per
// iteration, the default before 2026-12-07); with
// running=R (Config.MaxRunning) and batched=B, an iteration beside the
// four decoding streams prefills B-4 prompt tokens. itl=F adds the
// latency budget (Config.MaxITLFactor F; without it, off): an
// iteration prefills what fits F-1 decode steps by the measured costs.
// With -benchtime=1x one measurement per configuration.
func BenchmarkPrefillITL(b *testing.B) {
	m, tok, dir := passkeyModel(b)
	name := dir[strings.LastIndex(dir, "/")+1:]
	const streams = 4
	for _, n := range []int{8192, 16384} {
		long := itlPrompt(n)
		for _, c := range []struct {
			running, batched int
			itl              float64
		}{{8, 0, 0}, {8, 8, 0}, {8, 12, 0}, {8, 24, 0}, {8, 48, 0}, {5, 6, 0}, {8, 0, 2}, {8, 0, 3}, {8, 24, 2}} {
			sub := fmt.Sprintf("tokens=%d/running=%d/batched=%d", n, c.running, c.batched)
			if c.itl > 0 {
				sub += fmt.Sprintf("/itl=%g", c.itl)
			}
			b.Run(sub, func(b *testing.B) {
				for range b.N {
					cfg := testConfig(name)
					cfg.CapacityPages = 4096
					cfg.MaxRunning = c.running
					cfg.MaxBatchedTokens = c.batched
					cfg.MaxITLFactor = c.itl
					cfg.PrefixCaching = false
					cfg.RequestTimeout = 0 // a small budget prefills for minutes
					_, ts := startServer(b, m, tok, cfg)
					reportITL(b, measureITL(b, ts.URL, name, long, streams, 12000, false), n)
				}
			})
		}
	}
}

// BenchmarkPrefillITLDefaults is BenchmarkPrefillITL's measurement of
// the server's defaults (Config defaults but the pool, 4096 pages):
// default=old with MaxITLFactor 0, the default before 2026-12-07 (512
// prompt tokens an iteration beside the streams), default=new with
// DefaultConfig's. Each name is a leaf, so a pattern ending in $ runs
// one configuration alone (a pattern deeper than a name runs that name
// too, unreported, to look for sub-benchmarks). tokens=32767 is the
// longest prompt of the model's 32,768 positions (with its one token);
// its streams decode up to 30,000 tokens each (a pool of 16,384 pages
// holds them), as the new defaults prefill it for minutes. Those
// streams' decode step grows with their context during the prefill;
// tokens=N/relaunch/default=D measures streams of 256 tokens each, sent
// again as each ends, whose decode step stays put, so that the windows
// before and after compare like with like; tokens=N/relaunch/
// default=pertoken is the new defaults with the budget's per-chunk fixed
// cost left out (the default of 2026-12-07's morning), so that the two
// compare.
func BenchmarkPrefillITLDefaults(b *testing.B) {
	m, tok, dir := passkeyModel(b)
	name := dir[strings.LastIndex(dir, "/")+1:]
	for _, n := range []int{4096, 8192, 16384, 32767} {
		long := itlPrompt(n)
		for _, v := range []struct {
			sub, def string
			relaunch bool
		}{{"", "old", false}, {"", "new", false}, {"relaunch/", "old", true}, {"relaunch/", "new", true}, {"relaunch/", "pertoken", true}} {
			def := v.def
			b.Run(fmt.Sprintf("tokens=%d/%sdefault=%s", n, v.sub, def), func(b *testing.B) {
				for range b.N {
					cfg := testConfig(name)
					cfg.CapacityPages = 4096
					streamTokens := 12000
					switch {
					case v.relaunch:
						streamTokens = 256
					case n > 16384:
						cfg.CapacityPages, streamTokens = 16384, 30000
					}
					cfg.MaxITLFactor = DefaultConfig().MaxITLFactor
					if def == "old" {
						cfg.MaxITLFactor = 0
					}
					cfg.RequestTimeout = 0
					s, err := newServer(m, tok, cfg, hooks{perTokenOnly: def == "pertoken"})
					if err != nil {
						b.Fatal(err)
					}
					ts := httptest.NewServer(s)
					reportITL(b, measureITL(b, ts.URL, name, long, 4, streamTokens, v.relaunch), n)
					ts.Close()
					s.Close()
				}
			})
		}
	}
}

// itlPrompt is a prompt of n tokens (the byte tokenizer, with BOS).
func itlPrompt(n int) string {
	filler := "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "Line %d: %s", i, filler)
	}
	return sb.String()[:n-1]
}

// reportITL reports r's metrics; the long prompt must have n tokens.
func reportITL(b *testing.B, r itlResult, n int) {
	b.Helper()
	if got := r.promptTokens; got != n {
		b.Fatalf("the long prompt has %d tokens, want %d", got, n)
	}
	b.ReportMetric(r.alone.p50, "itl-alone-p50-ms")
	b.ReportMetric(r.alone.p99, "itl-alone-p99-ms")
	b.ReportMetric(r.alone.p90, "itl-alone-p90-ms")
	b.ReportMetric(r.before.p50, "itl-before-p50-ms")
	b.ReportMetric(r.before.p99, "itl-before-p99-ms")
	b.ReportMetric(r.during.p50, "itl-prefill-p50-ms")
	b.ReportMetric(r.during.p90, "itl-prefill-p90-ms")
	b.ReportMetric(r.during.p99, "itl-prefill-p99-ms")
	b.ReportMetric(r.during.p99/r.alone.p99, "p99-ratio")
	b.ReportMetric(r.during.p99/r.before.p99, "p99-ratio-before")
	b.ReportMetric(r.prefill.Seconds(), "prefill-s")
	b.ReportMetric(float64(r.during.n), "gaps-during")
}

// gapStats are percentiles of inter-token gaps, in milliseconds.
type gapStats struct {
	n             int
	p50, p90, p99 float64
}

func percentiles(gaps []time.Duration) gapStats {
	if len(gaps) == 0 {
		return gapStats{p50: math.NaN(), p90: math.NaN(), p99: math.NaN()}
	}
	s := slices.Clone(gaps)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return float64(s[max(0, i)]) / float64(time.Millisecond)
	}
	return gapStats{n: len(s), p50: at(0.5), p90: at(0.9), p99: at(0.99)}
}

type itlResult struct {
	// alone is the gaps of both windows without the long prompt, before
	// it and after; before the first window's alone.
	alone, before, during gapStats
	prefill               time.Duration
	promptTokens          int
}

// measureITL starts k streams (of streamTokens tokens), takes their
// gaps for 5 s, then sends the long prompt and takes their gaps until
// its answer, then for 5 s more; it cancels the streams at the end.
// With relaunch each stream is sent again as soon as it ends (a steady
// population of short streams, whose decode step does not grow with
// the benchmark's length); else a stream that ends before the last
// window's end fails the benchmark. A gap is between two events of one
// request.
func measureITL(b *testing.B, url, name, long string, k, streamTokens int, relaunch bool) itlResult {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var mu sync.Mutex
	var arrivals [][]time.Time // a request's events
	ended := make([]time.Time, k)
	started := make(chan struct{}, k)
	for i := range k {
		body, _ := json.Marshal(map[string]any{"model": name, "prompt": fmt.Sprintf("Stream %d. The grass is green. The sky is blue.", i),
			"max_tokens": streamTokens, "temperature": 0, "stream": true})
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			defer func() {
				if first {
					started <- struct{}{}
				}
			}()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(string(body)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				mu.Lock()
				r := len(arrivals)
				arrivals = append(arrivals, nil)
				mu.Unlock()
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if !strings.HasPrefix(sc.Text(), "data: {") {
						continue
					}
					now := time.Now()
					mu.Lock()
					arrivals[r] = append(arrivals[r], now)
					mu.Unlock()
					if first {
						first = false
						started <- struct{}{}
					}
				}
				resp.Body.Close()
				if !relaunch {
					mu.Lock()
					ended[i] = time.Now()
					mu.Unlock()
					return
				}
			}
		}()
	}
	for range k {
		<-started
	}
	time.Sleep(500 * time.Millisecond) // past the streams' first steps
	t0 := time.Now()
	time.Sleep(5 * time.Second)
	t1 := time.Now()
	c := complete(b, url, map[string]any{"model": name, "prompt": long, "max_tokens": 1, "temperature": 0})
	t2 := time.Now()
	time.Sleep(5 * time.Second)
	t3 := time.Now()
	mu.Lock()
	defer mu.Unlock()
	for i, e := range ended {
		if !e.IsZero() && e.Before(t3) {
			b.Fatalf("stream %d ended before the last window's end", i)
		}
	}
	var before, after, during []time.Duration
	for _, ts := range arrivals {
		for j := 1; j < len(ts); j++ {
			switch {
			case !ts[j-1].Before(t0) && ts[j].Before(t1):
				before = append(before, ts[j].Sub(ts[j-1]))
			case !ts[j-1].Before(t1) && ts[j].Before(t2):
				during = append(during, ts[j].Sub(ts[j-1]))
			case !ts[j-1].Before(t2) && ts[j].Before(t3):
				after = append(after, ts[j].Sub(ts[j-1]))
			}
		}
	}
	return itlResult{alone: percentiles(append(slices.Clone(before), after...)), before: percentiles(before), during: percentiles(during),
		prefill: t2.Sub(t1), promptTokens: c.Usage.PromptTokens}
}
