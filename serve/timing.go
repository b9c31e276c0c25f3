package serve

import "time"

// RequestTiming is how a finished request's time went, from its
// arrival (its body read) to its end, for latency metrics and the
// per-request log line (Config.Observe).
type RequestTiming struct {
	// ID is the completion's id; Chat says it came through
	// /v1/chat/completions.
	ID   string
	Chat bool
	// Outcome is "completed", "cancelled" (client gone or past the
	// request timeout) or "failed".
	Outcome string
	// Finish is the finish reason of a completed request ("stop" or
	// "length").
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

// observe hands j's timing to Config.Observe, if set, at its end.
func (s *Server) observe(j *job, res result) {
	if s.cfg.Observe == nil {
		return
	}
	now := time.Now()
	t := RequestTiming{ID: j.id, Chat: j.p.chat, Usage: res.usage, FirstToken: j.clock.first, InterToken: j.clock.inter,
		Total: now.Sub(j.clock.arrived)}
	if j.p.chat {
		t.ID = "chat" + j.id
	}
	if j.clock.started.IsZero() {
		t.Queue = t.Total
	} else {
		t.Queue = j.clock.started.Sub(j.clock.arrived)
	}
	switch {
	case res.err == nil:
		t.Outcome, t.Finish = "completed", res.finish
	case res.err.status == 504 || res.err.status == statusClientGone:
		t.Outcome = "cancelled"
	default:
		t.Outcome = "failed"
	}
	s.cfg.Observe(t)
}
