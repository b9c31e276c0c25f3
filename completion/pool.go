package completion

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// DefaultMemoryFraction is Config.MemoryFraction's default: the share of
// the available memory that a pool sized from memory (CapacityPages 0)
// takes. vLLM's gpu_memory_utilization (0.9) is a share of the whole
// GPU that its KV cache gets after the weights and activations; here the
// weights are loaded before the memory is read, and the rest stays free
// for what the CPU serving holds beside the pool: the float32 copy of
// the keys and values of every prompt prefilled on the CPU while the
// prefix cache keeps it (up to a quarter of the pool by default), the
// prefill's activations and the Go heap.
const DefaultMemoryFraction = 0.5

// PoolSize says how a Server's page pool was sized (Server.PoolSize).
type PoolSize struct {
	// Pages is the pool per shard (Config.CapacityPages once resolved).
	Pages int
	// FromMemory is true when CapacityPages was 0 and the pool was sized
	// from the memory available; the fields below are set only then.
	FromMemory bool
	// Available is the memory available when New ran (bytes;
	// memlimit.Available, capped by a positive MemoryLimit), Fraction
	// the share of it the pool may take.
	Available int64
	Fraction  float64
	// PageBytes is the host memory one page per shard costs over every
	// shard of the grid (all CP x TP pools, summaries and metadata
	// included); FixedBytes what the pools cost besides their pages.
	PageBytes, FixedBytes int64
	// Bound names what bounded Pages: "memory", "max running" (no more
	// pages than MaxRunning requests of the longest context can reserve
	// at once) or "plan" (plan.MaxPages).
	Bound string
	// Device is true when the pool was sized from the free memory of
	// the Backend's device (pages DeviceResident) instead of the host's:
	// then Available is the device's free memory when New ran (after the
	// executor's weights and workspace), Total the device's memory,
	// Fraction Config.DeviceMemoryFraction (the share of Total the
	// process takes in all: vLLM's gpu_memory_utilization), Budget
	// what that leaves for the pool (Fraction x Total - (Total -
	// Available)), and PageBytes and FixedBytes device bytes
	// (Engines.DeviceBytes: FixedBytes holds the backend's scratch).
	Device        bool
	Total, Budget int64
	// Cluster is true when CapacityPages was 0 and the pool was sized
	// from the free pages the cluster's nodes report (Config.Cluster a
	// ClusterCapacity): then Nodes is how many nodes a grid could be
	// placed on, NodePages their free pages summed, and Ranks the ranks
	// the pool was sized for (CP x TP x (1 + PolicyGrids): the server's
	// grid and every grid of requests' own options, each rank reserving
	// the pool plus the monitor's slack on its node). Bound is "nodes"
	// when the nodes' pages bounded Pages. As the pool follows the nodes
	// (Config.ClusterResize), Server.PoolSize reports the look that
	// resized it last; a growth bounded by what fits beside the grids
	// open then says so in Bound.
	Cluster   bool
	Nodes     int
	NodePages uint64
	Ranks     int
}

// Bytes is the memory of the pool (FixedBytes + Pages x PageBytes): the
// host's, or the device's with Device; 0 when it was not sized from
// memory.
func (p PoolSize) Bytes() int64 {
	return memlimit.Add(p.FixedBytes, memlimit.Mul(int64(p.Pages), p.PageBytes))
}

// poolPages is the arithmetic of a pool sized from memory: the most
// pages p such that fixed + (p + slack) x perPage <= fraction x avail,
// bounded by maxRunning requests of need pages each (need 0: no such
// bound) and by plan.MaxPages. It returns 0 pages when not even one
// fits; the caller refuses a pool smaller than one request.
func poolPages(avail int64, fraction float64, fixed, perPage int64, slack, need, maxRunning int) (int, string) {
	budget := math.Floor(float64(avail) * fraction)
	if perPage <= 0 || budget <= float64(fixed) {
		return 0, "memory"
	}
	return boundPages(int64((budget-float64(fixed))/float64(perPage))-int64(slack), need, maxRunning)
}

