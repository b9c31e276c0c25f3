package completion

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
)

// capacityCluster is a ClusterCapacity whose nodes report free pages
// from a script: look i (from 0) gets nodes(i). It creates nothing.
type capacityCluster struct {
	Cluster
	looks atomic.Int32
	nodes func(look int) ([]cluster.NodeInfo, error)
}

func (c *capacityCluster) RankPages(ctx context.Context, ranks int) (NodeCapacity, error) {
	nodes, err := c.nodes(int(c.looks.Add(1)) - 1)
	if err != nil {
		return NodeCapacity{}, err
	}
	nc := NodeCapacity{Nodes: len(nodes), PerRank: cluster.RankPages(nodes, ranks)}
	for _, n := range nodes {
		nc.FreePages += n.FreePages
	}
	return nc, nil
}

// threeNodes are free pages of 3000, 1700 and 1100: 2 ranks (a 2 x 1
// grid alone) get 1700 pages each (one on each of the first two nodes;
// at 1701 only the first holds one), 6 ranks (the grid and 2 grids of
// requests' own options) 850 (3 + 2 + 1 pools; at 851, 3 + 1 + 1).
var threeNodes = []cluster.NodeInfo{{Name: "a", FreePages: 3000}, {Name: "b", FreePages: 1700}, {Name: "c", FreePages: 1100}}

