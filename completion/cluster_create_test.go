package completion

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
)

// slowCluster holds every Create after the first until release is
// closed (a grid opening, as the coordinator's OpenGrid and adoption do,
// up to its open timeout each), without heeding ctx; started is closed
// when the second Create begins.
type slowCluster struct {
	Cluster
	n                atomic.Int32
	started, release chan struct{}
}

func (c *slowCluster) Create(ctx context.Context, spec GridSpec) (model.Sequence, error) {
	switch c.n.Add(1) {
	case 1:
	case 2:
		close(c.started)
		<-c.release
	default:
		<-c.release
	}
	return c.Cluster.Create(ctx, spec)
}

// heldCluster holds every Create until release is closed, without
// heeding ctx, and counts the Creates that started.
type heldCluster struct {
	Cluster
	started chan struct{} // one send per Create
	release chan struct{}
}

func (c *heldCluster) Create(ctx context.Context, spec GridSpec) (model.Sequence, error) {
	c.started <- struct{}{}
	<-c.release
	return c.Cluster.Create(ctx, spec)
}

// TestClusterCreateOffScheduler: while one request's Create waits (a
// grid opening), a running request's stream goes on decoding: the
// scheduler does not call Cluster.Create itself.
func TestClusterCreateOffScheduler(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	prompt, _ := passkeyPrompt(t, dir)
	nodes := startCluster(t, "stall")
	cfg := testConfig("v1")
	cfg.CapacityPages = 256
	sc := &slowCluster{Cluster: CoordinatorCluster(nodes[0].Coordinator()), started: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(sc.release) }) }
	defer release()
	cfg.Cluster = sc
	s, ts := startServer(t, m, tok, cfg)

	b, _ := json.Marshal(map[string]any{"model": "v1", "prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": true})
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	scn := bufio.NewScanner(resp.Body)
	chunks := 0
	for chunks < 3 && scn.Scan() {
		if strings.HasPrefix(scn.Text(), "data: ") {
			chunks++
		}
	}
	other := make(chan error, 1)
	go func() {
		r, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model": "v1", "prompt": "The pass key is", "max_tokens": 2}`))
		if err == nil {
			if r.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", r.StatusCode)
			}
			r.Body.Close()
		}
		other <- err
	}()
	// While the other request's Create is held, the running stream
	// must go on: 20 more chunks (a scheduler that called Create itself
	// would send none until the release; the scan then ends with the
	// test's deadline, or with the stream).
	select {
	case <-sc.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the second request's Create did not start in 30 s")
	}
	read := make(chan int, 1)
	go func() {
		n := 0
		for n < 20 && scn.Scan() {
			if strings.HasPrefix(scn.Text(), "data: ") {
				n++
			}
		}
		read <- n
	}()
	select {
	case n := <-read:
		if n < 20 {
			t.Errorf("the running stream ended after %d chunks while another request's Create was held: %v", n, scn.Err())
		}
	case <-time.After(60 * time.Second):
		t.Error("the running stream sent fewer than 20 chunks in 60 s while another request's Create was held: it stalled")
		resp.Body.Close() // ends the scan
		<-read
	}
	release()
	if err := <-other; err != nil {
		t.Errorf("the request whose Create waited: %v", err)
	}
	resp.Body.Close()
	waitStats(t, s, "both requests' sequences released", func(st Stats) bool { return st.Running == 0 && st.EngineSequences == st.PrefixCacheEntries })
	waitNodes(t, nodes, s)
}

