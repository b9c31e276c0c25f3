package completion

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
)

// TestFollowSize: a look at the nodes shrinks the pool (unless a grid
// of the pool now is still open), grows
// it only as far as a grid of the new size fits beside the grids open
// now (NodeCapacity.Open), and asks nothing when the size is the same.
func TestFollowSize(t *testing.T) {
	s := &Server{cfg: Config{MaxRunning: 64}, pool: PoolSize{Ranks: 2}}
	s.capPages.Store(100)
	for _, c := range []struct {
		nc        NodeCapacity
		want      int
		change    bool
		wantBound string
	}{
		{NodeCapacity{Nodes: 2, FreePages: 400, PerRank: 200, Open: 200}, 200, true, "nodes"},
		// The old grid holds its pages: no room for a larger one yet.
		{NodeCapacity{Nodes: 2, FreePages: 400, PerRank: 200, Open: 100}, 100, false, "nodes (beside the grids open now)"},
		{NodeCapacity{Nodes: 2, FreePages: 400, PerRank: 200, Open: 150}, 150, true, "nodes (beside the grids open now)"},
		{NodeCapacity{Nodes: 1, FreePages: 100, PerRank: 50, Open: 0}, 50, true, "nodes"},
		// Others took pages, but a grid of the pool now is open: it
		// holds the server's pages, no shrink.
		{NodeCapacity{Nodes: 1, FreePages: 100, PerRank: 50, Open: 0, Held: 100}, 50, false, "nodes"},
		{NodeCapacity{Nodes: 1, FreePages: 100, PerRank: 50, Open: 0, Held: 99}, 50, true, "nodes"},
		{NodeCapacity{Nodes: 1, FreePages: 200, PerRank: 100, Open: 0}, 100, false, "nodes"},
		// 64 requests of 16 pages bound it.
		{NodeCapacity{Nodes: 9, FreePages: 1 << 20, PerRank: 1 << 19, Open: 1 << 19}, 1024, true, "max running"},
	} {
		ps, change := s.followSize(c.nc, 16)
		if ps.Pages != c.want || change != c.change || ps.Bound != c.wantBound || ps.Nodes != c.nc.Nodes || ps.NodePages != c.nc.FreePages {
			t.Errorf("followSize(%+v) = %+v, %v; want %d pages (%s), %v", c.nc, ps, change, c.want, c.wantBound, c.change)
		}
	}
}

// waitFollowers waits (5 s at most) until want goroutines are in
// Server.follow (a goroutine running on another thread has no stack in
// runtime.Stack: its count may be short for a moment).
func waitFollowers(t *testing.T, want int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := runtime.Stack(buf, true)
		if n == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		got := strings.Count(string(buf[:n]), "completion.(*Server).follow(")
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines in Server.follow, want %d", got, want)
		}
	}
}

