package completion

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// openFDs counts this process's open file descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(ents)
}

// TestCancelledStreams: 1,000 streaming requests whose clients go away
// (before the first token, or after one to three chunks) leave no
// sequence, page, reservation, goroutine or file descriptor behind, and
// are counted as cancelled.
func TestCancelledStreams(t *testing.T) {
	m, tok := tinyModel(t)
	cfg := testConfig("tiny")
	cfg.MaxRunning, cfg.MaxQueued = 16, 64
	cfg.CapacityPages = 80 * 130 // 80 requests of 2000+ tokens
	s, ts := startServer(t, m, tok, cfg)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	body := `{"model": "tiny", "prompt": "Tell me a long story.", "max_tokens": 2000, "temperature": 0, "stream": true}`
	// A whole request first, so that what the runtime opens lazily
	// (the network poller) is open before counting.
	resp, err := client.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(strings.Replace(body, "2000", "3", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if text, finish, _ := streamText(t, sseEvents(t, resp.Body)); finish != "length" || text == "" {
		t.Fatalf("warm-up stream: %q %q", text, finish)
	}
	resp.Body.Close()
	tr.CloseIdleConnections()
	time.Sleep(50 * time.Millisecond)
	fds := openFDs(t)
	leaks := goleak.IgnoreCurrent()

	const total, clients = 1000, 32
	work := make(chan int)
	var midStream atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(body))
				resp, err := client.Do(req)
				if err != nil {
					cancel()
					t.Errorf("request %d: %v", i, err)
					continue
				}
				if resp.StatusCode != 200 {
					t.Errorf("request %d: %s", i, resp.Status)
				}
				r := bufio.NewReader(resp.Body)
				ok := true
				for chunks := 0; chunks < i%4; {
					line, err := r.ReadString('\n')
					if err != nil || strings.Contains(line, "[DONE]") {
						ok = false
						t.Errorf("request %d ended before it was cancelled: %q %v", i, line, err)
						break
					}
					if strings.HasPrefix(line, "data: ") {
						chunks++
					}
				}
				if ok {
					midStream.Add(1)
				}
				cancel()
				resp.Body.Close()
			}
		}()
	}
	for i := range total {
		work <- i
	}
	close(work)
	wg.Wait()
	st := waitStats(t, s, "every cancelled request gone", func(st Stats) bool { return st.Running+st.Queued == 0 })
	if midStream.Load() != total || st.Admitted != total+1 || st.Cancelled != total || st.Completed != 1 || st.Failed != 0 {
		t.Errorf("%d cancelled mid-stream; stats %+v", midStream.Load(), st)
	}
	if st.ReservedPages != 0 || st.EngineSequences != st.PrefixCacheEntries || st.UsedPages != st.PrefixCachePages {
		t.Errorf("left behind: %+v", st)
	}
	tr.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for openFDs(t) > fds && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := openFDs(t); n > fds {
		t.Errorf("%d file descriptors open after the requests, %d before", n, fds)
	}
	goleak.VerifyNone(t, leaks)
	t.Logf("%d requests cancelled; %d decode steps of %.1f sequences on average", total, st.Steps, float64(st.StepSequences)/float64(max(st.Steps, 1)))
}
