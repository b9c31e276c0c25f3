package completion

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
)

// startCluster starts a 2-node in-process cluster (real gossip and gRPC
// on loopback) and returns its nodes; node 0 coordinates the served
// sequences.
func startCluster(t *testing.T, prefix string) []*node.Node {
	t.Helper()
	// The nodes' own engine config does not matter: the server creates
	// every sequence with the model's geometry and its grid. Only the
	// step timeout is the nodes', and it bounds a prefill chunk's append
	// too: Geometry's 2 s failed a prompt chunk's append to the remote
	// shard under -race on a loaded 2-core machine (TestClusterPrefixCachePrefillsRest:
	// "append seq 1 layer 0 on shard (tp 0, cp 1): remote worker:
	// DeadlineExceeded"). These tests see lost nodes through their
	// connections, not through that deadline.
	geo := nodetest.Geometry(1, 1, engine.Exact)
	geo.StepTimeout = 10 * time.Second
	return nodetest.Start(t, prefix, 2, geo, nil)
}

// pagesInUse is the pages in use in the shards every node hosts.
func pagesInUse(nodes []*node.Node) []int {
	var n []int
	for _, nd := range nodes {
		st := nd.Stats()
		n = append(n, st.PagesDevice+st.PagesHost)
	}
	return n
}

// waitNodes waits (10 s at most) until node 0 coordinates no sequence
// but those of the servers' prefix caches (every request's released),
// then closes the servers, which releases their caches' sequences, and
// waits until every node's pages in use are 0 and node 0 coordinates no
// sequence.
func waitNodes(t *testing.T, nodes []*node.Node, servers ...*Server) {
	t.Helper()
	waitFor(t, nodes, func() (int, bool) {
		cached := 0
		for _, s := range servers {
			cached += s.Stats().PrefixCacheEntries
		}
		return cached, true
	})
	for _, s := range servers {
		s.Close()
	}
	waitFor(t, nodes, func() (int, bool) { return 0, false })
}

