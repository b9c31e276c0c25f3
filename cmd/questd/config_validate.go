package main

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	completion "github.com/questrt/questrt/serve"
)

// checkMember applies set to a valid member config and reports whether
// cluster accepts the result: the rules of cluster.MemberConfig, kept in
// one place.
func checkMember(set func(*cluster.MemberConfig)) error {
	m := cluster.DefaultMemberConfig()
	m.Name = "questd"
	set(&m)
	return m.Validate()
}

// Validate reports the first setting that breaks its rule, as
// `--flag "value": why`. It checks every flag, the cross checks of
// engine.Config.Validate and cluster.MemberConfig.Validate, and that
// mutual TLS is all or nothing. It does no I/O (the files are read by
// loadConfig and main).
func (c Config) Validate() error {
	itoa := strconv.Itoa
	if err := checkMember(func(m *cluster.MemberConfig) { m.Name = c.Node.Name }); err != nil {
		if c.Node.Name == "" {
			return bad("name", c.Node.Name, "empty (the host name is unknown: set --name)")
		}
		return bad("name", c.Node.Name, "want 1 to 128 bytes of letters, digits, '.', '-' and '_'")
	}
	grpcHost, _, err := splitAddr("grpc-addr", c.Node.GRPCAddr)
	if err != nil {
		return err
	}
	if c.Node.Advertise != "" {
		a, err := netip.ParseAddr(c.Node.Advertise)
		switch {
		case err != nil:
			return bad("advertise", c.Node.Advertise, "not an IP address")
		case a.IsUnspecified():
			return bad("advertise", c.Node.Advertise, "unspecified: want the address other nodes reach this node at")
		}
	} else if unspecified(grpcHost) {
		return bad("grpc-addr", c.Node.GRPCAddr, "listens on every interface: set --advertise to the address other nodes reach this node at")
	}
	if c.Node.GRPCAdvertise != "" {
		switch h, p, err := splitAddr("grpc-advertise", c.Node.GRPCAdvertise); {
		case err != nil:
			return err
		case unspecified(h):
			return bad("grpc-advertise", c.Node.GRPCAdvertise, "unspecified host: want the address other nodes reach this node's gRPC API at")
		case p == 0:
			return bad("grpc-advertise", c.Node.GRPCAdvertise, "port 0: want the port other nodes dial")
		}
	}
	gossipHost, _, err := splitAddr("gossip-addr", c.Membership.GossipAddr)
	if err != nil {
		return err
	}
	// Sizes and counts of the serving and storage flags, checked before
	// anything is sized from them (a --monitor-queue of 1e12 made a
	// channel the runtime cannot allocate).
	for _, r := range []struct {
		flag      string
		v, lo, hi int
		note      string
	}{
		{"budget-tokens", c.Policy.BudgetTokens, 1, 1 << 30, " (and at least --page-size)"},
		{"dense-layers", c.Policy.DenseLayers, 0, 1024, ""},
		{"max-running", c.Serve.MaxRunning, 1, 1 << 16, ""},
		{"max-queued", c.Serve.MaxQueued, 0, 1 << 20, ""},
		{"max-model-len", c.Serve.MaxModelLen, 0, 1 << 30, " (0: the model's)"},
		{"prefill-chunk-tokens", c.Serve.PrefillChunk, 1, 1 << 20, ""},
		{"serve-policy-grids", c.Serve.PolicyGrids, 0, 64, ""},
		{"serve-grid-retries", c.Serve.GridRetries, 0, 100, ""},
		{"monitor-queue", c.Serve.MonitorQueue, 1, 1 << 16, ""},
		{"request-history", c.Serve.RequestHistory, 0, 1 << 16, ""},
	} {
		if r.v < r.lo || r.v > r.hi {
			return bad(r.flag, itoa(r.v), "want %d..%d%s", r.lo, r.hi, r.note)
		}
	}
	switch {
	case c.Serve.MaxBatchedTokens > 1<<22:
		return bad("max-batched-tokens", itoa(c.Serve.MaxBatchedTokens), "want 0 (--prefill-chunk-tokens plus --max-running) or --max-running..%d", 1<<22)
	case c.Capacity.MaxPages > 1<<40:
		return bad("max-pages", itoa(c.Capacity.MaxPages), "want 0 (8 x --capacity-pages) or --capacity-pages..%d", int64(1)<<40)
	}
	// Durations: a bound on each, so that no timer or product of them
	// (memberlist's suspicion timeout is --suspicion-mult x
	// --probe-interval and more) overflows.
	for _, d := range []struct {
		flag string
		v    time.Duration
		hi   time.Duration
	}{
		{"sync-interval", c.Storage.SyncInterval, time.Hour}, {"step-timeout", c.Grid.StepTimeout, time.Hour},
		{"probe-interval", c.Membership.ProbeInterval, time.Minute}, {"probe-timeout", c.Membership.ProbeTimeout, time.Minute},
		{"gossip-interval", c.Membership.GossipInterval, time.Minute}, {"dead-node-reclaim", c.Membership.DeadNodeReclaim, time.Hour},
		{"drain-timeout", c.Node.DrainTimeout, time.Hour}, {"grid-idle-timeout", c.Node.GridIdle, 168 * time.Hour},
		{"request-timeout", c.Serve.RequestTimeout, 168 * time.Hour}, {"sse-keepalive", c.Serve.SSEKeepAlive, time.Hour},
		{"log-stats-interval", c.Serve.LogStatsInterval, time.Hour},
		{"serve-grid-retry-wait", c.Serve.GridRetryWait, time.Hour},
		{"http-read-header-timeout", c.HTTP.ReadHeaderTimeout, time.Hour}, {"http-idle-timeout", c.HTTP.IdleTimeout, 24 * time.Hour},
	} {
		if d.v > d.hi {
			return bad(d.flag, d.v.String(), "want at most %v", d.hi)
		}
	}
	switch {
	case c.Serve.Model != "" && c.Serve.Addr == "":
		return bad("model", c.Serve.Model, "needs --http-addr (where the completions API listens)")
	case c.Serve.Addr != "" && c.Serve.Model == "":
		return bad("http-addr", c.Serve.Addr, "needs --model (the checkpoint to serve)")
	case c.Serve.MaxRunning < 1:
		return bad("max-running", itoa(c.Serve.MaxRunning), "must be at least 1")
	case c.Serve.MaxQueued < 0:
		return bad("max-queued", itoa(c.Serve.MaxQueued), "must not be negative")
	case c.Serve.MaxModelLen < 0:
		return bad("max-model-len", itoa(c.Serve.MaxModelLen), "want 0 (the model's) or more")
	case c.Serve.MaxRequestBytes < 1 || c.Serve.MaxRequestBytes > 1<<30:
		return bad("max-request-bytes", itoa(c.Serve.MaxRequestBytes), "want 1..1073741824")
	case c.Serve.RequestTimeout < 0:
		return bad("request-timeout", c.Serve.RequestTimeout.String(), "must not be negative")
	case c.Serve.SSEKeepAlive < 0 || (c.Serve.SSEKeepAlive > 0 && c.Serve.SSEKeepAlive < 100*time.Millisecond):
		return bad("sse-keepalive", c.Serve.SSEKeepAlive.String(), "want 0 (never) or at least 100ms")
	case c.Serve.LogStatsInterval < 0 || (c.Serve.LogStatsInterval > 0 && c.Serve.LogStatsInterval < time.Second):
		return bad("log-stats-interval", c.Serve.LogStatsInterval.String(), "want 0 (off) or at least 1s")
	case c.Serve.DefaultMaxTokens < 1 && c.Serve.DefaultMaxTokens != completion.RestOfContext:
		return bad("default-max-tokens", itoa(c.Serve.DefaultMaxTokens), "want at least 1, or -1 (the rest of --max-model-len after the prompt)")
	case c.Serve.MaxModelLen > 0 && c.Serve.DefaultMaxTokens > c.Serve.MaxModelLen:
		return bad("default-max-tokens", itoa(c.Serve.DefaultMaxTokens), "above --max-model-len %d (no request could use it)", c.Serve.MaxModelLen)
	case c.Serve.PrefillChunk < 1:
		return bad("prefill-chunk-tokens", itoa(c.Serve.PrefillChunk), "must be at least 1")
	case c.Serve.MaxBatchedTokens < 0:
		return bad("max-batched-tokens", itoa(c.Serve.MaxBatchedTokens), "want 0 (--prefill-chunk-tokens plus --max-running) or at least --max-running %d", c.Serve.MaxRunning)
	case c.Serve.MaxBatchedTokens > 0 && c.Serve.MaxBatchedTokens < c.Serve.MaxRunning:
		return bad("max-batched-tokens", itoa(c.Serve.MaxBatchedTokens), "want at least --max-running %d (a decode token for each running sequence, and a prompt token left) or 0", c.Serve.MaxRunning)
	case c.Serve.CapacityPages < 0 || c.Serve.CapacityPages > plan.MaxPages:
		return bad("serve-capacity-pages", itoa(c.Serve.CapacityPages), "want 0 (sized from memory) or 1..%d", plan.MaxPages)
	case c.Serve.PrefixCachePages < 0 || (c.servePages() > 0 && c.Serve.PrefixCachePages > c.servePages()):
		return bad("prefix-cache-pages", itoa(c.Serve.PrefixCachePages), "want 0 (what the pool leaves free) to --serve-capacity-pages %d", c.servePages())
	case c.Serve.CP < 1 || c.Serve.CP > 64:
		return bad("serve-cp", itoa(c.Serve.CP), "want 1..64")
	case c.Serve.TP < 1 || c.Serve.TP > 64:
		return bad("serve-tp", itoa(c.Serve.TP), "want 1..64")
	case c.Serve.PolicyGrids < 0:
		return bad("serve-policy-grids", itoa(c.Serve.PolicyGrids), "must not be negative")
	case c.Serve.GridRetries < 0:
		return bad("serve-grid-retries", itoa(c.Serve.GridRetries), "must not be negative")
	case c.Serve.GridRetryWait < 0:
		return bad("serve-grid-retry-wait", c.Serve.GridRetryWait.String(), "must not be negative")
	case c.Serve.Model == "" && c.Serve.Layout != "local":
		return bad("serve-layout", c.Serve.Layout, "needs --model and --http-addr (the completions API whose KV pages it places)")
	case c.Serve.Model == "" && (c.Serve.CP != 1 || c.Serve.TP != 1):
		return bad("serve-cp", itoa(c.Serve.CP), "--serve-cp %d x --serve-tp %d needs --model and --http-addr (the completions API it lays out)", c.Serve.CP, c.Serve.TP)
	case c.Serve.Layout == "device" && c.Devices.Backend != "cuda":
		return bad("serve-layout", c.Serve.Layout, "needs --backend cuda (the device executor runs on a GPU)")
	case c.Serve.Layout == "device" && (c.Serve.CP != 1 || c.Serve.TP != 1):
		return bad("serve-layout", c.Serve.Layout, "runs one rank: not with --serve-cp %d x --serve-tp %d", c.Serve.CP, c.Serve.TP)
	case c.Serve.Layout == "device" && c.Serve.MonitorRate > 0:
		return bad("serve-layout", c.Serve.Layout, "not with --monitor-rate (the monitor replays every layer's q and k, which stay on the GPU)")
	case c.Serve.Layout == "cluster" && c.servePagesPerRank() > c.hostPages():
		return bad("serve-capacity-pages", itoa(c.servePages()), "with --serve-layout cluster every rank of the served grid reserves %d pages (plus --monitor-queue with --monitor-rate), more than this node's --max-pages %d", c.servePagesPerRank(), c.hostPages())
	case c.Serve.MonitorQueue < 1:
		return bad("monitor-queue", itoa(c.Serve.MonitorQueue), "must be at least 1")
	case c.Serve.RequestHistory < 0:
		return bad("request-history", itoa(c.Serve.RequestHistory), "must not be negative")
	case c.HTTP.MaxConns < 1 || c.HTTP.MaxConns > maxHTTPConns:
		return bad("http-max-conns", itoa(c.HTTP.MaxConns), "want 1..%d connections per HTTP server", maxHTTPConns)
	case c.HTTP.ReadHeaderTimeout <= 0:
		return bad("http-read-header-timeout", c.HTTP.ReadHeaderTimeout.String(), "must be positive (a silent connection would be held forever)")
	case c.HTTP.IdleTimeout <= 0:
		return bad("http-idle-timeout", c.HTTP.IdleTimeout.String(), "must be positive (an idle connection would be held forever)")
	}
	if err := c.httpServer().Validate(); err != nil {
		// Not reached for configs that passed the checks above.
		return fmt.Errorf("questd: %w", err)
	}
	if c.Serve.Addr != "" {
		if _, _, err := splitAddr("http-addr", c.Serve.Addr); err != nil {
			return err
		}
	}
	switch {
	case (c.Serve.TLSCert == "") != (c.Serve.TLSKey == ""):
		return bad("http-tls-cert", c.Serve.TLSCert, "HTTPS needs both --http-tls-cert and --http-tls-key")
	case c.Serve.TLSCert != "" && c.Serve.Addr == "":
		return bad("http-tls-cert", c.Serve.TLSCert, "needs --http-addr (the completions API it secures)")
	case len(c.Serve.AllowedOrigins) > 0 && c.Serve.Addr == "":
		return bad("allowed-origins", strings.Join(c.Serve.AllowedOrigins, ","), "needs --http-addr (the completions API browsers call)")
	}
	for _, o := range c.Serve.AllowedOrigins {
		if err := checkOrigin(o); err != nil {
			return bad("allowed-origins", o, "%v", err)
		}
	}
	if c.Node.MetricsAddr != "" {
		if _, _, err := splitAddr("metrics-addr", c.Node.MetricsAddr); err != nil {
			return err
		}
	}
	if c.Node.Advertise == "" && !unspecified(gossipHost) && gossipHost != grpcHost {
		return bad("gossip-addr", c.Membership.GossipAddr, "binds %s but the node advertises %s, the host of --grpc-addr (bind both to one address, or set --advertise)", gossipHost, grpcHost)
	}
	if adv, err := netip.ParseAddr(c.advertiseHost()); err == nil && !adv.IsLoopback() {
		for _, l := range []struct{ flag, addr, host string }{{"grpc-addr", c.Node.GRPCAddr, grpcHost}, {"gossip-addr", c.Membership.GossipAddr, gossipHost}} {
			if h, err := netip.ParseAddr(l.host); err == nil && h.IsLoopback() {
				return bad(l.flag, l.addr, "binds a loopback address, which other nodes cannot reach at --advertise %s", adv)
			}
		}
	}
	for _, j := range c.Membership.Join {
		h, p, err := net.SplitHostPort(j)
		if err != nil || h == "" {
			return bad("join", j, "want host:port")
		}
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return bad("join", j, "port %q: want 1-65535", p)
		}
	}
	if err := checkMember(func(m *cluster.MemberConfig) { m.Label = c.Membership.Label }); err != nil {
		return bad("cluster-label", c.Membership.Label, "%d bytes, limit 255", len(c.Membership.Label))
	}
	for i, k := range c.Membership.Keys {
		if err := checkMember(func(m *cluster.MemberConfig) { m.SecretKeys = [][]byte{k} }); err != nil {
			return bad("gossip-key-file", c.Membership.KeyFile, "key %d is %d bytes: want 16, 24 or 32", i+1, len(k))
		}
	}

	tls := []struct{ flag, v string }{{"tls-cert", c.Security.TLSCert}, {"tls-key", c.Security.TLSKey}, {"tls-ca", c.Security.TLSCA}}
	for _, t := range tls {
		switch {
		case c.Security.Plaintext && t.v != "":
			return bad("insecure", "true", "conflicts with --%s %q: choose TLS or --insecure (--plaintext)", t.flag, t.v)
		case !c.Security.Plaintext && t.v == "":
			return bad(t.flag, t.v, "mutual TLS needs --tls-cert, --tls-key and --tls-ca (or --insecure to run without TLS)")
		}
	}

	// Geometry and failure-detection bounds, checked before anything is
	// sized from them (a head dimension of 1e9 would otherwise size
	// buffers past any memory).
	for _, g := range []struct {
		flag   string
		v, max int
	}{
		{"layers", c.Grid.Layers, 1024}, {"q-heads", c.Grid.QHeads, 1024}, {"kv-heads", c.Grid.KVHeads, 1024}, {"head-dim", c.Grid.HeadDim, 1024},
		{"page-size", c.Grid.PageSize, 1 << 16}, {"cp", c.Grid.CP, 4096}, {"tp", c.Grid.TP, 1024}, {"capacity-pages", c.Grid.CapacityPages, math.MaxInt},
		{"block-pages", c.Grid.BlockPages, 1 << 20}, {"suspicion-mult", c.Membership.SuspicionMult, 100},
	} {
		if g.v < 1 {
			return bad(g.flag, itoa(g.v), "must be at least 1")
		}
		if g.v > g.max {
			return bad(g.flag, itoa(g.v), "want 1..%d", g.max)
		}
	}
	switch {
	case c.Grid.KVHeads%c.Grid.TP != 0:
		return bad("kv-heads", itoa(c.Grid.KVHeads), "not divisible by --tp %d", c.Grid.TP)
	case c.Grid.QHeads%c.Grid.KVHeads != 0:
		return bad("q-heads", itoa(c.Grid.QHeads), "not a multiple of --kv-heads %d", c.Grid.KVHeads)
	case c.Grid.CapacityPages > plan.MaxPages:
		return bad("capacity-pages", itoa(c.Grid.CapacityPages), "more than %d", plan.MaxPages)
	case c.Policy.BudgetTokens < c.Grid.PageSize:
		return bad("budget-tokens", itoa(c.Policy.BudgetTokens), "below one page (--page-size %d)", c.Grid.PageSize)
	case c.Policy.SinkPages < 0:
		return bad("sink-pages", itoa(c.Policy.SinkPages), "must not be negative")
	case c.Policy.LocalPages < 0:
		return bad("local-pages", itoa(c.Policy.LocalPages), "must not be negative")
	case c.Policy.Selector != plan.Dense && c.Policy.SinkPages+c.Policy.LocalPages > c.Policy.BudgetTokens/c.Grid.PageSize:
		return bad("sink-pages", itoa(c.Policy.SinkPages), "plus --local-pages %d forced pages exceed K = %d pages (--budget-tokens %d / --page-size %d, forced pages included)",
			c.Policy.LocalPages, c.Policy.BudgetTokens/c.Grid.PageSize, c.Policy.BudgetTokens, c.Grid.PageSize)
	case c.Policy.DenseLayers < 0:
		return bad("dense-layers", itoa(c.Policy.DenseLayers), "must not be negative")
	case c.Policy.Selection == plan.Replicated && c.Policy.Selector != plan.Quest && c.Policy.Selector != plan.Dense:
		return bad("selection", c.Policy.Selection.String(), "needs --selector quest or dense, not %v", c.Policy.Selector)
	case c.Capacity.MaxPages < 0:
		return bad("max-pages", itoa(c.Capacity.MaxPages), "must not be negative (0: 8 x --capacity-pages)")
	case c.Capacity.MaxPages > 0 && c.Capacity.MaxPages < c.Grid.CapacityPages:
		return bad("max-pages", itoa(c.Capacity.MaxPages), "below --capacity-pages %d: a node hosts whole ranks", c.Grid.CapacityPages)
	case c.Capacity.MaxMemory < memlimit.NoLimit:
		return bad("max-memory", strconv.FormatInt(c.Capacity.MaxMemory, 10), "want bytes, auto or none")
	case c.Offload.DeviceBudgetPages < 0:
		return bad("device-budget-pages", itoa(c.Offload.DeviceBudgetPages), "must not be negative (0: offload off)")
	case c.Offload.DeviceBudgetPages > c.Grid.CapacityPages:
		return bad("device-budget-pages", itoa(c.Offload.DeviceBudgetPages), "above --capacity-pages %d", c.Grid.CapacityPages)
	case c.Offload.Eviction != pagestore.EvictLRU && c.Offload.Eviction != pagestore.EvictScore:
		return bad("eviction", c.Offload.Eviction.String(), "want lru or score")
	case c.Offload.PrefetchPages < 0:
		return bad("prefetch-pages", itoa(c.Offload.PrefetchPages), "must not be negative (0: off)")
	case c.Offload.PrefetchPages > c.Grid.CapacityPages:
		return bad("prefetch-pages", itoa(c.Offload.PrefetchPages), "above --capacity-pages %d", c.Grid.CapacityPages)
	case c.Offload.PrefetchPages > 0 && c.Offload.DeviceBudgetPages == 0:
		return bad("prefetch-pages", itoa(c.Offload.PrefetchPages), "needs --device-budget-pages (prefetch needs offload)")
	case c.Offload.PrefetchCrossLayer && c.Offload.PrefetchPages == 0:
		return bad("prefetch-cross-layer", "true", "needs --prefetch-pages")
	case c.Storage.SyncInterval <= 0:
		return bad("sync-interval", c.Storage.SyncInterval.String(), "must be positive")
	case c.Storage.DataDir != "" && c.Policy.Selection == plan.Replicated:
		return bad("data-dir", c.Storage.DataDir, "not with --selection replicated (its summary mirrors are not persisted)")
	case c.Devices.Backend == "cuda" && !cudaBuild:
		return bad("backend", "cuda", "needs a questd built with -tags cuda (README: building for a GPU host)")
	case c.Storage.DataDir != "" && c.Devices.Backend == "cuda":
		return bad("data-dir", c.Storage.DataDir, "not with --backend cuda (pages in GPU memory do not persist)")
	case len(c.Devices.Ordinals) > 0 && c.Devices.Backend != "cuda":
		return bad("devices", joinInts(c.Devices.Ordinals), "needs --backend cuda")
	case c.Devices.KVCacheDType == plan.FP8:
		return bad("kv-cache-dtype", "fp8", "not served yet: the CUDA backend decodes fp8 pages (questctl bench decode --kv-cache-dtype fp8), but questd's serving paths (GPU prefill, offload slots, remote workers) do not take them, and its CPU grids store f32")
	case c.Devices.KVCacheDType != plan.BFloat16 && c.Devices.Backend != "cuda":
		return bad("kv-cache-dtype", c.Devices.KVCacheDType.String(), "needs --backend cuda (the CPU backend stores f32)")
	}
	if err := c.engineConfig().Validate(); err != nil {
		// Not reached for configs that passed the checks above, unless
		// engine gains a rule: report it as it comes.
		return fmt.Errorf("questd: %w", err)
	}

	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"step-timeout", c.Grid.StepTimeout}, {"probe-interval", c.Membership.ProbeInterval},
		{"probe-timeout", c.Membership.ProbeTimeout}, {"gossip-interval", c.Membership.GossipInterval},
		{"dead-node-reclaim", c.Membership.DeadNodeReclaim},
	} {
		if d.v <= 0 {
			return bad(d.flag, d.v.String(), "must be positive")
		}
	}
	switch {
	case c.Membership.ProbeTimeout >= c.Membership.ProbeInterval:
		return bad("probe-timeout", c.Membership.ProbeTimeout.String(), "must be below --probe-interval %v", c.Membership.ProbeInterval)
	case c.Node.DrainTimeout < 0:
		return bad("drain-timeout", c.Node.DrainTimeout.String(), "must not be negative")
	case c.Node.GridIdle < 0:
		return bad("grid-idle-timeout", c.Node.GridIdle.String(), "must not be negative (0 keeps grids open)")
	case c.Log.Format != "text" && c.Log.Format != "json":
		return bad("log-format", c.Log.Format, "want text or json")
	}
	if _, err := parseLogLevel(strings.ToLower(c.Log.Level.String())); err != nil {
		return bad("log-level", c.Log.Level.String(), "want debug, info, warn or error")
	}
	if err := c.memberConfig().Validate(); err != nil {
		return fmt.Errorf("questd: %w", err)
	}
	return nil
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
