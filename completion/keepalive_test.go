package completion

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSSEKeepAlive: while a streamed request waits (its scheduler held,
// as during a long prefill), the stream writes ": keep-alive" comments
// every SSEKeepAlive; once the scheduler runs, the chunks and [DONE]
// follow as without them. With SSEKeepAlive 0 a held stream stays
// silent.
func TestSSEKeepAlive(t *testing.T) {
	for _, every := range []time.Duration{20 * time.Millisecond, 0} {
		cfg := testConfig("tiny")
		cfg.SSEKeepAlive = every
		s, ts, release := held(t, cfg)
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
			strings.NewReader(`{"model": "tiny", "prompt": "abc", "max_tokens": 3, "temperature": 0, "stream": true}`))
		if err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// While held: keep-alives only (or nothing). With keep-alives on,
		// the hold lasts until three have come: a fixed window (200 ms,
		// ten periods) saw only two on a loaded machine under -race. The
		// deadline stays under the 15 s default, so a stream that ignored
		// the configured period would still fail. Without keep-alives the
		// stream must stay silent for 200 ms.
		window := 200 * time.Millisecond
		if every > 0 {
			window = 10 * time.Second
		}
		hold := time.After(window)
		start := time.Now()
		kept := 0
	held:
		for every == 0 || kept < 3 {
			select {
			case l := <-lines:
				switch l {
				case ": keep-alive":
					kept++
				case "":
				default:
					t.Fatalf("every %v: %q while the scheduler was held", every, l)
				}
			case <-hold:
				break held
			}
		}
		if (every > 0) != (kept >= 3) || (every == 0 && kept != 0) {
			t.Errorf("every %v: %d keep-alives in %v", every, kept, time.Since(start))
		}
		release()
		var data []string
		for l := range lines {
			if d, ok := strings.CutPrefix(l, "data: "); ok {
				data = append(data, d)
			}
		}
		resp.Body.Close()
		if len(data) < 2 || data[len(data)-1] != "[DONE]" {
			t.Errorf("every %v: the stream after the hold: %q", every, data)
		}
		waitStats(t, s, "the stream done", func(st Stats) bool { return st.Completed == 1 })
	}
}