// TestClusterCreateAbandoned: a request whose client goes away while
// its Create waits leaves at once (its running slot and pages freed),
// and the sequence the Create makes afterwards is released; so is one
// still being created when the server closes.
func TestClusterCreateAbandoned(t *testing.T) {
	m, tok, _ := passkeyModel(t)
	nodes := startCluster(t, "abandon")
	cfg := testConfig("v1")
	cfg.CapacityPages = 128
	hc := &heldCluster{Cluster: CoordinatorCluster(nodes[0].Coordinator()), started: make(chan struct{}, 8), release: make(chan struct{})}
	cfg.Cluster = hc
	s, ts := startServer(t, m, tok, cfg)

	ctx, cancel := context.WithCancel(t.Context())
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(`{"model": "v1", "prompt": "The pass key is", "max_tokens": 4}`))
	hr.Header.Set("Content-Type", "application/json")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r, err := http.DefaultClient.Do(hr); err == nil {
			r.Body.Close()
		}
	}()
	<-hc.started
	cancel()
	<-done
	st := waitStats(t, s, "the abandoned request gone", func(st Stats) bool { return st.Cancelled == 1 && st.Running == 0 })
	if st.ReservedPages != 0 {
		t.Errorf("stats %+v", st)
	}
	close(hc.release)
	waitStats(t, s, "the late sequence released", func(st Stats) bool { return st.EngineSequences == st.PrefixCacheEntries })
	waitNodes(t, nodes)

	// A Create in flight at Close: Close waits for it and releases its
	// sequence.
	hc2 := &heldCluster{Cluster: CoordinatorCluster(nodes[0].Coordinator()), started: make(chan struct{}, 8), release: make(chan struct{})}
	cfg.Cluster = hc2
	s2, err := New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts2 := httptest.NewServer(s2)
	defer ts2.Close()
	answered := make(chan int, 1)
	go func() {
		r, err := http.Post(ts2.URL+"/v1/completions", "application/json", strings.NewReader(`{"model": "v1", "prompt": "The pass key is", "max_tokens": 4}`))
		if err != nil {
			answered <- 0
			return
		}
		r.Body.Close()
		answered <- r.StatusCode
	}()
	<-hc2.started
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		s2.Close()
	}()
	if status := <-answered; status != http.StatusServiceUnavailable {
		t.Errorf("request of a closing server: status %d, want 503", status)
	}
	close(hc2.release)
	<-closed
	if st := s2.Stats(); st.EngineSequences != st.PrefixCacheEntries || st.Running != 0 {
		t.Errorf("closed server's stats %+v", st)
	}
	waitNodes(t, nodes)
}

