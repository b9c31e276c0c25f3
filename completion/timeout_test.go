package completion

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestTimeoutOrCancelled: a request past Config.RequestTimeout gets 504
// request_timeout naming the limit and questd's flag, counts as timed
// out and is observed with outcome "timeout"; a request whose client
// leaves before its deadline counts as cancelled, outcome "cancelled".
func TestTimeoutOrCancelled(t *testing.T) {
	cfg := testConfig("tiny")
	observed := make(chan RequestTiming, 4)
	cfg.Observe = func(rt RequestTiming) { observed <- rt }
	cfg.RequestTimeout = 300 * time.Millisecond
	// The scheduler held: a request waits queued until release, and
	// leaves (is counted and observed) at the first iteration after it.
	s, ts, release := held(t, cfg)
	next := func() RequestTiming {
		t.Helper()
		select {
		case rt := <-observed:
			return rt
		case <-time.After(10 * time.Second):
			t.Fatal("no request observed in 10 s")
		}
		return RequestTiming{}
	}

	// Held in the queue past its deadline.
	status, _, body := post(t, ts.URL+"/v1/completions", `{"model": "tiny", "prompt": "late", "max_tokens": 5}`)
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("504 body %q: %v", body, err)
	}
	if status != http.StatusGatewayTimeout || e.Error.Code != "request_timeout" || e.Error.Type != "timeout_error" ||
		!strings.Contains(e.Error.Message, "--request-timeout 300ms") {
		t.Errorf("past the deadline: %d %s; want 504 request_timeout naming --request-timeout 300ms", status, body)
	}
	release()
	if rt := next(); rt.Outcome != "timeout" {
		t.Errorf("the timed-out request observed as %q, want timeout", rt.Outcome)
	}
	waitStats(t, s, "the timed-out request counted", func(st Stats) bool { return st.TimedOut == 1 && st.Cancelled == 0 && st.Running+st.Queued == 0 })

	// Its client gone well before its deadline: it leaves once its
	// request is queued, and the scheduler runs once the server has
	// seen it go. (A client deadline of 50 ms and a 200 ms sleep for
	// the server to notice were guesses that a loaded machine can
	// outlast: a request still live at release runs and completes.)
	cfg.RequestTimeout = time.Minute
	s, ts, release = held(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(`{"model": "tiny", "prompt": "gone", "max_tokens": 5}`))
	req.Header.Set("Content-Type", "application/json")
	answered := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	waitStats(t, s, "the request queued", func(st Stats) bool { return st.Queued == 1 })
	cancel()
	if code := <-answered; code != 0 {
		t.Fatalf("the leaving client got %d", code)
	}
	// net/http cancels the request's context once it reads the
	// connection's close: wait for that before the scheduler runs.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		s.mu.Lock()
		gone := len(s.queue) == 1 && s.queue[0].ctx.Err() != nil
		s.mu.Unlock()
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not see the client leave in 20 s")
		}
	}
	release()
	if rt := next(); rt.Outcome != "cancelled" {
		t.Errorf("the leaving client's request observed as %q, want cancelled", rt.Outcome)
	}
	waitStats(t, s, "the cancelled request counted", func(st Stats) bool { return st.TimedOut == 0 && st.Cancelled == 1 && st.Running+st.Queued == 0 })
}
