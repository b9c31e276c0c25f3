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
func (c Config) httpServer() httpServerConfig { return c.HTTP.server() }

// server is the defaults of httpServerConfig with the group's bounds.
func (h HTTPConfig) server() httpServerConfig {
	s := defaultHTTPServerConfig()
	s.MaxConns, s.ReadHeaderTimeout, s.IdleTimeout = h.MaxConns, h.ReadHeaderTimeout, h.IdleTimeout
	return s
}

// hostPages is the number of pages this node hosts over all grids:
// MaxPages, or 8 x CapacityPages when it is 0.
func (c Config) hostPages() int {
	if c.Capacity.MaxPages == 0 {
		return 8 * c.Grid.CapacityPages
	}
	return c.Capacity.MaxPages
}

// engineConfig is the engine configuration of the cluster's grid: the
// geometry, the CP x TP grid, the policy and the selection mode that every
// node and coordinator share, and the offload settings of the grids this
// node coordinates.
func (c Config) engineConfig() engine.Config {
	e := engine.DefaultConfig()
	e.Layers = c.Grid.Layers
	e.Geometry = c.Grid.Geometry
	e.CP, e.TP, e.CapacityPages, e.BlockPages = c.Grid.CP, c.Grid.TP, c.Grid.CapacityPages, c.Grid.BlockPages
	e.Policy = c.Policy.policy(c.Grid.PageSize)
	e.Selection = c.Policy.Selection
	e.StepTimeout = c.Grid.StepTimeout
	e.MemoryLimit = c.Capacity.MaxMemory
	e.Settings = c.Offload.Settings
	return e
}

// policy is the selection policy of the group for pages of pageSize
// tokens (the grid's).
func (p PolicyConfig) policy(pageSize int) plan.Policy {
	return plan.Policy{PageSize: pageSize, BudgetTokens: p.BudgetTokens, SinkPages: p.SinkPages,
		LocalPages: p.LocalPages, DenseLayers: p.DenseLayers, DenseRho: p.DenseRho, ReuseSteps: p.ReuseSteps,
		ReuseLayers: slices.Clone(p.ReuseLayers), GQA: p.GQA, Selector: p.Selector, LayerBudget: p.LayerBudget}
}

// memberConfig is the membership configuration of this node: name, gossip
// bind and advertise addresses, join addresses, label, keys and failure
// detection; the rest are cluster.DefaultMemberConfig's. Meta and Logger
// are left for main to set.
func (c Config) memberConfig() cluster.MemberConfig {
	m := cluster.DefaultMemberConfig()
	m.Name = c.Node.Name
	host, port, _ := splitAddr("gossip-addr", c.Membership.GossipAddr)
	if host == "" {
		host = "0.0.0.0"
	}
	m.BindAddr, m.BindPort = host, port
	m.AdvertiseAddr = c.advertiseHost()
	m.Join = slices.Clone(c.Membership.Join)
	m.Label = c.Membership.Label
	m.SecretKeys = slices.Clone(c.Membership.Keys)
	m.ProbeInterval = c.Membership.ProbeInterval
	m.ProbeTimeout = c.Membership.ProbeTimeout
	m.SuspicionMult = c.Membership.SuspicionMult
	m.GossipInterval = c.Membership.GossipInterval
	m.DeadNodeReclaimTime = c.Membership.DeadNodeReclaim
	return m
}