// TestServerPoolFromCluster: CapacityPages 0 with a Cluster that
// reports its nodes' free pages sizes the pool per rank from them,
// worked by hand: every rank of the server's grid and of PolicyGrids
// grids of own options reserves the pool on a node, less the
// monitor's slack, at most MaxRunning requests of the longest context;
// New waits for nodes that report pages, and fails with
// ErrNoClusterCapacity after ClusterWait when none do; a given pool is
// used as given.
func TestServerPoolFromCluster(t *testing.T) {
	dir := writeTinyModel(t, "tiny-cpool", 4096) // 256 pages of 16 tokens a request
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := model.LoadTokenizer(dir, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	fixed := func(nodes []cluster.NodeInfo) func(int) ([]cluster.NodeInfo, error) {
		return func(int) ([]cluster.NodeInfo, error) { return nodes, nil }
	}
	for _, c := range []struct {
		name               string
		cp, tp, grids, run int
		monitor            bool
		nodes              func(int) ([]cluster.NodeInfo, error)
		want               int
		bound              string
		wantNodes          int
		wantFree           uint64
	}{
		{"grids", 2, 1, 2, 16, false, fixed(threeNodes), 850, "nodes", 3, 5800},
		{"one grid", 2, 1, 0, 16, false, fixed(threeNodes), 1700, "nodes", 3, 5800},
		// 2 x 2 ranks x 3 grids = 12: 428 pages (7 + 3 + 2 pools; at
		// 429, 6 + 3 + 2).
		{"tp", 2, 2, 2, 16, false, fixed(threeNodes), 428, "nodes", 3, 5800},
		// The monitor's 64 pages of slack per rank come off 850.
		{"monitor", 2, 1, 2, 16, true, fixed(threeNodes), 786, "nodes", 3, 5800},
		// 4 requests of 256 pages under one node's 100000.
		{"max running", 1, 1, 0, 4, false, fixed([]cluster.NodeInfo{{Name: "a", FreePages: 100000}}), 4 * 256, "max running", 1, 100000},
		// No node for 3 looks, then one, then three.
		{"waits", 2, 1, 2, 16, false, func(i int) ([]cluster.NodeInfo, error) {
			switch {
			case i < 3:
				return nil, nil
			case i < 5:
				return nil, errors.New("vetting")
			}
			return threeNodes, nil
		}, 850, "nodes", 3, 5800},
	} {
		cfg := testConfig("tiny-cpool")
		cfg.CapacityPages = 0
		cfg.CP, cfg.TP, cfg.PolicyGrids, cfg.MaxRunning = c.cp, c.tp, c.grids, c.run
		if c.monitor {
			cfg.Monitor.Rate = 0.1
		}
		cfg.ClusterWait = 20 * time.Second
		cfg.MemAvailable = func() (int64, error) { t.Error("host memory read for a cluster's pool"); return 0, nil }
		cc := &capacityCluster{nodes: c.nodes}
		cfg.Cluster = cc
		s, err := New(m, tok, cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ps := s.PoolSize()
		ranks := c.cp * c.tp * (1 + c.grids)
		if !ps.Cluster || ps.FromMemory || ps.Pages != c.want || ps.Bound != c.bound || ps.Ranks != ranks || ps.Nodes != c.wantNodes || ps.NodePages != c.wantFree {
			t.Errorf("%s: pool %+v, want %d pages (%s) for %d ranks on %d nodes of %d free pages", c.name, ps, c.want, c.bound, ranks, c.wantNodes, c.wantFree)
		}
		if st := s.Stats(); st.CapacityPages != c.want {
			t.Errorf("%s: Stats().CapacityPages %d, want %d", c.name, st.CapacityPages, c.want)
		}
		s.Close()
	}

	// No node reports pages: New fails after ClusterWait, not before and
	// not much after, naming the flags.
	for _, c := range []struct {
		name  string
		nodes func(int) ([]cluster.NodeInfo, error)
		want  []string
	}{
		{"no nodes", func(int) ([]cluster.NodeInfo, error) { return nil, nil },
			[]string{"0 node(s) report 0 free pages", "--serve-capacity-pages", "--max-pages", "4096 tokens needs 128 pages per rank"}},
		// 2 x 1 x 3 ranks of 100 pages: fewer than one request's 128.
		{"too few pages", fixed([]cluster.NodeInfo{{Name: "a", FreePages: 600}}),
			[]string{"1 node(s) report 600 free pages", "6 ranks", "get 100 pages each", "--serve-policy-grids"}},
		{"errors", func(int) ([]cluster.NodeInfo, error) { return nil, errors.New("vetting failed") },
			[]string{"vetting failed", "--serve-capacity-pages"}},
	} {
		cfg := testConfig("tiny-cpool")
		cfg.CapacityPages, cfg.CP = 0, 2
		cfg.ClusterWait = 300 * time.Millisecond
		cfg.Cluster = &capacityCluster{nodes: c.nodes}
		start := time.Now()
		s, err := New(m, tok, cfg)
		took := time.Since(start)
		if err == nil {
			s.Close()
			t.Fatalf("%s: New succeeded", c.name)
		}
		if !errors.Is(err, ErrNoClusterCapacity) {
			t.Errorf("%s: %v does not wrap ErrNoClusterCapacity", c.name, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", c.name, err, w)
			}
		}
		if took < 250*time.Millisecond || took > 5*time.Second {
			t.Errorf("%s: New failed after %v, want about the 300ms of ClusterWait", c.name, took)
		}
	}

	// A prefix cache bound above the 850 pages sized is refused.
	cfg := testConfig("tiny-cpool")
	cfg.CapacityPages, cfg.CP, cfg.PrefixCachePages = 0, 2, 851
	cfg.Cluster = &capacityCluster{nodes: fixed(threeNodes)}
	if s, err := New(m, tok, cfg); err == nil || !strings.Contains(err.Error(), "prefix cache 851 pages: more than the 850 pages of the pool sized from the nodes' free pages") {
		if err == nil {
			s.Close()
		}
		t.Errorf("prefix cache above the pool: %v", err)
	}

	// A given pool is used as given: the nodes are not asked.
	cfg = testConfig("tiny-cpool")
	cfg.CapacityPages = 300
	cfg.Cluster = &capacityCluster{nodes: func(int) ([]cluster.NodeInfo, error) {
		t.Error("nodes asked for an explicit pool")
		return nil, nil
	}}
	s, err := New(m, tok, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ps := s.PoolSize(); ps.Cluster || ps.Pages != 300 {
		t.Errorf("explicit pool: %+v, want 300 pages as given", ps)
	}
	s.Close()
}

// TestServerPoolFromNodes: on three in-process nodes of 3000, 1700 and
// 1100 pages (node.Config.MaxPages, which their membership metadata
// advertises as free), a 2 x 1 server with 2 grids of own options gets
// 850 pages per rank from the coordinator's Cluster (see threeNodes);
// its grid opens on the nodes at that pool, a request completes, and
// the nodes' free pages drop by the grid's two pools of 850.
func TestServerPoolFromNodes(t *testing.T) {
	dir := writeTinyModel(t, "tiny-npool", 4096)
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
	max := []int{3000, 1700, 1100}
	nodes := nodetest.Start(t, "npool", 3, geo, func(i int, c *node.Config) { c.MaxPages = max[i] })
	cfg := testConfig("tiny-npool")
	cfg.CapacityPages, cfg.CP, cfg.PolicyGrids = 0, 2, 2
	cfg.PrefixCaching = false
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	s, ts := startServer(t, m, tok, cfg)
	if ps := s.PoolSize(); !ps.Cluster || ps.Pages != 850 || ps.Nodes != 3 || ps.NodePages != 5800 || ps.Ranks != 6 || ps.Bound != "nodes" {
		t.Fatalf("pool %+v, want 850 pages per rank from 3 nodes of 5800 free pages for 6 ranks", ps)
	}
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(`{"model": "tiny-npool", "prompt": "abc", "max_tokens": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || out.Usage.CompletionTokens != 2 {
		t.Fatalf("completion: %d %+v %v", resp.StatusCode, out, err)
	}
	// The grid's two ranks reserve 850 pages each; the nodes advertise
	// what is left (every MetaInterval, 100ms here).
	deadline := time.Now().Add(10 * time.Second)
	for {
		free, err := nodes[0].Coordinator().Placeable(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, n := range free {
			sum += n.FreePages
		}
		if sum == 5800-2*850 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes report %v free pages, want %d in all after the grid opened", free, 5800-2*850)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitNodes(t, nodes, s)
}
