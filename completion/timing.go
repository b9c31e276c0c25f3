package completion

import "time"

// RequestTiming is how a finished request's time went, from its
// arrival (its body read) to its end, for latency metrics and the
// per-request log line (Config.Observe).
type RequestTiming struct {
	// ID is the completion's id; Chat says it came through
	// /v1/chat/completions.
	ID   string
	Chat bool
	// Outcome is "completed", "timeout" (past the request timeout,
	// Config.RequestTimeout: answered 504 request_timeout), "cancelled"
	// (the client gone) or "failed".
	Outcome string
	// Finish is the finish reason of a completed request ("stop" or
	// "length"; its first choice's).
	Finish string
	// Queue is the time from arrival to the scheduler taking the request
	// up (its prefill's start; the whole time for a request that ended
	// queued).
	Queue time.Duration
	// FirstToken is the time from arrival to the first generated token
	// (0 when none came): the time to first token a client sees, less
	// the network.
	FirstToken time.Duration
	// InterToken are the times between consecutive generated tokens.
	InterToken []time.Duration
	// Total is the time from arrival to the end.
	Total time.Duration
	// Usage is the request's usage (tokens, pages).
	Usage Usage
}

// reqClock is a job's timestamps (the scheduler's, but arrived).
type reqClock struct {
	arrived, started, last time.Time
	first                  time.Duration
	inter                  []time.Duration
}

// tokenAt records a generated token at now.
func (c *reqClock) tokenAt(now time.Time) {
	if c.first == 0 {
		c.first = now.Sub(c.arrived)
	} else {
		c.inter = append(c.inter, now.Sub(c.last))
	}
	c.last = now
}

// observe hands the timing of g's request to Config.Observe, if set,
// when its last choice ends: with n > 1 or a batch of prompts, the
// first token is the first of any choice, the inter-token times every
// choice's, the queue time until the first choice started, and the
// usage the request's.
func (s *Server) observe(g *group) {
	if s.cfg.Observe == nil {
		return
	}
	now := time.Now()
	j := g.jobs[0]
	res := make([]result, len(g.jobs))
	t := RequestTiming{ID: j.id, Chat: j.p.chat, Total: now.Sub(j.clock.arrived)}
	var started time.Time
	for i, x := range g.jobs {
		res[i] = x.res
		if f := x.clock.first; f > 0 && (t.FirstToken == 0 || f < t.FirstToken) {
			t.FirstToken = f
		}
		t.InterToken = append(t.InterToken, x.clock.inter...)
		if st := x.clock.started; !st.IsZero() && (started.IsZero() || st.Before(started)) {
			started = st
		}
	}
	t.Usage = usageOf(g.jobs, res)
	if j.p.chat {
		t.ID = "chat" + j.id
	}
	if started.IsZero() {
		t.Queue = t.Total
	} else {
		t.Queue = started.Sub(j.clock.arrived)
	}
	if t.Outcome = outcome(g.err); g.err == nil {
		t.Finish = j.res.finish
	}
	s.cfg.Observe(t)
}
