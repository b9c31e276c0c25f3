package main

import (
	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/serveengine"
	"github.com/questrt/questrt/node"
	"github.com/questrt/questrt/plan"
)

// servePages is the serving pool the serve package gets:
// Serve.CapacityPages, whose 0 completion.New sizes from this host's memory
// (local), from the GPU's once the executor is loaded (device,
// --gpu-memory-utilization) or from the free pages the cluster's nodes
// advertise in their membership metadata (cluster: the coordinator's
// Cluster reports them, completion.ClusterCapacity).
func (c Config) servePages() int { return c.Serve.pages() }

// pages is the serving pool: CapacityPages, 0 when sized from memory or
// the nodes' pages.
func (s ServeConfig) pages() int { return s.CapacityPages }

// servePagesPerRank is the pages every rank of the served grid reserves
// on its node with --serve-layout cluster: --serve-capacity-pages, and
// the quality monitor's forks (--monitor-queue) with --monitor-rate; 0
// when the pool is sized from the nodes' pages (the monitor's slack is
// then taken off the pool).
func (c Config) servePagesPerRank() int {
	if c.servePages() > 0 && c.Serve.MonitorRate > 0 {
		return c.servePages() + c.Serve.MonitorQueue
	}
	return c.servePages()
}

// serveCluster is where the completions API keeps its requests'
// sequences: nil for --serve-layout local (an in-process engine), the
// node's coordinator for cluster (grids of --serve-cp x --serve-tp ranks
// over the cluster's nodes).
func (c Config) serveCluster(n *node.Node) completion.Cluster {
	if c.Serve.Layout != "cluster" || n == nil {
		return nil
	}
	return serveengine.CoordinatorCluster(n.Coordinator())
}

// devicePrefills reports whether --serve-layout device prefills prompts
// on the GPU (--device-prefill) for pages of dt: the GPU's prefill
// attention reads bf16, f16 and fp8 pages (kernels/cuda PrefillWith),
// not f32.
func devicePrefills(dt plan.DType) bool {
	return dt == plan.BFloat16 || dt == plan.Float16 || dt == plan.FP8
}