// boundPages bounds the pages that memory holds (bound "memory") by
// maxRunning requests of need pages each (need 0: no such bound) and by
// plan.MaxPages (at least 0).
func boundPages(pages int64, need, maxRunning int) (int, string) {
	bound := "memory"
	if need > 0 {
		if most := int64(need) * int64(maxRunning); most < pages {
			pages, bound = most, "max running"
		}
	}
	if pages > plan.MaxPages {
		pages, bound = plan.MaxPages, "plan"
	}
	return int(max(pages, 0)), bound
}

// sizePool resolves cfg.CapacityPages 0 for a server of model geometry
// s.m and context bound maxContext: the pool takes cfg.MemoryFraction of
// the memory available (cfg.MemAvailable, else memlimit.Available;
// capped by a positive MemoryLimit), at most MaxRunning requests of
// maxContext tokens, and must hold one request of maxContext tokens.
func (s *Server) sizePool(cfg Config, maxContext int) (PoolSize, error) {
	if cfg.Cluster == nil && cfg.Backend != nil && cfg.DeviceResident {
		return s.sizeDevicePool(cfg, maxContext)
	}
	if cc, ok := cfg.Cluster.(ClusterCapacity); ok {
		return s.sizeClusterPool(cfg, cc, maxContext)
	}
	if cfg.Cluster != nil || cfg.Backend != nil || cfg.Decoder != nil {
		return PoolSize{}, fmt.Errorf("serve config: capacity 0 pages sizes the pool from this host's memory, from the device's with a Backend's DeviceResident pages, or from the nodes' free pages with a Cluster that reports them (ClusterCapacity); with another Cluster, or a Backend without DeviceResident, give CapacityPages (questd --serve-capacity-pages)")
	}
	read := cfg.MemAvailable
	if read == nil {
		read = memlimit.Available
	}
	avail, err := read()
	if err != nil {
		return PoolSize{}, fmt.Errorf("serve: size the pool from memory (or give questd --serve-capacity-pages): %w", err)
	}
	if cfg.MemoryLimit > 0 && cfg.MemoryLimit < avail {
		avail = cfg.MemoryLimit
	}
	one, err := cfg.Engines.HostBytes(s.gridSpec(cfg.Policy, 1))
	if err != nil {
		return PoolSize{}, fmt.Errorf("serve: size the pool from memory: %w", err)
	}
	two, err := cfg.Engines.HostBytes(s.gridSpec(cfg.Policy, 2))
	if err != nil {
		return PoolSize{}, fmt.Errorf("serve: size the pool from memory: %w", err)
	}
	ps := PoolSize{FromMemory: true, Available: avail, Fraction: cfg.MemoryFraction, PageBytes: two - one}
	ps.FixedBytes = one - ps.PageBytes
	need := 0
	if maxContext > 0 {
		need = s.pagesFor(maxContext)
	}
	ps.Pages, ps.Bound = poolPages(avail, cfg.MemoryFraction, ps.FixedBytes, ps.PageBytes, s.monitorSlack(), need, cfg.MaxRunning)
	if ps.Pages < max(need, 1) {
		return ps, fmt.Errorf("serve: a pool of %.2f of the %s of memory available holds %d pages per shard (%s a page over the %d x %d shards); one request of max_model_len %d tokens needs %d: lower questd --max-model-len, raise --serve-memory-fraction or give --serve-capacity-pages: %w",
			cfg.MemoryFraction, memlimit.Bytes(avail), ps.Pages, memlimit.Bytes(ps.PageBytes), cfg.TP, cfg.CP, maxContext, max(need, 1), memlimit.ErrTooLarge)
	}
	return ps, nil
}

