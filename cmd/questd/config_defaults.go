package main

import (
	"log/slog"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/offload"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// DefaultConfig is the configuration of a node named hostname with every
// flag at its default: the groups' DefaultX, which [newFlagSet] gives
// the flags as their defaults (TestDefaults checks that parsing no flag
// gives it).
func DefaultConfig(hostname string) Config {
	return Config{
		Node:       DefaultNodeConfig(hostname),
		Membership: DefaultMembershipConfig(),
		Security:   DefaultSecurityConfig(),
		Grid:       DefaultGridConfig(),
		Policy:     DefaultPolicyConfig(),
		Devices:    DefaultDeviceConfig(),
		Capacity:   DefaultCapacityConfig(),
		Offload:    DefaultOffloadConfig(),
		Storage:    DefaultStorageConfig(),
		Serve:      DefaultServeConfig(),
		HTTP:       DefaultHTTPConfig(),
		Log:        DefaultLogConfig(),
	}
}

// DefaultNodeConfig is a node named hostname on loopback: gRPC on
// 127.0.0.1:7070, metrics on 127.0.0.1:9464, a 10s drain and grids closed
// after 1m idle.
func DefaultNodeConfig(hostname string) NodeConfig {
	return NodeConfig{Name: hostname, GRPCAddr: "127.0.0.1:7070", MetricsAddr: "127.0.0.1:9464",
		DrainTimeout: 10 * time.Second, GridIdle: time.Minute}
}

// DefaultMembershipConfig binds gossip to 127.0.0.1:7946 under the label
// questrt, unencrypted, joining no one, with memberlist's LAN failure
// detection but a 100ms dead-node reclaim.
func DefaultMembershipConfig() MembershipConfig {
	return MembershipConfig{GossipAddr: "127.0.0.1:7946", Label: "questrt",
		ProbeInterval: time.Second, ProbeTimeout: 500 * time.Millisecond, SuspicionMult: 4,
		GossipInterval: 200 * time.Millisecond, DeadNodeReclaim: 100 * time.Millisecond}
}

// DefaultSecurityConfig is empty: no TLS file, no token, and not
// Plaintext, so that a node must be given either (Validate refuses it).
func DefaultSecurityConfig() SecurityConfig { return SecurityConfig{} }

// DefaultGridConfig is engine.DefaultConfig's grid with a 2s step
// timeout: 4 layers of 32 query and 8 KV heads of dimension 128, pages of
// 16 tokens, one rank of 1024 pages, blocks of 64 pages.
func DefaultGridConfig() GridConfig {
	return GridConfig{Layers: 4, Geometry: plan.Geometry{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16},
		CP: 1, TP: 1, CapacityPages: 1024, BlockPages: 64, StepTimeout: 2 * time.Second}
}

// DefaultPolicyConfig is plan.DefaultPolicy with exact selection: a
// budget of 2048 tokens, the tail page local, the first 2 layers dense,
// group_max and the quest selector.
func DefaultPolicyConfig() PolicyConfig {
	return PolicyConfig{BudgetTokens: 2048, LocalPages: 1, DenseLayers: 2,
		GQA: plan.GroupMax, Selector: plan.Quest, Selection: plan.Exact}
}

// DefaultDeviceConfig is the CPU backend (bf16 is the storage type a
// cuda backend would take).
func DefaultDeviceConfig() DeviceConfig {
	return DeviceConfig{Backend: "cpu", KVCacheDType: plan.BFloat16}
}

// DefaultCapacityConfig hosts 8 x the grid's pool and bounds the pools
// by the memory available at start.
func DefaultCapacityConfig() CapacityConfig { return CapacityConfig{MaxMemory: memlimit.Auto} }

// DefaultOffloadConfig is offload off (LRU eviction once on).
func DefaultOffloadConfig() OffloadConfig {
	return OffloadConfig{offload.Settings{Eviction: pagestore.EvictLRU}}
}

// DefaultStorageConfig is no persistence (sync durability, flushed every
// 1s when periodic; recovered pages verified on read, with a 64 MiB/s
// scrub).
func DefaultStorageConfig() StorageConfig {
	return StorageConfig{Durability: pagestore.SyncOnWrite, SyncInterval: time.Second,
		Verify: pagestore.VerifyOnRead, ScrubRate: pagestore.DefaultScrubRate}
}

// DefaultServeConfig is no model served; once one is, the limits of the
// fields' docs.
func DefaultServeConfig() ServeConfig {
	return ServeConfig{MaxRunning: 16, MaxQueued: 64, DefaultMaxTokens: 16, MaxRequestBytes: 32 << 20,
		RequestTimeout: 30 * time.Minute, SSEKeepAlive: 15 * time.Second, PrefillChunk: 512, MaxITLFactor: 2, DevicePrefill: true,
		MemoryFraction: 0.5, GPUMemoryUtilization: memlimit.DefaultDeviceFraction, PrefixCaching: true, GrowReservations: true, Layout: "local", CP: 1, TP: 1, PolicyGrids: 2,
		GridRetries: 1, GridRetryWait: 10 * time.Second, ClusterWait: 30 * time.Second, ClusterResize: 2 * time.Second, MonitorQueue: 64, RequestHistory: 64,
		LogStatsInterval: 10 * time.Second}
}

// DefaultHTTPConfig is httpServerConfig's defaults for the flags' bounds.
func DefaultHTTPConfig() HTTPConfig {
	return HTTPConfig{MaxConns: defaultHTTPMaxConns, ReadHeaderTimeout: defaultHTTPReadHeaderTimeout,
		IdleTimeout: defaultHTTPIdleTimeout}
}

// DefaultLogConfig logs info and above as text.
func DefaultLogConfig() LogConfig { return LogConfig{Level: slog.LevelInfo, Format: "text"} }
