package main

import (
	"slices"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// httpServer is the connection bounds of the completions API's HTTP
// server: the defaults with the --http-* flags (forMetrics derives the
// metrics server's).
func (c Config) httpServer() httpServerConfig {
	h := defaultHTTPServerConfig()
	h.MaxConns, h.ReadHeaderTimeout, h.IdleTimeout = c.HTTPMaxConns, c.HTTPReadHeaderTimeout, c.HTTPIdleTimeout
	return h
}

// hostPages is the number of pages this node hosts over all grids:
// MaxPages, or 8 x CapacityPages when it is 0.
func (c Config) hostPages() int {
	if c.MaxPages == 0 {
		return 8 * c.CapacityPages
	}
	return c.MaxPages
}

// engineConfig is the engine configuration of the cluster's grid: the
// geometry, the CP x TP grid, the policy and the selection mode that every
// node and coordinator share, and the offload settings of the grids this
// node coordinates.
func (c Config) engineConfig() engine.Config {
	e := engine.DefaultConfig()
	e.Layers = c.Layers
	e.Geometry = plan.Geometry{QHeads: c.QHeads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize, DType: plan.Float32}
	e.CP, e.TP, e.CapacityPages, e.BlockPages = c.CP, c.TP, c.CapacityPages, c.BlockPages
	e.Policy = plan.Policy{PageSize: c.PageSize, BudgetTokens: c.BudgetTokens, SinkPages: c.SinkPages,
		LocalPages: c.LocalPages, DenseLayers: c.DenseLayers, DenseRho: c.DenseRho, ReuseSteps: c.ReuseSteps, GQA: c.GQA, Selector: c.Selector, LayerBudget: c.LayerBudget}
	e.Selection = c.Selection
	e.StepTimeout = c.StepTimeout
	e.MemoryLimit = c.MaxMemory
	e.DeviceBudgetPages, e.Eviction = c.DeviceBudgetPages, c.Eviction
	e.PrefetchPages, e.PrefetchCrossLayer = c.PrefetchPages, c.PrefetchCrossLayer
	return e
}

// memberConfig is the membership configuration of this node: name, gossip
// bind and advertise addresses, join addresses, label, keys and failure
// detection; the rest are cluster.DefaultMemberConfig's. Meta and Logger
// are left for main to set.
func (c Config) memberConfig() cluster.MemberConfig {
	m := cluster.DefaultMemberConfig()
	m.Name = c.Name
	host, port, _ := splitAddr("gossip-addr", c.GossipAddr)
	if host == "" {
		host = "0.0.0.0"
	}
	m.BindAddr, m.BindPort = host, port
	m.AdvertiseAddr = c.advertiseHost()
	m.Join = slices.Clone(c.Join)
	m.Label = c.ClusterLabel
	m.SecretKeys = slices.Clone(c.GossipKeys)
	m.ProbeInterval = c.ProbeInterval
	m.ProbeTimeout = c.ProbeTimeout
	m.SuspicionMult = c.SuspicionMult
	m.GossipInterval = c.GossipInterval
	m.DeadNodeReclaimTime = c.DeadNodeReclaim
	return m
}
