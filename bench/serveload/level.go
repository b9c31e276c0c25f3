package serveload

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// level runs one level: len(ps) requests with n in flight, each with
// selector sel; with bg, while bg's request is prefilled.
func (cl *client) level(ctx context.Context, sel string, n int, ps []prompt, bg *prompt) (Result, error) {
	c := cl.cfg
	r := Result{Selector: sel, Concurrency: n, Requests: len(ps), PromptLen: c.PromptLen, MaxTokens: c.MaxTokens, LoadAvg1: loadAvg1()}
	if c.SharedPrefix > 0 {
		r.PromptLen, r.SharedPrefixLen, r.PrefixGroups = 0, c.SharedPrefix, min(c.PrefixGroups, len(ps))
	}
	if sel == "quest" {
		r.Budget = c.Budget
	}
	what := fmt.Sprintf("%s concurrency %d", sel, n)
	var bgSample sample
	bgDone := make(chan struct{})
	if bg != nil {
		r.BackgroundPromptLen = c.BackgroundLen
		what += fmt.Sprintf(" during a %d-byte prefill", c.BackgroundLen)
		fmt.Fprintf(cl.errOut, "bench serve: %s: the background request\n", what)
		opened := make(chan struct{})
		var once sync.Once
		go func() {
			defer close(bgDone)
			bgSample = cl.stream(ctx, cl.body(*bg, sel, 1), bg.answer, func() { once.Do(func() { close(opened) }) })
		}()
		select {
		case <-opened:
		case <-bgDone:
			return r, fmt.Errorf("%s: the background request: %v", what, bgSample.err)
		}
	} else {
		close(bgDone)
	}
	if c.SharedPrefix > 0 {
		fmt.Fprintf(cl.errOut, "bench serve: %s: %d requests sharing %d documents of %d bytes\n", what, len(ps), r.PrefixGroups, c.SharedPrefix)
	} else {
		fmt.Fprintf(cl.errOut, "bench serve: %s: %d requests of %d bytes\n", what, len(ps), c.PromptLen)
	}
	samples := make([]sample, len(ps))
	var next, finished atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range min(n, len(ps)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ps) || ctx.Err() != nil {
					return
				}
				s := cl.stream(ctx, cl.body(ps[i], sel, c.MaxTokens), ps[i].answer, nil)
				samples[i] = s
				k := finished.Add(1)
				if s.err != nil {
					fmt.Fprintf(cl.errOut, "bench serve: %s: request %d/%d failed: %v\n", what, k, len(ps), s.err)
					continue
				}
				fmt.Fprintf(cl.errOut, "bench serve: %s: request %d/%d: ttft %.0f ms, %d tokens in %.0f ms, %d prompt tokens cached, correct %v\n",
					what, k, len(ps), ms(s.first.Sub(s.sent)), s.tokens, ms(s.end.Sub(s.sent)), s.cachedTokens, s.correct)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	<-bgDone
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if bg != nil {
		if bgSample.err != nil {
			return r, fmt.Errorf("%s: the background request: %v", what, bgSample.err)
		}
		r.BackgroundTTFTMS = ms(bgSample.first.Sub(bgSample.sent))
	}
	var ttft, itl, e2e, during, hit, miss []float64
	var tpot, rho float64
	var firstErr error
	for _, s := range samples {
		if c.SharedPrefix > 0 {
			n := s.cachedTokens
			if s.err != nil {
				n = -1
			}
			r.CachedTokensPerRequest = append(r.CachedTokensPerRequest, n)
		}
		if s.err != nil {
			r.Errors++
			if firstErr == nil {
				firstErr = s.err
			}
			continue
		}
		r.Completed++
		r.Retries429 += s.retries
		r.OutputTokens += s.tokens
		r.PromptTokens += float64(s.promptTokens)
		r.CachedTokens += float64(s.cachedTokens)
		rho += s.rho
		if s.correct {
			r.Correct++
		}
		ttft = append(ttft, ms(s.first.Sub(s.sent)))
		if s.cachedTokens > 0 {
			hit = append(hit, ms(s.first.Sub(s.sent)))
		} else {
			miss = append(miss, ms(s.first.Sub(s.sent)))
		}
		e2e = append(e2e, ms(s.end.Sub(s.sent)))
		itl = append(itl, s.itl...)
		if s.tokens > 1 {
			tpot += ms(s.last.Sub(s.first)) / float64(s.tokens-1)
		}
		if bg != nil && s.sent.Before(bgSample.first) {
			during = append(during, ms(s.first.Sub(s.sent)))
		}
	}
	if r.Completed == 0 {
		return r, fmt.Errorf("%s: every request failed, the first: %v", what, firstErr)
	}
	done := float64(r.Completed)
	r.PromptTokens /= done
	r.CachedTokens /= done
	r.BytesReadVsDense = rho / done
	r.TTFTP50MS, r.TTFTP99MS, r.TTFTMeanMS = percentile(ttft, 0.5), percentile(ttft, 0.99), mean(ttft)
	r.Hits = len(hit)
	r.TTFTHitP50MS, r.TTFTHitMeanMS = percentile(hit, 0.5), mean(hit)
	r.TTFTMissP50MS, r.TTFTMissMeanMS = percentile(miss, 0.5), mean(miss)
	r.ITLP50MS, r.ITLP99MS = percentile(itl, 0.5), percentile(itl, 0.99)
	r.TPOTMeanMS = tpot / done
	r.E2EP50MS, r.E2EP99MS = percentile(e2e, 0.5), percentile(e2e, 0.99)
	r.WallS = wall.Seconds()
	r.OutputTokensPerS = float64(r.OutputTokens) / r.WallS
	r.RequestsPerS = done / r.WallS
	r.Accuracy = float64(r.Correct) / done
	r.DuringPrefill = len(during)
	if len(during) > 0 {
		r.TTFTDuringPrefillP50MS, r.TTFTDuringPrefillMaxMS = percentile(during, 0.5), slices.Max(during)
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// percentile is the nearest-rank p-quantile of xs (0 for none).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// loadAvg1 is the 1-minute load average, -1 where /proc/loadavg is not.
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}
