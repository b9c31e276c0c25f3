package main

import (
	"github.com/questrt/questrt/cluster/node"
	"github.com/questrt/questrt/internal/serveengine"
	"github.com/questrt/questrt/plan"
	completion "github.com/questrt/questrt/serve"
)

// defaultServePages is the pool of --serve-capacity-pages 0 with
// --serve-layout cluster, whose pages are in the workers' memory (which
// check their own).
const defaultServePages = 4096

// servePages is the serving pool the serve package gets: Serve.CapacityPages, or
// with 0 defaultServePages for the cluster layout, and 0 for local
// (sized from this host's memory by serve.New) and device (from the
// GPU's memory once the executor is loaded, --gpu-memory-utilization).
func (c Config) servePages() int { return c.Serve.pages() }

// pages is the serving pool: CapacityPages, or with 0 defaultServePages
// for the cluster layout, and 0 (sized from memory) for local and device.
func (s ServeConfig) pages() int {
	if s.CapacityPages == 0 && s.Layout == "cluster" {
		return defaultServePages
	}
	return s.CapacityPages
}

// servePagesPerRank is the pages every rank of the served grid reserves
// on its node with --serve-layout cluster: --serve-capacity-pages, and
// the quality monitor's forks (--monitor-queue) with --monitor-rate.
func (c Config) servePagesPerRank() int {
	if c.Serve.MonitorRate > 0 {
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
