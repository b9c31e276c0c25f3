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
	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
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

// intRange is a bound on an integer flag: lo..hi, note appended to the
// error.
type intRange struct {
	flag      string
	v, lo, hi int
	note      string
}

// checkRanges reports the first value of rs out of its range.
func checkRanges(rs ...intRange) error {
	for _, r := range rs {
		if r.v < r.lo || r.v > r.hi {
			return bad(r.flag, strconv.Itoa(r.v), "want %d..%d%s", r.lo, r.hi, r.note)
		}
	}
	return nil
}

// durBound is an upper bound on a duration flag, so that no timer or
// product of them (memberlist's suspicion timeout is --suspicion-mult x
// --probe-interval and more) overflows.
type durBound struct {
	flag  string
	v, hi time.Duration
}

// checkDurations reports the first duration of ds above its bound.
func checkDurations(ds ...durBound) error {
	for _, d := range ds {
		if d.v > d.hi {
			return bad(d.flag, d.v.String(), "want at most %v", d.hi)
		}
	}
	return nil
}

// checkPositive reports the first duration of ds that is not positive.
func checkPositive(ds ...durBound) error {
	for _, d := range ds {
		if d.v <= 0 {
			return bad(d.flag, d.v.String(), "must be positive")
		}
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule,
// as `--flag "value": why`.
func (n NodeConfig) Validate() error {
	if err := checkMember(func(m *cluster.MemberConfig) { m.Name = n.Name }); err != nil {
		if n.Name == "" {
			return bad("name", n.Name, "empty (the host name is unknown: set --name)")
		}
		return bad("name", n.Name, "want 1 to 128 bytes of letters, digits, '.', '-' and '_'")
	}
	grpcHost, _, err := splitAddr("grpc-addr", n.GRPCAddr)
	if err != nil {
		return err
	}
	if n.Advertise != "" {
		a, err := netip.ParseAddr(n.Advertise)
		switch {
		case err != nil:
			return bad("advertise", n.Advertise, "not an IP address")
		case a.IsUnspecified():
			return bad("advertise", n.Advertise, "unspecified: want the address other nodes reach this node at")
		}
	} else if unspecified(grpcHost) {
		return bad("grpc-addr", n.GRPCAddr, "listens on every interface: set --advertise to the address other nodes reach this node at")
	}
	if n.GRPCAdvertise != "" {
		switch h, p, err := splitAddr("grpc-advertise", n.GRPCAdvertise); {
		case err != nil:
			return err
		case unspecified(h):
			return bad("grpc-advertise", n.GRPCAdvertise, "unspecified host: want the address other nodes reach this node's gRPC API at")
		case p == 0:
			return bad("grpc-advertise", n.GRPCAdvertise, "port 0: want the port other nodes dial")
		}
	}
	if n.MetricsAddr != "" {
		if _, _, err := splitAddr("metrics-addr", n.MetricsAddr); err != nil {
			return err
		}
	}
	if err := checkDurations(durBound{"drain-timeout", n.DrainTimeout, time.Hour}, durBound{"grid-idle-timeout", n.GridIdle, 168 * time.Hour}); err != nil {
		return err
	}
	switch {
	case n.DrainTimeout < 0:
		return bad("drain-timeout", n.DrainTimeout.String(), "must not be negative")
	case n.GridIdle < 0:
		return bad("grid-idle-timeout", n.GridIdle.String(), "must not be negative (0 keeps grids open)")
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule,
// as `--flag "value": why`: the addresses, the label, the keys and the
// failure-detection timing (cluster.MemberConfig's rules).
func (m MembershipConfig) Validate() error {
	if _, _, err := splitAddr("gossip-addr", m.GossipAddr); err != nil {
		return err
	}
	for _, j := range m.Join {
		h, p, err := net.SplitHostPort(j)
		if err != nil || h == "" {
			return bad("join", j, "want host:port")
		}
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return bad("join", j, "port %q: want 1-65535", p)
		}
	}
	if err := checkMember(func(c *cluster.MemberConfig) { c.Label = m.Label }); err != nil {
		return bad("cluster-label", m.Label, "%d bytes, limit 255", len(m.Label))
	}
	for i, k := range m.Keys {
		if err := checkMember(func(c *cluster.MemberConfig) { c.SecretKeys = [][]byte{k} }); err != nil {
			return bad("gossip-key-file", m.KeyFile, "key %d is %d bytes: want 16, 24 or 32", i+1, len(k))
		}
	}
	timing := []durBound{
		{"probe-interval", m.ProbeInterval, time.Minute}, {"probe-timeout", m.ProbeTimeout, time.Minute},
		{"gossip-interval", m.GossipInterval, time.Minute}, {"dead-node-reclaim", m.DeadNodeReclaim, time.Hour},
	}
	if err := checkDurations(timing...); err != nil {
		return err
	}
	switch {
	case m.SuspicionMult < 1:
		return bad("suspicion-mult", strconv.Itoa(m.SuspicionMult), "must be at least 1")
	case m.SuspicionMult > 100:
		return bad("suspicion-mult", strconv.Itoa(m.SuspicionMult), "want 1..%d", 100)
	}
	if err := checkPositive(timing...); err != nil {
		return err
	}
	if m.ProbeTimeout >= m.ProbeInterval {
		return bad("probe-timeout", m.ProbeTimeout.String(), "must be below --probe-interval %v", m.ProbeInterval)
	}
	return nil
}

// Validate reports whether mutual TLS is all or nothing: the three files
// unless Plaintext, none with it.
func (s SecurityConfig) Validate() error {
	tls := []struct{ flag, v string }{{"tls-cert", s.TLSCert}, {"tls-key", s.TLSKey}, {"tls-ca", s.TLSCA}}
	for _, t := range tls {
		switch {
		case s.Plaintext && t.v != "":
			return bad("insecure", "true", "conflicts with --%s %q: choose TLS or --insecure (--plaintext)", t.flag, t.v)
		case !s.Plaintext && t.v == "":
			return bad(t.flag, t.v, "mutual TLS needs --tls-cert, --tls-key and --tls-ca (or --insecure to run without TLS)")
		}
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule:
// bounds checked before anything is sized from them (a head dimension
// of 1e9 would otherwise size buffers past any memory), and the heads'
// divisibility.
func (g GridConfig) Validate() error {
	for _, r := range []struct {
		flag   string
		v, max int
	}{
		{"layers", g.Layers, 1024}, {"q-heads", g.QHeads, 1024}, {"kv-heads", g.KVHeads, 1024}, {"head-dim", g.HeadDim, 1024},
		{"page-size", g.PageSize, 1 << 16}, {"cp", g.CP, 4096}, {"tp", g.TP, 1024}, {"capacity-pages", g.CapacityPages, math.MaxInt},
		{"block-pages", g.BlockPages, 1 << 20},
	} {
		if r.v < 1 {
			return bad(r.flag, strconv.Itoa(r.v), "must be at least 1")
		}
		if r.v > r.max {
			return bad(r.flag, strconv.Itoa(r.v), "want 1..%d", r.max)
		}
	}
	switch {
	case g.KVHeads%g.TP != 0:
		return bad("kv-heads", strconv.Itoa(g.KVHeads), "not divisible by --tp %d", g.TP)
	case g.QHeads%g.KVHeads != 0:
		return bad("q-heads", strconv.Itoa(g.QHeads), "not a multiple of --kv-heads %d", g.KVHeads)
	case g.CapacityPages > plan.MaxPages:
		return bad("capacity-pages", strconv.Itoa(g.CapacityPages), "more than %d", plan.MaxPages)
	case g.StepTimeout > time.Hour:
		return bad("step-timeout", g.StepTimeout.String(), "want at most %v", time.Hour)
	case g.StepTimeout <= 0:
		return bad("step-timeout", g.StepTimeout.String(), "must be positive")
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule;
// the rules against the page size are [Config.Validate]'s.
func (p PolicyConfig) Validate() error {
	if err := checkRanges(
		intRange{"budget-tokens", p.BudgetTokens, 1, 1 << 30, " (and at least --page-size)"},
		intRange{"dense-layers", p.DenseLayers, 0, 1024, ""},
	); err != nil {
		return err
	}
	switch {
	case p.SinkPages < 0:
		return bad("sink-pages", strconv.Itoa(p.SinkPages), "must not be negative")
	case p.LocalPages < 0:
		return bad("local-pages", strconv.Itoa(p.LocalPages), "must not be negative")
	case p.Selection == plan.Replicated && p.Selector != plan.Quest && p.Selector != plan.Dense:
		return bad("selection", p.Selection.String(), "needs --selector quest or dense, not %v", p.Selector)
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule:
// cuda needs a -tags cuda build, the devices and a storage type other
// than bf16 and fp8 need cuda; fp8 is served on either backend (where,
// and not with GPU offload: [Config.validateAcross]).
func (d DeviceConfig) Validate() error {
	switch {
	case d.Backend == "cuda" && !cudaBuild:
		return bad("backend", "cuda", "needs a questd built with -tags cuda (README: building for a GPU host)")
	case len(d.Ordinals) > 0 && d.Backend != "cuda":
		return bad("devices", joinInts(d.Ordinals), "needs --backend cuda")
	case d.KVCacheDType == plan.FP8:
		// Both backends store and attend fp8 records.
	case d.KVCacheDType != plan.BFloat16 && d.Backend != "cuda":
		return bad("kv-cache-dtype", d.KVCacheDType.String(), "needs --backend cuda (the CPU backend stores f32)")
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule;
// MaxPages against the grid's pool is [Config.Validate]'s.
func (c CapacityConfig) Validate() error {
	switch {
	case c.MaxPages > 1<<40:
		return bad("max-pages", strconv.Itoa(c.MaxPages), "want 0 (8 x --capacity-pages) or --capacity-pages..%d", int64(1)<<40)
	case c.MaxPages < 0:
		return bad("max-pages", strconv.Itoa(c.MaxPages), "must not be negative (0: 8 x --capacity-pages)")
	case c.MaxMemory < memlimit.NoLimit:
		return bad("max-memory", strconv.FormatInt(c.MaxMemory, 10), "want bytes, auto or none")
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule;
// the bounds against the grid's pool are [Config.validateOffloadPool]'s.
func (o OffloadConfig) Validate() error {
	switch {
	case o.DeviceBudgetPages < 0:
		return bad("device-budget-pages", strconv.Itoa(o.DeviceBudgetPages), "must not be negative (0: offload off)")
	case o.Eviction != pagestore.EvictLRU && o.Eviction != pagestore.EvictScore:
		return bad("eviction", o.Eviction.String(), "want lru or score")
	case o.PrefetchPages < 0:
		return bad("prefetch-pages", strconv.Itoa(o.PrefetchPages), "must not be negative (0: off)")
	case o.PrefetchPages > 0 && o.DeviceBudgetPages == 0:
		return bad("prefetch-pages", strconv.Itoa(o.PrefetchPages), "needs --device-budget-pages (prefetch needs offload)")
	case o.PrefetchCrossLayer && o.PrefetchPages == 0:
		return bad("prefetch-cross-layer", "true", "needs --prefetch-pages")
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule;
// DataDir against the selection mode and the backend is
// [Config.Validate]'s.
func (s StorageConfig) Validate() error {
	switch {
	case s.SyncInterval > time.Hour:
		return bad("sync-interval", s.SyncInterval.String(), "want at most %v", time.Hour)
	case s.SyncInterval <= 0:
		return bad("sync-interval", s.SyncInterval.String(), "must be positive")
	case s.Verify != pagestore.VerifyAtOpen && s.Verify != pagestore.VerifyOnRead:
		return bad("recovery-verify", s.Verify.String(), "want at-open or on-read")
	case s.ScrubRate == 0 || s.ScrubRate < -1:
		return bad("scrub-rate", strconv.FormatInt(s.ScrubRate, 10), "want bytes per second above 0, or off")
	}
	return nil
}

// Validate reports the first setting of the group that breaks its rule:
// sizes and counts checked before anything is sized from them (a
// --monitor-queue of 1e12 made a channel the runtime cannot allocate),
// the model and its address together, HTTPS and CORS. The rules against
// the backend and the node's pool are [Config.Validate]'s.
func (s ServeConfig) Validate() error {
	itoa := strconv.Itoa
	if err := checkRanges(
		intRange{"max-running", s.MaxRunning, 1, 1 << 16, ""},
		intRange{"max-queued", s.MaxQueued, 0, 1 << 20, ""},
		intRange{"max-model-len", s.MaxModelLen, 0, 1 << 30, " (0: the model's)"},
		intRange{"prefill-chunk-tokens", s.PrefillChunk, 1, 1 << 20, ""},
		intRange{"serve-policy-grids", s.PolicyGrids, 0, 64, ""},
		intRange{"serve-grid-retries", s.GridRetries, 0, 100, ""},
		intRange{"monitor-queue", s.MonitorQueue, 1, 1 << 16, ""},
		intRange{"request-history", s.RequestHistory, 0, 1 << 16, ""},
	); err != nil {
		return err
	}
	if s.MaxBatchedTokens > 1<<22 {
		return bad("max-batched-tokens", itoa(s.MaxBatchedTokens), "want 0 (--prefill-chunk-tokens plus --max-running) or --max-running..%d", 1<<22)
	}
	if err := checkDurations(
		durBound{"request-timeout", s.RequestTimeout, 168 * time.Hour}, durBound{"sse-keepalive", s.SSEKeepAlive, time.Hour},
		durBound{"log-stats-interval", s.LogStatsInterval, time.Hour},
		durBound{"serve-grid-retry-wait", s.GridRetryWait, time.Hour},
		durBound{"serve-cluster-wait", s.ClusterWait, time.Hour}, durBound{"serve-cluster-resize", s.ClusterResize, time.Hour},
	); err != nil {
		return err
	}
	switch {
	case s.Model != "" && s.Addr == "":
		return bad("model", s.Model, "needs --http-addr (where the completions API listens)")
	case s.Addr != "" && s.Model == "":
		return bad("http-addr", s.Addr, "needs --model (the checkpoint to serve)")
	case s.MaxRequestBytes < 1 || s.MaxRequestBytes > 1<<30:
		return bad("max-request-bytes", itoa(s.MaxRequestBytes), "want 1..1073741824")
	case s.RequestTimeout < 0:
		return bad("request-timeout", s.RequestTimeout.String(), "must not be negative")
	case s.SSEKeepAlive < 0 || (s.SSEKeepAlive > 0 && s.SSEKeepAlive < 100*time.Millisecond):
		return bad("sse-keepalive", s.SSEKeepAlive.String(), "want 0 (never) or at least 100ms")
	case s.LogStatsInterval < 0 || (s.LogStatsInterval > 0 && s.LogStatsInterval < time.Second):
		return bad("log-stats-interval", s.LogStatsInterval.String(), "want 0 (off) or at least 1s")
	case s.DefaultMaxTokens < 1 && s.DefaultMaxTokens != completion.RestOfContext:
		return bad("default-max-tokens", itoa(s.DefaultMaxTokens), "want at least 1, or -1 (the rest of --max-model-len after the prompt)")
	case s.MaxModelLen > 0 && s.DefaultMaxTokens > s.MaxModelLen:
		return bad("default-max-tokens", itoa(s.DefaultMaxTokens), "above --max-model-len %d (no request could use it)", s.MaxModelLen)
	case s.MaxBatchedTokens < 0:
		return bad("max-batched-tokens", itoa(s.MaxBatchedTokens), "want 0 (--prefill-chunk-tokens plus --max-running) or at least --max-running %d", s.MaxRunning)
	case s.MaxBatchedTokens > 0 && s.MaxBatchedTokens < s.MaxRunning:
		return bad("max-batched-tokens", itoa(s.MaxBatchedTokens), "want at least --max-running %d (a decode token for each running sequence, and a prompt token left) or 0", s.MaxRunning)
	case s.CapacityPages < 0 || s.CapacityPages > plan.MaxPages:
		return bad("serve-capacity-pages", itoa(s.CapacityPages), "want 0 (sized from memory) or 1..%d", plan.MaxPages)
	case s.PrefixCachePages < 0 || (s.pages() > 0 && s.PrefixCachePages > s.pages()):
		return bad("prefix-cache-pages", itoa(s.PrefixCachePages), "want 0 (what the pool leaves free) to --serve-capacity-pages %d", s.pages())
	case s.CP < 1 || s.CP > 64:
		return bad("serve-cp", itoa(s.CP), "want 1..64")
	case s.TP < 1 || s.TP > 64:
		return bad("serve-tp", itoa(s.TP), "want 1..64")
	case s.GridRetryWait < 0:
		return bad("serve-grid-retry-wait", s.GridRetryWait.String(), "must not be negative")
	case s.ClusterWait < 0:
		return bad("serve-cluster-wait", s.ClusterWait.String(), "must not be negative (0: one look)")
	case s.ClusterResize < 0:
		return bad("serve-cluster-resize", s.ClusterResize.String(), "must not be negative (0: sized once)")
	case s.Model == "" && s.Layout != "local":
		return bad("serve-layout", s.Layout, "needs --model and --http-addr (the completions API whose KV pages it places)")
	case s.Model == "" && (s.CP != 1 || s.TP != 1):
		return bad("serve-cp", itoa(s.CP), "--serve-cp %d x --serve-tp %d needs --model and --http-addr (the completions API it lays out)", s.CP, s.TP)
	case s.Layout == "device" && (s.CP != 1 || s.TP != 1):
		return bad("serve-layout", s.Layout, "runs one rank: not with --serve-cp %d x --serve-tp %d", s.CP, s.TP)
	case s.Layout == "device" && s.MonitorRate > 0:
		return bad("serve-layout", s.Layout, "not with --monitor-rate (the monitor replays every layer's q and k, which stay on the GPU)")
	}
	if s.Addr != "" {
		if _, _, err := splitAddr("http-addr", s.Addr); err != nil {
			return err
		}
	}
	switch {
	case (s.TLSCert == "") != (s.TLSKey == ""):
		return bad("http-tls-cert", s.TLSCert, "HTTPS needs both --http-tls-cert and --http-tls-key")
	case s.TLSCert != "" && s.Addr == "":
		return bad("http-tls-cert", s.TLSCert, "needs --http-addr (the completions API it secures)")
	case len(s.AllowedOrigins) > 0 && s.Addr == "":
		return bad("allowed-origins", strings.Join(s.AllowedOrigins, ","), "needs --http-addr (the completions API browsers call)")
	}
	for _, o := range s.AllowedOrigins {
		if err := checkOrigin(o); err != nil {
			return bad("allowed-origins", o, "%v", err)
		}
	}
	return nil
}

// Validate reports the first bound of the group that breaks its rule,
// then the HTTP server config built from it (httpServerConfig.Validate).
func (h HTTPConfig) Validate() error {
	if err := checkDurations(
		durBound{"http-read-header-timeout", h.ReadHeaderTimeout, time.Hour}, durBound{"http-idle-timeout", h.IdleTimeout, 24 * time.Hour},
	); err != nil {
		return err
	}
	switch {
	case h.MaxConns < 1 || h.MaxConns > maxHTTPConns:
		return bad("http-max-conns", strconv.Itoa(h.MaxConns), "want 1..%d connections per HTTP server", maxHTTPConns)
	case h.ReadHeaderTimeout <= 0:
		return bad("http-read-header-timeout", h.ReadHeaderTimeout.String(), "must be positive (a silent connection would be held forever)")
	case h.IdleTimeout <= 0:
		return bad("http-idle-timeout", h.IdleTimeout.String(), "must be positive (an idle connection would be held forever)")
	}
	if err := h.server().Validate(); err != nil {
		// Not reached for configs that passed the checks above.
		return fmt.Errorf("questd: %w", err)
	}
	return nil
}

// Validate reports a log format or level questd does not write.
func (l LogConfig) Validate() error {
	if l.Format != "text" && l.Format != "json" {
		return bad("log-format", l.Format, "want text or json")
	}
	if _, err := parseLogLevel(strings.ToLower(l.Level.String())); err != nil {
		return bad("log-level", l.Level.String(), "want debug, info, warn or error")
	}
	return nil
}

// Validate reports the first setting that breaks its rule, as
// `--flag "value": why`: each group's Validate, then the rules across
// groups, then the cross checks of engine.Config.Validate and
// cluster.MemberConfig.Validate. The groups go in the order the flat
// config checked their flags in (the node, the policy's bounds, serving
// and HTTP before membership, TLS and the grid), so that a config with
// two bad settings mostly reports the one it reported before. It does no
// I/O (the files are read by loadConfig and main).
func (c Config) Validate() error {
	for _, g := range []interface{ Validate() error }{
		c.Node, c.Policy, c.Serve, c.HTTP, c.Membership, c.Security, c.Grid,
		c.Capacity, validator(c.validateOffloadPool), c.Offload, c.Storage, c.Devices, c.Log,
	} {
		if err := g.Validate(); err != nil {
			return err
		}
	}
	if err := c.validateAcross(); err != nil {
		return err
	}
	if err := c.engineConfig().Validate(); err != nil {
		// Not reached for configs that passed the checks above, unless
		// engine gains a rule: report it as it comes.
		return fmt.Errorf("questd: %w", err)
	}
	if err := c.memberConfig().Validate(); err != nil {
		return fmt.Errorf("questd: %w", err)
	}
	return nil
}

// validator is a func as a Validate method.
type validator func() error

func (v validator) Validate() error { return v() }

// validateOffloadPool checks the offload group's pages against the
// grid's pool, before the group's own rules: a --prefetch-pages above
// --capacity-pages is reported as such, not as needing
// --device-budget-pages.
func (c Config) validateOffloadPool() error {
	o, capacity := c.Offload, c.Grid.CapacityPages
	switch {
	case o.DeviceBudgetPages > capacity:
		return bad("device-budget-pages", strconv.Itoa(o.DeviceBudgetPages), "above --capacity-pages %d", capacity)
	case o.PrefetchPages > capacity:
		return bad("prefetch-pages", strconv.Itoa(o.PrefetchPages), "above --capacity-pages %d", capacity)
	}
	return nil
}

// validateAcross checks the rules that tie settings of two groups
// together.
func (c Config) validateAcross() error {
	itoa := strconv.Itoa
	grpcHost, _, _ := splitAddr("grpc-addr", c.Node.GRPCAddr)
	gossipHost, _, _ := splitAddr("gossip-addr", c.Membership.GossipAddr)
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
	p, g := c.Policy, c.Grid
	switch {
	case p.BudgetTokens < g.PageSize:
		return bad("budget-tokens", itoa(p.BudgetTokens), "below one page (--page-size %d)", g.PageSize)
	case p.Selector != plan.Dense && p.SinkPages+p.LocalPages > p.BudgetTokens/g.PageSize:
		return bad("sink-pages", itoa(p.SinkPages), "plus --local-pages %d forced pages exceed K = %d pages (--budget-tokens %d / --page-size %d, forced pages included)",
			p.LocalPages, p.BudgetTokens/g.PageSize, p.BudgetTokens, g.PageSize)
	case c.Capacity.MaxPages > 0 && c.Capacity.MaxPages < g.CapacityPages:
		return bad("max-pages", itoa(c.Capacity.MaxPages), "below --capacity-pages %d: a node hosts whole ranks", g.CapacityPages)
	case c.Storage.DataDir != "" && p.Selection == plan.Replicated:
		return bad("data-dir", c.Storage.DataDir, "not with --selection replicated (its summary mirrors are not persisted)")
	case c.Storage.DataDir != "" && c.Devices.Backend == "cuda":
		return bad("data-dir", c.Storage.DataDir, "not with --backend cuda (pages in GPU memory do not persist)")
	case c.Devices.KVCacheDType == plan.FP8 && c.Serve.Model == "" && c.Devices.Backend != "cuda":
		return bad("kv-cache-dtype", "fp8", "needs --model (or --backend cuda): it sets the served model's pages; the grids a CPU node hosts for the cluster store the type their coordinator names")
	case c.Serve.Layout == "device" && c.Devices.Backend != "cuda":
		return bad("serve-layout", c.Serve.Layout, "needs --backend cuda (the device executor runs on a GPU)")
	case c.Serve.Layout == "cluster" && c.servePagesPerRank() > c.hostPages():
		return bad("serve-capacity-pages", itoa(c.servePages()), "with --serve-layout cluster every rank of the served grid reserves %d pages (plus --monitor-queue with --monitor-rate), more than this node's --max-pages %d", c.servePagesPerRank(), c.hostPages())
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