// sizeDevicePool resolves cfg.CapacityPages 0 for a pool of
// DeviceResident pages on cfg.Backend's device: the device's memory is
// read now, once the caller allocated the executor's weights and
// workspace there, and the pool takes what cfg.DeviceMemoryFraction of
// the device's total leaves (memlimit.ReadDevice), at Engines.DeviceBytes
// a page, at most MaxRunning requests of maxContext tokens and
// plan.MaxPages; it must hold one request of maxContext tokens.
func (s *Server) sizeDevicePool(cfg Config, maxContext int) (PoolSize, error) {
	dm, ok := cfg.Backend.(memlimit.DeviceMemory)
	if !ok {
		return PoolSize{}, fmt.Errorf("serve config: capacity 0 pages sizes the pool from the device's free memory, which backend %s does not report: give CapacityPages (questd --serve-capacity-pages)", cfg.Backend.Name())
	}
	b, err := memlimit.ReadDevice(context.Background(), dm, cfg.DeviceMemoryFraction)
	if err != nil {
		return PoolSize{}, fmt.Errorf("serve: size the pool from the device's memory (or give questd --serve-capacity-pages): %w", err)
	}
	one, err := cfg.Engines.DeviceBytes(s.gridSpec(cfg.Policy, 1))
	if err != nil {
		return PoolSize{}, fmt.Errorf("serve: size the pool from the device's memory: %w", err)
	}
	two, err := cfg.Engines.DeviceBytes(s.gridSpec(cfg.Policy, 2))
	if err != nil {
		return PoolSize{}, fmt.Errorf("serve: size the pool from the device's memory: %w", err)
	}
	ps := PoolSize{FromMemory: true, Device: true, Available: b.Free, Total: b.Total, Budget: b.Bytes,
		Fraction: b.Fraction, PageBytes: two - one}
	ps.FixedBytes = one - ps.PageBytes
	need := 0
	if maxContext > 0 {
		need = s.pagesFor(maxContext)
	}
	// The engine's pool is CapacityPages plus the quality monitor's
	// slack (see New), as the host path counts it.
	ps.Pages, ps.Bound = boundPages(max(0, b.Fit(ps.FixedBytes, ps.PageBytes)-int64(s.monitorSlack())), need, cfg.MaxRunning)
	if ps.Pages < max(need, 1) {
		return ps, fmt.Errorf("serve: the device's pool holds %d pages (%s a page, %s beside them) in the %s that %.2f of its %s leaves with %s free after the weights and workspace; one request of max_model_len %d tokens needs %d: lower questd --max-model-len, raise --gpu-memory-utilization or give --serve-capacity-pages: %w",
			ps.Pages, memlimit.Bytes(ps.PageBytes), memlimit.Bytes(ps.FixedBytes), memlimit.Bytes(b.Bytes), b.Fraction, memlimit.Bytes(b.Total), memlimit.Bytes(b.Free), maxContext, max(need, 1), memlimit.ErrTooLarge)
	}
	return ps, nil
}

// ErrNoClusterCapacity means that no node of the cluster reported free
// pages enough for the server's grids within Config.ClusterWait, when
// CapacityPages 0 sizes the pool from them.
var ErrNoClusterCapacity = errors.New("serve: no cluster capacity for the pool")

// ClusterCapacity is a Cluster that reports the pages its nodes can
// still host, so that CapacityPages 0 sizes the pool from them
// (internal/serveengine's CoordinatorCluster). RankPages is called from
// New, before any sequence is created, and then every
// Config.ClusterResize from a goroutine of the server's, concurrently
// with Create.
type ClusterCapacity interface {
	Cluster
	// RankPages reports the nodes that a grid may be placed on now (the
	// membership's nodes less those placement refuses): how many, their
	// free pages summed, and the most pages each of ranks equal ranks
	// can reserve on them together (cluster.RankPages over
	// cluster.NodesOf; placement's rule), the pools of the grids this
	// Cluster created the server's sequences on counted as free on
	// their nodes. ctx bounds it.
	RankPages(ctx context.Context, ranks int) (NodeCapacity, error)
}

// NodeCapacity is what a ClusterCapacity reports: Nodes nodes with
// FreePages pages free in all (the server's own grids' pools counted
// free), of which PerRank pages each for the ranks asked about; Open is
// what each of them can reserve beside the server's grids open now
// (PerRank when it has none), and Held the largest pool per rank of the
// server's grids open now (the monitor's slack included; 0: none).
type NodeCapacity struct {
	Nodes     int
	FreePages uint64
	PerRank   uint64
	Open      uint64
	Held      uint64
}

