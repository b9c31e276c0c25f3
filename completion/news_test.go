package completion

import (
	"context"
	"runtime"
	"testing"
)

// TestNewsResultBeforeCancel: a job the scheduler ends posts its result,
// then cancels the job's context (end). A handler reading the job's news
// at any moment around that must find the result, never a client gone:
// news sees the context end only after the post that preceded it. The
// handler and the scheduler race here many times; reading the result and
// the context in the other order failed this on CI's 2 cores (a device
// server's first answer was a 499 it never should have been).
func TestNewsResultBeforeCancel(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("the race needs two Ps")
	}
	s := &Server{}
	const rounds = 5000
	for i := range rounds {
		ctx, cancel := context.WithCancel(context.Background())
		j := &job{ctx: ctx, cancel: cancel, notify: make(chan struct{}, 1)}
		start := make(chan struct{})
		go func() {
			<-start
			j.post([]byte("x"), &result{finish: "stop"})
			j.cancel()
		}()
		var text []byte
		close(start)
		for {
			t0, _, done, res := s.news(j)
			text = append(text, t0...)
			if done {
				if res.err != nil {
					t.Fatalf("round %d: the posted result read as %d %s", i, res.err.status, res.err.code)
				}
				if res.finish != "stop" || string(text) != "x" {
					t.Fatalf("round %d: finish %q text %q, want stop and x", i, res.finish, text)
				}
				break
			}
		}
	}
}
