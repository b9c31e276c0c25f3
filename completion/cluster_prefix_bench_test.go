package completion

import (
	"fmt"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/node/nodetest"
)

// BenchmarkClusterPrefixCacheTTFT is benchPrefixTTFT in the cluster
// layout: passkey-llama-v1 (CPU) served over a 2-node loopback cluster
// (real gossip and gRPC) whose CP = 2 grid spans both nodes (the
// warm-up request opens the grid); the second request forks the first's
// cached cluster sequence.
func BenchmarkClusterPrefixCacheTTFT(b *testing.B) {
	benchPrefixTTFT(b, func(b *testing.B, i int, cfg *Config) {
		// Pools of 4,096 pages a node: the grid's ranks take 1,024.
		nodes := nodetest.Start(b, fmt.Sprintf("ttft%d-", i), 2, nodetest.Geometry(1, 1, engine.Exact), func(_ int, c *node.Config) { c.MaxPages = 4096 })
		cfg.CP = 2
		cfg.CapacityPages = 1024
		cfg.PrefixCachePages = 600 // the whole prefix: 513 pages over 2 ranks
		cfg.Cluster = CoordinatorCluster(nodes[0].Coordinator())
	})
}