// sizeClusterPool resolves cfg.CapacityPages 0 with a Cluster that
// reports its nodes' free pages. Every rank of a grid reserves the
// whole pool (plus the monitor's slack) on the node placement puts it
// on: CP shards a sequence's pages over its CP ranks and TP its heads
// over its TP ranks, and either way each rank holds a pool of
// CapacityPages pages, a node hosting as many ranks as its free pages
// hold pools (cluster.PlaceGrid). The server opens its own grid and up
// to PolicyGrids grids of requests' own options, CP x TP ranks each, so
// the pool is the most pages per rank with which all those ranks fit
// the nodes' free pages together (cluster.RankPages; grids of one pool
// placed in turn fit exactly when that holds), less the slack, at most
// MaxRunning requests of maxContext tokens and plan.MaxPages. It asks
// the cluster until the pool holds one request of maxContext tokens, for
// cfg.ClusterWait at most (a node that just started may not see its
// peers yet), then fails with ErrNoClusterCapacity naming the numbers.
func (s *Server) sizeClusterPool(cfg Config, cc ClusterCapacity, maxContext int) (PoolSize, error) {
	need := 0
	if maxContext > 0 {
		need = s.pagesFor(maxContext)
	}
	ps := PoolSize{Cluster: true, Ranks: cfg.CP * cfg.TP * (1 + cfg.PolicyGrids)}
	deadline := time.Now().Add(cfg.ClusterWait)
	// A look (the last one at the deadline too) takes what the
	// cluster's answer takes, up to 5s.
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(5*time.Second))
	defer cancel()
	var err error
	for wait, looks := 20*time.Millisecond, 1; ; wait, looks = min(2*wait, 500*time.Millisecond), looks+1 {
		var nc NodeCapacity
		if nc, err = cc.RankPages(ctx, ps.Ranks); err == nil {
			ps.Nodes, ps.NodePages = nc.Nodes, nc.FreePages
			ps.Pages, ps.Bound = s.clusterPages(nc.PerRank, need, cfg.MaxRunning)
			if ps.Pages >= max(need, 1) {
				return ps, nil
			}
		}
		if looks == 1 && cfg.Logger != nil {
			cfg.Logger.Info("waiting for the cluster's nodes to report free pages for the serving pool", "wait", cfg.ClusterWait,
				"nodes", ps.Nodes, "free_pages", ps.NodePages, "ranks", ps.Ranks, "pages_per_rank", ps.Pages, "need", max(need, 1), "err", err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			if err != nil {
				return ps, fmt.Errorf("%w: size it from the nodes' free pages (or give questd --serve-capacity-pages) for %v: %w", ErrNoClusterCapacity, cfg.ClusterWait, err)
			}
			return ps, fmt.Errorf("%w: after %v, %d node(s) report %d free pages, where %d ranks (a %d x %d grid, and %d grids of requests' own options beside the server's) get %d pages each (beside %d of the monitor's); one request of max_model_len %d tokens needs %d pages per rank: add nodes or free pages (questd --max-pages), lower --max-model-len or --serve-policy-grids, or give --serve-capacity-pages",
				ErrNoClusterCapacity, cfg.ClusterWait, ps.Nodes, ps.NodePages, ps.Ranks, cfg.CP, cfg.TP, cfg.PolicyGrids, ps.Pages, s.monitorSlack(), maxContext, max(need, 1))
		}
		// Looks back off from 20ms to 500ms, the last at the deadline.
		t := time.NewTimer(min(wait, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return ps, fmt.Errorf("%w: size it from the nodes' free pages: %w", ErrNoClusterCapacity, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// clusterPages is the pool of ranks that can each reserve perRank pages
// on the nodes: less the monitor's slack, at most maxRunning requests
// of need pages and plan.MaxPages; the bound "nodes" when the nodes'
// pages bounded it.
func (s *Server) clusterPages(perRank uint64, need, maxRunning int) (int, string) {
	rank := int64(min(perRank, math.MaxInt64))
	pages, bound := boundPages(rank-int64(s.monitorSlack()), need, maxRunning)
	if bound == "memory" {
		bound = "nodes"
	}
	return pages, bound
}