// waitFor waits (10 s at most) until node 0 coordinates want()'s
// sequences and, unless want says pages may be in use, every node's
// pages in use are 0.
func waitFor(t *testing.T, nodes []*node.Node, want func() (seqs int, pagesUsed bool)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pages := pagesInUse(nodes)
		seqs := nodes[0].Stats().Sequences
		n, used := want()
		if seqs == n && (used || !slices.ContainsFunc(pages, func(p int) bool { return p != 0 })) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes still hold pages %v and %d sequences, want %d sequences", pages, seqs, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClusterServing: with CP = 2 on a 2-node cluster, a greedy passkey
// completion (and its stream) gets exactly the tokens, pages read and
// pages total of the in-process engine with the same grid (and the
// text and pages read of a single-shard one), and the pass key; the grid's ranks are on both nodes, and once the requests are
// done no node holds a page or a sequence. TP = 2 over the cluster gets
// the same tokens.
func TestClusterServing(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	prompt, key := passkeyPrompt(t, dir)
	nodes := startCluster(t, "serve")

	cfg := testConfig("v1")
	cfg.CP = 2
	cfg.CapacityPages = 256
	cfg.Policy.BudgetTokens = 128
	local, lts := startServer(t, m, tok, cfg)
	cc := cfg
	cc.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	remote, rts := startServer(t, m, tok, cc)

	req := map[string]any{"model": "v1", "prompt": prompt, "max_tokens": 8, "temperature": 0}
	lc, rc := complete(t, lts.URL, req), complete(t, rts.URL, req)
	lr, rr := local.hist.get(lc.ID), remote.hist.get(rc.ID)
	if lr == nil || rr == nil {
		t.Fatal("no history records")
	}
	if !slices.Equal(lr.OutputTokens, rr.OutputTokens) || *lc.Usage != *rc.Usage {
		t.Fatalf("cluster %v %+v, in process %v %+v", rr.OutputTokens, *rc.Usage, lr.OutputTokens, *lc.Usage)
	}
	// The single-shard in-process engine picks the same tokens (exact
	// selection equals one shard's).
	one := cfg
	one.CP = 1
	_, ots := startServer(t, m, tok, one)
	if oc := complete(t, ots.URL, req); oc.Choices[0].Text != rc.Choices[0].Text || oc.Usage.PagesRead != rc.Usage.PagesRead {
		t.Errorf("cluster %q %+v, in process cp 1 %q %+v", rc.Choices[0].Text, *rc.Usage, oc.Choices[0].Text, *oc.Usage)
	}
	if !strings.HasPrefix(rc.Choices[0].Text, key) || rc.Usage.PagesRead >= rc.Usage.PagesTotal {
		t.Errorf("cluster completion %q (usage %+v), want the pass key %q and fewer pages read than dense", rc.Choices[0].Text, *rc.Usage, key)
	}
	req["stream"] = true
	req["stream_options"] = map[string]any{"include_usage": true}
	b, _ := json.Marshal(req)
	resp, err := http.Post(rts.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	text, finish, su := streamText(t, sseEvents(t, resp.Body))
	resp.Body.Close()
	if text != rc.Choices[0].Text || finish != *rc.Choices[0].FinishReason || su == nil || uncached(*su) != uncached(*rc.Usage) {
		t.Errorf("cluster stream %q %s %+v, want %q %s %+v", text, finish, su, rc.Choices[0].Text, *rc.Choices[0].FinishReason, *rc.Usage)
	}
	// The same prompt again: the prefix cache gave every full page
	// before its last token (997 tokens: 62 pages of 16), forked on
	// the grid.
	if su != nil && su.PromptTokensDetails.CachedTokens != 992 {
		t.Errorf("cluster stream of the same prompt: %d cached tokens, want 992", su.PromptTokensDetails.CachedTokens)
	}
	for i, nd := range nodes {
		if st := nd.Stats(); st.GridsHosted != 1 {
			t.Errorf("node %d hosts %d grids, want the served grid's rank", i, st.GridsHosted)
		}
	}
	if g := nodes[0].Stats().GridsCoordinated; g != 1 {
		t.Errorf("node 0 coordinates %d grids, want 1", g)
	}
	waitFor(t, nodes, func() (int, bool) { return remote.Stats().PrefixCacheEntries, true })
	if st := remote.Stats(); st.Completed != 2 || st.EngineSequences != st.PrefixCacheEntries || st.ReservedPages != 0 || st.UsedPages != 0 ||
		st.PrefixCacheEntries != 1 || st.PrefixCacheHits != 1 {
		t.Errorf("cluster server stats %+v", st)
	}
	if st := local.Stats(); st.EngineSequences != st.PrefixCacheEntries {
		t.Errorf("in-process server stats %+v", local.Stats())
	}
	// TP = 2 over the cluster (a KV head per node) too.
	tp := cc
	tp.CP, tp.TP = 1, 2
	tps, tts := startServer(t, m, tok, tp)
	delete(req, "stream")
	delete(req, "stream_options")
	if tc := complete(t, tts.URL, req); tc.Choices[0].Text != rc.Choices[0].Text || *tc.Usage != *rc.Usage {
		t.Errorf("cluster tp 2 %q %+v, cp 2 %q %+v", tc.Choices[0].Text, *tc.Usage, rc.Choices[0].Text, *rc.Usage)
	}
	// n = 3: the prompt's sequence forked on the grid for two choices;
	// each choice and the usage equal the in-process server's.
	nreq := map[string]any{"model": "v1", "prompt": prompt, "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 3}
	rn, ln := complete(t, rts.URL, nreq), complete(t, lts.URL, nreq)
	for i := range 3 {
		if len(rn.Choices) != 3 || rn.Choices[i].Text != ln.Choices[i].Text || rn.Choices[i].Index != i {
			t.Fatalf("cluster n = 3 %+v, in process %+v", rn.Choices, ln.Choices)
		}
	}
	if uncached(*rn.Usage) != uncached(*ln.Usage) || rn.Usage.PromptTokens != rc.Usage.PromptTokens {
		t.Errorf("cluster n = 3 usage %+v, in process %+v", *rn.Usage, *ln.Usage)
	}
	if st := remote.Stats(); st.EngineSequences != st.PrefixCacheEntries || st.ReservedPages != 0 {
		t.Errorf("cluster server stats after n = 3 %+v", st)
	}
	waitNodes(t, nodes, remote, tps)
}

// TestClusterOwnPolicyMonitored: on the cluster, requests whose
// selection options are not the server's run on a grid of their policy
// (one per policy, shared), the quality monitor replays their steps on
// forks through the coordinator, and nothing is left on the workers.
func TestClusterOwnPolicyMonitored(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	prompt, _ := passkeyPrompt(t, dir)
	nodes := startCluster(t, "own")
	var log sampleLog
	cfg := testConfig("v1")
	cfg.CP = 2
	cfg.CapacityPages = 128
	cfg.Policy.BudgetTokens = 128
	cfg.Monitor = MonitorConfig{Rate: 0.3, Queue: 8, Observe: log.add}
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	s, ts := startServer(t, m, tok, cfg)
	for _, q := range []map[string]any{{"selector": "oracle"}, {"selector": "oracle"}, {}} {
		complete(t, ts.URL, map[string]any{"model": "v1", "prompt": prompt, "max_tokens": 4, "temperature": 0, "quest": q})
	}
	st := waitStats(t, s, "the replays", func(st Stats) bool {
		return st.MonitorReplayed+st.MonitorFailed == st.MonitorSampled && st.EngineSequences == st.PrefixCacheEntries
	})
	if st.OwnEngines != 2 || st.MonitorFailed != 0 || st.MonitorReplayed == 0 || len(log.all()) != int(st.MonitorReplayed) {
		t.Errorf("stats %+v, %d samples", st, len(log.all()))
	}
	if g := nodes[0].Stats().GridsCoordinated; g != 2 {
		t.Errorf("node 0 coordinates %d grids, want 2 (the server's policy and the oracle's)", g)
	}
	waitNodes(t, nodes, s)
}

// TestClusterCancel: a stream served through the cluster whose client
// goes away mid-stream frees its sequence on the workers: the pages in
// use go back to 0 on every node, and the request counts as cancelled.
func TestClusterCancel(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	prompt, _ := passkeyPrompt(t, dir)
	nodes := startCluster(t, "cancel")
	cfg := testConfig("v1")
	cfg.CP = 2
	cfg.CapacityPages = 256
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	s, ts := startServer(t, m, tok, cfg)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	b, _ := json.Marshal(map[string]any{"model": "v1", "prompt": prompt, "max_tokens": 2000, "temperature": 0, "stream": true})
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(string(b)))
	hr.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for chunks < 3 && sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			chunks++
		}
	}
	if chunks < 3 {
		t.Fatalf("%d chunks before the stream ended (%v)", chunks, sc.Err())
	}
	// Mid-stream, both CP ranks hold pages of the sequence.
	if p := pagesInUse(nodes); p[0] == 0 || p[1] == 0 {
		t.Errorf("pages in use mid-stream %v: want pages on both nodes", p)
	}
	cancel()
	st := waitStats(t, s, "the cancelled stream", func(st Stats) bool { return st.Cancelled == 1 && st.EngineSequences == st.PrefixCacheEntries })
	if st.Running != 0 || st.ReservedPages != 0 || st.Completed != 0 {
		t.Errorf("stats %+v", st)
	}
	waitNodes(t, nodes, s)
}

