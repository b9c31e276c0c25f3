package main

import (
	"github.com/questrt/questrt/cluster/node"
	"github.com/questrt/questrt/internal/serveengine"
	completion "github.com/questrt/questrt/serve"
)

// servePagesPerRank is the pages every rank of the served grid reserves
// on its node with --serve-layout cluster: --serve-capacity-pages, and
// the quality monitor's forks (--monitor-queue) with --monitor-rate.
func (c Config) servePagesPerRank() int {
	if c.MonitorRate > 0 {
		return c.ServePages + c.MonitorQueue
	}
	return c.ServePages
}

// serveCluster is where the completions API keeps its requests'
// sequences: nil for --serve-layout local (an in-process engine), the
// node's coordinator for cluster (grids of --serve-cp x --serve-tp ranks
// over the cluster's nodes).
func (c Config) serveCluster(n *node.Node) completion.Cluster {
	if c.ServeLayout != "cluster" || n == nil {
		return nil
	}
	return serveengine.CoordinatorCluster(n.Coordinator())
}