// TestClusterPolicyGridsBounded: on a cluster, the grids of request
// option sets other than the server's policy stay open, so the server
// opens at most Config.PolicyGrids of them: a request with yet another
// option set gets 429 with Retry-After naming the limit (never the
// cluster's 503 for pages its grids reserved), while requests with the
// server's options or those of an open grid keep being served.
func TestClusterPolicyGridsBounded(t *testing.T) {
	m, tok, _ := passkeyModel(t)
	nodes := startCluster(t, "bound")
	cfg := testConfig("v1")
	cfg.CapacityPages = 128
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	if cfg.PolicyGrids != 2 {
		t.Fatalf("default PolicyGrids %d, want 2", cfg.PolicyGrids)
	}
	s, ts := startServer(t, m, tok, cfg)
	req := func(sink int) string {
		return `{"model": "v1", "prompt": "The pass key is", "max_tokens": 1, "quest": {"sink": ` + itoa(sink) + `}}`
	}
	for sink := 1; sink <= 20; sink++ {
		status, h, body := post(t, ts.URL+"/v1/completions", req(sink))
		if sink <= cfg.PolicyGrids {
			if status != http.StatusOK {
				t.Fatalf("request with quest.sink %d: status %d (%s)", sink, status, body)
			}
			continue
		}
		var e ErrorBody
		if err := json.Unmarshal(body, &e); err != nil || status != http.StatusTooManyRequests || h.Get("Retry-After") == "" ||
			e.Error.Code == nil || *e.Error.Code != "policy_grid_limit" || !strings.Contains(e.Error.Message, "limit of 2 such grids") {
			st := s.Stats()
			t.Fatalf("request with quest.sink %d: status %d, Retry-After %q (%s); running %d, cluster sequences %d, grids coordinated %d",
				sink, status, h.Get("Retry-After"), body, st.Running, st.EngineSequences, nodes[0].Stats().GridsCoordinated)
		}
	}
	// The open grids' option sets and the server's own still run.
	for _, body := range []string{req(1), req(2), `{"model": "v1", "prompt": "The pass key is", "max_tokens": 1}`} {
		if status, _, b := post(t, ts.URL+"/v1/completions", body); status != http.StatusOK {
			t.Fatalf("%s: status %d (%s)", body, status, b)
		}
	}
	st := s.Stats()
	if st.PolicyGrids != 2 || st.PolicyGridsRefused != 18 || st.Refused != 18 || st.Failed != 0 || st.EngineSequences != st.PrefixCacheEntries {
		t.Errorf("stats %+v", st)
	}
	if g := nodes[0].Stats().GridsCoordinated; g != 3 {
		t.Errorf("node 0 coordinates %d grids, want 3 (the server's policy and 2 option sets)", g)
	}
	waitNodes(t, nodes, s)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestClusterAdoptedReleased: the cluster's nodes stop with a request's
// sequence alive and restart on their data directories; the grid the
// next server's first request opens adopts the persisted sequence,
// which nobody holds: the server releases it, so once its request is
// done nothing is left on the workers or the coordinator.
func TestClusterAdoptedReleased(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	prompt, _ := passkeyPrompt(t, dir)
	dirs := []string{t.TempDir(), t.TempDir()}
	persist := func(i int, c *node.Config) { c.DataDir = dirs[i] }
	geo := nodetest.Geometry(1, 1, engine.Exact)
	// The step timeout bounds the prompt's appends too: with Geometry's
	// 2 s the first request failed in its prefill on a loaded machine
	// (stats: Failed 1, Steps 0), so no sequence was alive to persist.
	geo.StepTimeout = 10 * time.Second
	nodes := nodetest.Start(t, "adopt", 2, geo, persist)
	cfg := testConfig("v1")
	cfg.CP = 2
	cfg.CapacityPages = 128
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	// Once the stream has text, the first server's scheduler parks
	// before its next iteration until the server closes: the sequence
	// stays alive, and no step of it runs, while the nodes stop.
	var park atomic.Bool
	parked := make(chan struct{})
	var parkOnce sync.Once
	s1, err := newServer(m, tok, cfg, hooks{iteration: func(ctx context.Context) {
		if park.Load() {
			parkOnce.Do(func() { close(parked) })
			<-ctx.Done()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ts1 := httptest.NewServer(s1)
	b, _ := json.Marshal(map[string]any{"model": "v1", "prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": true})
	resp, err := http.Post(ts1.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	scn := bufio.NewScanner(resp.Body)
	var events []string
	for len(events) < 3 && scn.Scan() {
		if d, ok := strings.CutPrefix(scn.Text(), "data: "); ok {
			events = append(events, d)
		}
	}
	// Three chunks of text: a stream that ended (an error event) leaves
	// no live sequence to persist.
	if len(events) < 3 || slices.ContainsFunc(events, func(e string) bool { return !strings.Contains(e, `"text"`) }) {
		t.Fatalf("the first request's stream before the stop: %q; want three chunks of text", events)
	}
	park.Store(true)
	parkAt := time.Now()
	select {
	case <-parked:
		t.Logf("the first server's scheduler parked %v after the third chunk", time.Since(parkAt))
	case <-time.After(60 * time.Second):
		t.Fatalf("the first server's scheduler did not park in 60 s: %+v", s1.Stats())
	}
	// The nodes stop (persisting the live sequence), then the server.
	for _, nd := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		nd.Stop(ctx)
		cancel()
	}
	resp.Body.Close()
	ts1.Close()
	s1.Close()

	nodes = nodetest.Start(t, "adopt", 2, geo, persist)
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	s, ts := startServer(t, m, tok, cfg)
	complete(t, ts.URL, map[string]any{"model": "v1", "prompt": "The pass key is", "max_tokens": 2})
	recovered := 0
	for _, nd := range nodes {
		recovered += nd.Stats().Recovery.Sequences
	}
	if recovered == 0 {
		t.Fatalf("the restarted nodes recovered no sequence (node stats %+v)", nodes[0].Stats().Recovery)
	}
	if rec := nodes[0].Coordinator().Recovery(); len(rec.Sequences) != 0 {
		t.Errorf("adopted sequences left: %+v", rec.Sequences)
	}
	if st := s.Stats(); st.EngineSequences != st.PrefixCacheEntries || st.Completed != 1 {
		t.Errorf("stats %+v", st)
	}
	waitNodes(t, nodes, s)
}