// TestClusterUnavailable: when the cluster has no room for the grid (a
// pool per rank beyond every node's pages) an admitted request gets 503
// with Retry-After, and nothing is left behind.
func TestClusterUnavailable(t *testing.T) {
	m, tok, _ := passkeyModel(t)
	nodes := startCluster(t, "full")
	cfg := testConfig("v1")
	cfg.CP = 2
	cfg.CapacityPages = 4096 // the nodes host 8 x 128 pages
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	s, ts := startServer(t, m, tok, cfg)
	status, h, body := post(t, ts.URL+"/v1/completions", `{"model": "v1", "prompt": "The pass key is", "max_tokens": 4}`)
	var e ErrorBody
	if err := json.Unmarshal(body, &e); err != nil || status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" ||
		e.Error.Code == nil || *e.Error.Code != "cluster_unavailable" {
		t.Fatalf("status %d, Retry-After %q: %s (%v)", status, h.Get("Retry-After"), body, err)
	}
	if st := s.Stats(); st.Failed != 1 || st.EngineSequences != st.PrefixCacheEntries || st.ReservedPages != 0 {
		t.Errorf("stats %+v", st)
	}
	waitNodes(t, nodes, s)
}

// TestClusterConfig: a grid the model's geometry cannot take is refused
// by New, with or without a cluster.
func TestClusterConfig(t *testing.T) {
	m, tok, _ := passkeyModel(t) // 2 KV heads
	for _, cl := range []Cluster{nil, CoordinatorCluster(nil)} {
		cfg := testConfig("v1")
		cfg.TP = 3
		cfg.Cluster = cl
		if s, err := New(m, tok, cfg); err == nil || !strings.Contains(err.Error(), "tp 3") {
			if s != nil {
				s.Close()
			}
			t.Errorf("cluster %v: tp 3: %v, want an error naming tp 3", cl != nil, err)
		}
	}
}
