package completion

import (
	"fmt"
	"testing"
)

// TestClusterPrefixCacheMatchesSolo is runPrefixMix in the cluster
// layout: on a 2-node cluster with a CP = 2 grid spanning both nodes
// (the cache serves forks of its cluster sequences), with a small pool
// and a bound on the cache, and a larger unbounded one; the reference
// is a server of the same cluster without caching. At the end the
// cache holds entries, and closing the servers leaves nothing on the
// nodes.
func TestClusterPrefixCacheMatchesSolo(t *testing.T) {
	m, tok := tinyModel(t)
	for _, c := range []struct{ capacity, bound int }{{128, 24}, {256, 0}} {
		t.Run(fmt.Sprintf("capacity %d bound %d", c.capacity, c.bound), func(t *testing.T) {
			nodes := startCluster(t, "cprefix")
			cfg := testConfig("tiny")
			cfg.CP = 2
			cfg.CapacityPages = c.capacity
			cfg.PrefixCachePages = c.bound
			cfg.MaxRunning = 4
			cfg.ChunkTokens = 128
			cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
			s, ts := startServer(t, m, tok, cfg)
			ref := cfg
			ref.PrefixCaching = false
			ref.CapacityPages = c.capacity - 8 // a grid of its own: the two servers' admissions are their own
			rs, refTS := startServer(t, m, tok, ref)
			st := runPrefixMix(t, s, ts.URL, rs, refTS.URL, prefixMix{
				seed: uint64(c.capacity), docs: []int{40, 300, 700},
				requests: 20, questions: 5, maxTokens: 10, parallel: 4,
			})
			if st.PrefixCacheEntries == 0 {
				t.Errorf("the cache holds no entry at the end: %+v", st)
			}
			waitNodes(t, nodes, s, rs)
		})
	}
}

// TestClusterPrefixCachePrefillsRest is prefixPrefillsRest in the
// cluster layout: the second request forks the first's cached pages on
// a CP = 2 grid spanning both nodes, and the nodes end with nothing.
func TestClusterPrefixCachePrefillsRest(t *testing.T) {
	m, tok := tinyModel(t)
	nodes := startCluster(t, "crest")
	cfg := testConfig("tiny")
	cfg.CP = 2
	cfg.CapacityPages = 256
	cfg.PrefixCachePages = 200 // room for the whole shared prefix
	cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	s, ts := startServer(t, m, tok, cfg)
	ref := cfg
	ref.PrefixCaching = false
	ref.CapacityPages = 200 // a grid of its own
	rs, refTS := startServer(t, m, tok, ref)
	prefixPrefillsRest(t, s, ts.URL, refTS.URL)
	waitNodes(t, nodes, s, rs)
}
