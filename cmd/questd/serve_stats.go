package main

import (
	"log/slog"
	"math"
	"time"

	"github.com/questrt/questrt/completion"
)

// statsLine is the completions API's periodic stats line (vLLM's "Avg
// prompt throughput: ... tokens/s, Running: ... reqs" line), built from
// two readings of completion.Stats.
type statsLine struct {
	last   completion.Stats
	lastAt time.Time
}

// next returns the attributes of the line for st read at now, over the
// time since the last reading, and false when the API did nothing in
// between (no sequence running or queued, then or now, and no token or
// request counted): an idle server logs no line.
func (l *statsLine) next(st completion.Stats, now time.Time) ([]any, bool) {
	prev, at := l.last, l.lastAt
	l.last, l.lastAt = st, now
	busy := st.Running+st.Queued > 0 || prev.Running+prev.Queued > 0
	ended := func(s completion.Stats) uint64 { return s.Completed + s.TimedOut + s.Cancelled + s.Failed }
	if !busy && st.PromptTokens == prev.PromptTokens && st.CompletionTokens == prev.CompletionTokens &&
		ended(st) == ended(prev) && st.Refused == prev.Refused && st.Invalid == prev.Invalid {
		return nil, false
	}
	secs := now.Sub(at).Seconds()
	rate := func(a, b uint64) float64 {
		if secs <= 0 {
			return 0
		}
		return round1(float64(a-b) / secs)
	}
	pct := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return round1(100 * a / b)
	}
	return []any{
		"prompt_tokens_per_s", rate(st.PromptTokens, prev.PromptTokens),
		"generation_tokens_per_s", rate(st.CompletionTokens, prev.CompletionTokens),
		"running", st.Running, "queued", st.Queued,
		"finished", ended(st) - ended(prev), "refused", st.Refused - prev.Refused,
		"kv_pages_reserved_pct", pct(float64(st.ReservedPages), float64(st.CapacityPages)),
		"prefix_cache_hit_pct", pct(float64(st.PrefixCacheHitTokens-prev.PrefixCacheHitTokens), float64(st.PrefixCacheQueryTokens-prev.PrefixCacheQueryTokens)),
	}, true
}

// round1 rounds to one decimal, for a readable line.
func round1(v float64) float64 { return math.Round(v*10) / 10 }

// logServeStats logs srv's stats line every interval (--log-stats-interval)
// while the API did something, until the returned stop is called (which
// waits for the goroutine to end).
func logServeStats(srv *completion.Server, every time.Duration, log *slog.Logger) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	l := &statsLine{last: srv.Stats(), lastAt: time.Now()}
	go func() {
		defer close(ended)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				if attrs, ok := l.next(srv.Stats(), now); ok {
					log.Info("stats", attrs...)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}