// TestServerPoolFollowsNodes: a 2 x 1 server sizes its pool from one
// node of 200 pages (100 per rank); a second node of 200 joins and the
// pool grows to 200 once the first grid closed idle (a grid of 200 fits
// then), and a request runs on a grid of that size; three long requests
// run, reserving more than 100 pages together; the second node leaves
// while the scheduler is held, the pool shrinks back to 100, and the
// newest requests go back to the queue (preempted) and every request
// still ends, completed or refused with a clear 503, none hanging; the
// nodes hold no page after, and the follower's goroutine ends with the
// server.
//
// With GridRetries 0 the requests that no longer fit cannot run again
// from their prompt: they fail with 503 pool_shrunk instead.
func TestServerPoolFollowsNodes(t *testing.T) {
	dir := writeTinyModel(t, "tiny-follow", 2048)
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := model.LoadTokenizer(dir, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("requeued", func(t *testing.T) { followNodes(t, m, tok, 1) })
	t.Run("failed", func(t *testing.T) { followNodes(t, m, tok, 0) })
}

// followNodes is TestServerPoolFollowsNodes with Config.GridRetries
// retries.
func followNodes(t *testing.T, m *model.Model, tok model.Tokenizer, retries int) {
	geo := nodetest.Geometry(1, 1, engine.Exact)
	geo.StepTimeout = 10 * time.Second
	tune := func(_ int, c *node.Config) { c.MaxPages, c.GridIdle = 200, 200*time.Millisecond }
	prefix := fmt.Sprintf("follow%d-", retries)
	nodes := nodetest.Start(t, prefix, 1, geo, tune)

	cfg := testConfig("tiny-follow")
	cfg.CapacityPages, cfg.CP, cfg.PolicyGrids, cfg.MaxRunning = 0, 2, 0, 64
	cfg.GridRetries = retries
	cfg.PrefixCaching = false
	cfg.ClusterResize = 50 * time.Millisecond
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	var hold atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	s, err := newServer(m, tok, cfg, hooks{iteration: func(ctx context.Context) {
		if hold.CompareAndSwap(true, false) {
			held <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer ts.Close()
	defer s.Close()
	if ps := s.PoolSize(); ps.Pages != 100 || ps.Nodes != 1 || ps.Ranks != 2 {
		t.Fatalf("pool %+v, want 100 pages per rank from one node of 200 for 2 ranks", ps)
	}
	waitFollowers(t, 1)
	complete(t, ts.URL, map[string]any{"model": "tiny-follow", "prompt": "abc", "max_tokens": 4, "temperature": 0})

	// A node joins.
	mc := nodetest.Member(prefix + "1")
	mc.Join = []string{nodes[0].GossipAddr()}
	ncfg := node.Config{GRPCAddr: "127.0.0.1:0", Member: mc, Engine: geo, Plaintext: true,
		MemoryLimit: memlimit.NoLimit, DrainTimeout: time.Second, MetaInterval: 100 * time.Millisecond, Version: "test"}
	tune(1, &ncfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	joined, err := node.Start(ctx, ncfg)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stopJoined := func() {
		if !stopped {
			stopped = true
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			joined.Stop(ctx)
			cancel()
		}
	}
	defer stopJoined()
	waitPool(t, s, 200)
	if st := s.Stats(); st.CapacityPages != 200 || st.PoolResizes < 1 {
		t.Errorf("after the join: stats capacity %d, resizes %d; want 200 and at least 1", st.CapacityPages, st.PoolResizes)
	}
	complete(t, ts.URL, map[string]any{"model": "tiny-follow", "prompt": "abc", "max_tokens": 4, "temperature": 0})
	// Its grid closes idle and the nodes advertise their pages free
	// again (a Create in between finds them taken: 503).
	waitFree(t, nodes[0], 400)

	// Three requests of 1500 tokens (48 pages per shard each, 144
	// together: more than 100) run; the node leaves while the scheduler
	// is held.
	type answer struct {
		status int
		body   string
	}
	answers := make(chan answer, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			b, _ := json.Marshal(map[string]any{"model": "tiny-follow", "prompt": fmt.Sprintf("request %d", i), "max_tokens": 1500, "temperature": 0})
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
			if err != nil {
				answers <- answer{0, err.Error()}
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			answers <- answer{resp.StatusCode, string(body)}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for st := s.Stats(); st.Running < 3 || st.CompletionTokens < 20; st = s.Stats() {
		if time.Now().After(deadline) || st.Failed > 0 {
			for len(answers) > 0 {
				a := <-answers
				t.Logf("answer %d %s", a.status, a.body)
			}
			t.Fatalf("the three requests did not all start decoding: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	hold.Store(true)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the scheduler did not stop at the hold")
	}
	stopJoined()
	deadline = time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		r := s.resize
		s.mu.Unlock()
		if r != nil && r.Pages == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower asked for no pool of 100 pages after the node left (asks %+v)", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(answers)
	shrunk := 0
	for a := range answers {
		switch {
		case a.status == http.StatusOK:
		case a.status == http.StatusServiceUnavailable && strings.Contains(a.body, "pool_shrunk"):
			shrunk++
			t.Logf("refused: %s", a.body)
		case a.status == http.StatusServiceUnavailable && strings.Contains(a.body, "cluster_unavailable"):
			t.Logf("refused: %s", a.body)
		default:
			t.Errorf("a request ended with %d %s; want 200 or a clear 503", a.status, a.body)
		}
	}
	st := s.Stats()
	if ps := s.PoolSize(); ps.Pages != 100 || st.CapacityPages != 100 {
		t.Errorf("after the leave: pool %+v, stats capacity %d; want 100", ps, st.CapacityPages)
	}
	if retries > 0 && st.Preemptions < 1 {
		t.Errorf("no request preempted when the pool shrank below the 144 pages reserved: %+v", st)
	}
	if retries == 0 && (st.Preemptions != 0 || shrunk < 1) {
		t.Errorf("without grid retries: %d preempted, %d refused with pool_shrunk; want none and at least one", st.Preemptions, shrunk)
	}
	if st.Running != 0 || st.Queued != 0 || st.ReservedPages != 0 {
		t.Errorf("after the requests: %d running, %d queued, %d pages reserved; want none", st.Running, st.Queued, st.ReservedPages)
	}
	t.Logf("stats after the leave: completed %d, failed %d, preemptions %d, grid retries %d, resizes %d",
		st.Completed, st.Failed, st.Preemptions, st.GridRetries, st.PoolResizes)
	ts.Close()
	waitNodes(t, nodes, s)
	waitFollowers(t, 0)
}

// waitPool waits (20 s at most) until s's pool has pages pages.
func waitPool(t *testing.T, s *Server, pages int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s.PoolSize().Pages != pages {
		if time.Now().After(deadline) {
			t.Fatalf("pool %+v, want %d pages", s.PoolSize(), pages)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFree waits (20 s at most) until the nodes that nd's coordinator
// may place on advertise want free pages in all.
func waitFree(t *testing.T, nd *node.Node, want uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		nodes, err := nd.Coordinator().Placeable(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, n := range nodes {
			sum += n.FreePages
		}
		if sum == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes advertise %v free pages, want %d in all", nodes, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTwoServersOneCluster: two servers, each on its own node's
// coordinator, size their pools from the same two nodes of 200 pages
// (200 per rank each: neither sees the other's grids before they open).
// The first's grid takes every page; the second's request is refused
// with a 503 that names the cause (another coordinator's grids), and its
// pool follows the pages left (none: its requests get 503 pool_shrunk)
// rather than over-reserving the nodes; once the first's grid closes
// idle, the second's pool grows back and its request runs. Nothing is
// left on the nodes.
func TestTwoServersOneCluster(t *testing.T) {
	dir := writeTinyModel(t, "tiny-two", 2048)
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := model.LoadTokenizer(dir, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	geo := nodetest.Geometry(1, 1, engine.Exact)
	geo.StepTimeout = 10 * time.Second
	nodes := nodetest.Start(t, "two", 2, geo, func(_ int, c *node.Config) { c.MaxPages, c.GridIdle = 200, 300*time.Millisecond })
	var servers []*Server
	var urls []string
	// The first server's scheduler stops once its request has 8 tokens,
	// until hold closes, so that the request holds its grid while the
	// second server's pool settles (2 s and more): left to run, the tiny
	// model's 1,500 tokens took about a second here and the grid closed
	// first.
	hold := make(chan struct{})
	var holdOnce sync.Once
	release := func() { holdOnce.Do(func() { close(hold) }) }
	defer release()
	var first0 atomic.Pointer[Server]
	for i := range 2 {
		cfg := testConfig("tiny-two")
		cfg.CapacityPages, cfg.CP, cfg.PolicyGrids, cfg.MaxRunning = 0, 2, 0, 64
		cfg.PrefixCaching = false
		cfg.ClusterResize = 50 * time.Millisecond
		cfg.Cluster = CoordinatorCluster(nodes[i].Coordinator())
		var h hooks
		if i == 0 {
			h.iteration = func(ctx context.Context) {
				if s := first0.Load(); s != nil && s.Stats().CompletionTokens >= 8 {
					select {
					case <-hold:
					case <-ctx.Done():
					}
				}
			}
		}
		s, ts := startServerHooks(t, m, tok, cfg, h)
		if ps := s.PoolSize(); ps.Pages != 200 {
			t.Fatalf("server %d: pool %+v, want 200 pages per rank", i, ps)
		}
		if i == 0 {
			first0.Store(s)
		}
		servers, urls = append(servers, s), append(urls, ts.URL)
	}
	// The first server's request holds its grid (both nodes' pages)
	// while the second's arrives.
	type answer struct {
		status int
		body   string
	}
	first := make(chan answer, 1)
	go func() {
		status, _, body := post(t, urls[0]+"/v1/completions", `{"model": "tiny-two", "prompt": "first", "max_tokens": 1500, "temperature": 0}`)
		first <- answer{status, string(body)}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for st := servers[0].Stats(); st.CompletionTokens < 5; st = servers[0].Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("the first server's request does not decode: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitFree(t, nodes[1], 0)
	status, _, body := post(t, urls[1]+"/v1/completions", `{"model": "tiny-two", "prompt": "second", "max_tokens": 4, "temperature": 0}`)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "another coordinator's") {
		t.Errorf("the second server's request while the first's grid holds the nodes: %d %s; want 503 naming another coordinator's grids", status, body)
	}
	// The second server's pool follows the pages left: none.
	waitPool(t, servers[1], 0)
	status, _, body = post(t, urls[1]+"/v1/completions", `{"model": "tiny-two", "prompt": "second", "max_tokens": 4, "temperature": 0}`)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "pool_shrunk") {
		t.Errorf("the second server's request on its shrunk pool: %d %s; want 503 pool_shrunk", status, body)
	}
	if ps := servers[0].PoolSize(); ps.Pages != 200 {
		t.Errorf("the first server's pool %+v: want 200 still (its own grid's pages count as its own)", ps)
	}
	release()
	if a := <-first; a.status != http.StatusOK {
		t.Errorf("the first server's request: %d %s", a.status, a.body)
	}
	// Its grid closes idle: the second server's pool grows back.
	waitPool(t, servers[1], 200)
	complete(t, urls[1], map[string]any{"model": "tiny-two", "prompt": "second", "max_tokens": 4, "temperature": 0})
	if st := servers[1].Stats(); st.Refused != 1 || st.Failed != 1 || st.PoolResizes != 2 {
		t.Errorf("the second server's stats: refused %d, failed %d, resizes %d; want 1, 1, 2", st.Refused, st.Failed, st.PoolResizes)
	}
	waitNodes(t, nodes, servers...)
}

// TestTwoServersKeepGrids: a server whose pool counted on pages that
// another server's grids took since keeps its pool while its own grid
// of that pool is open (those pages are its own), and serves on: the
// first server (a 2 x 1 grid and 1 grid of own options: 4 ranks) gets
// 200 pages per rank from two nodes of 400 and opens its grid (200 on
// each node); the second (2 ranks) sizes 400, finds 200 left on each
// node, is refused with a clear 503 and follows them down to 200, opens
// its grid there, and the nodes are full. The first server's look now
// gives its 4 ranks 100 pages each, yet it keeps 200 and its requests
// complete on its grid.
func TestTwoServersKeepGrids(t *testing.T) {
	dir := writeTinyModel(t, "tiny-keep", 2048)
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := model.LoadTokenizer(dir, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	geo := nodetest.Geometry(1, 1, engine.Exact)
	geo.StepTimeout = 10 * time.Second
	nodes := nodetest.Start(t, "keep", 2, geo, func(_ int, c *node.Config) { c.MaxPages = 400 })
	var servers []*Server
	var urls []string
	for i, grids := range []int{1, 0} {
		cfg := testConfig("tiny-keep")
		cfg.CapacityPages, cfg.CP, cfg.PolicyGrids, cfg.MaxRunning = 0, 2, grids, 64
		cfg.PrefixCaching = false
		cfg.ClusterResize = 50 * time.Millisecond
		cfg.Cluster = CoordinatorCluster(nodes[i].Coordinator())
		s, ts := startServer(t, m, tok, cfg)
		servers, urls = append(servers, s), append(urls, ts.URL)
	}
	if p0, p1 := servers[0].PoolSize().Pages, servers[1].PoolSize().Pages; p0 != 200 || p1 != 400 {
		t.Fatalf("pools %d and %d pages per rank, want 200 and 400", p0, p1)
	}
	req := map[string]any{"model": "tiny-keep", "prompt": "abc", "max_tokens": 4, "temperature": 0}
	complete(t, urls[0], req)
	waitFree(t, nodes[1], 400)
	status, _, body := post(t, urls[1]+"/v1/completions", `{"model": "tiny-keep", "prompt": "abc", "max_tokens": 4, "temperature": 0}`)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), "another coordinator's") {
		t.Errorf("the second server's request beside the first's grid: %d %s; want 503 naming another coordinator's grids", status, body)
	}
	waitPool(t, servers[1], 200)
	complete(t, urls[1], req)
	waitFree(t, nodes[0], 0)
	// Longer than the follower's settling: the first server keeps its
	// pool, and serves on its grid.
	time.Sleep(3 * followSettle / 2)
	if ps := servers[0].PoolSize(); ps.Pages != 200 || servers[0].Stats().PoolResizes != 0 {
		t.Errorf("the first server's pool %+v after %d resizes; want 200 and none (its grid is open)", ps, servers[0].Stats().PoolResizes)
	}
	complete(t, urls[0], req)
	waitNodes(t, nodes, servers...)
}
