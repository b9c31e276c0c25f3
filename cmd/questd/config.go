package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/questrt/questrt/internal/offload"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// Config is the configuration of one questd node, in groups as pebble's
// Options: each group is a struct of its own with its defaults documented
// on its fields and its own Validate, and the configs of the packages
// questd wires (engine.Config, cluster.MemberConfig, completion.Config,
// node.Config) are built from the groups (config_derived.go).
// [loadConfig] fills it from the command line, QUESTRT_* environment
// variables, a YAML file and the defaults, in that order of precedence,
// and validates it. The flag definitions in [newFlagSet] are the single
// source of truth: each field of a group is one flag (named in brackets;
// TestFlagsMapToFields checks it), and its default is the flag's. The
// flags, their variables and the file's keys are flat (--serve-cp,
// QUESTRT_SERVE_CP, serve-cp:): the groups are the code's, not the
// user's.
type Config struct {
	// Node is the node's name, listen addresses and process timing.
	Node NodeConfig
	// Membership is the gossip membership and failure detection.
	Membership MembershipConfig
	// Security is gRPC's mutual TLS and the cluster's bearer token.
	Security SecurityConfig
	// Grid is the model geometry and the CP x TP grid.
	Grid GridConfig
	// Policy is the selection policy and the CP selection mode.
	Policy PolicyConfig
	// Devices is the kernel backend and its GPUs.
	Devices DeviceConfig
	// Capacity bounds the pages and memory this node hosts.
	Capacity CapacityConfig
	// Offload is the device budget and prefetch of the grids this node
	// coordinates.
	Offload OffloadConfig
	// Storage is the persistence of the grids hosted here.
	Storage StorageConfig
	// Serve is the OpenAI-compatible completions API.
	Serve ServeConfig
	// HTTP bounds the connections of both HTTP servers.
	HTTP HTTPConfig
	// Log is the logging.
	Log LogConfig

	// ConfigFile is the YAML file read under the environment
	// [--config, or QUESTRT_CONFIG]. Default "": none.
	ConfigFile string
}

// NodeConfig is the node itself: its name, the addresses it listens and is
// reached at, the metrics server, and the timing of its shutdown and of
// the grids it coordinates.
type NodeConfig struct {
	// Name is the node's name, unique in the cluster: 1 to 128 bytes of
	// letters, digits, '.', '-' and '_' [--name]. Default: the machine's
	// host name (os.Hostname).
	Name string
	// GRPCAddr is the listen address of the gRPC API (client, worker and
	// health services), host:port with an IP host, or an empty host for
	// every interface; port 0 picks a free port [--grpc-addr]. Default
	// "127.0.0.1:7070".
	GRPCAddr string
	// Advertise is the IP address other nodes reach this node's gRPC and
	// collective listeners (and its gossip) at [--advertise]. Default "":
	// the host of GRPCAddr, which must then not be unspecified (0.0.0.0,
	// :: or empty).
	Advertise string
	// GRPCAdvertise is the gRPC address, host:port with an IP host, put
	// in the node's gossip meta: the one other nodes (and forwarded
	// client calls) dial for this node's worker and client APIs, and the
	// "grpc" of the ready line; for a proxy or port mapping in front of
	// --grpc-addr (under TLS the node's certificate must be valid for its
	// host) [--grpc-advertise]. It changes nothing else: the collective
	// listeners and gossip advertise Advertise. Default "": the advertise
	// host (Advertise, or the host of GRPCAddr) and the port GRPCAddr
	// listens on.
	GRPCAdvertise string
	// MetricsAddr is the listen address of the HTTP server of /metrics
	// (Prometheus), /healthz and /readyz, host:port with an IP or empty
	// host; port 0 picks a free port; "" disables the server
	// [--metrics-addr]. Default "127.0.0.1:9464".
	MetricsAddr string
	// DrainTimeout is how long SIGTERM or SIGINT waits for in-flight steps
	// before the node leaves the cluster; 0 leaves at once
	// [--drain-timeout]. Default 10s.
	DrainTimeout time.Duration
	// GridIdle closes a grid this node coordinates once it has held no
	// sequence for that long, freeing the pages its ranks reserve on
	// their nodes; 0 keeps grids open until the node stops
	// [--grid-idle-timeout]. Default 1m.
	GridIdle time.Duration
	// ReadyFile, when set, receives the ready JSON line too (it is always
	// printed on stdout) [--ready-file]. Default "".
	ReadyFile string
}

// MembershipConfig is the gossip membership of the node
// (cluster.MemberConfig, built by [Config.memberConfig]): where it binds,
// whom it joins, its label and keys, and failure detection. With the
// defaults, cluster.MemberConfig.DetectionBound puts the time to declare a
// killed node dead at 9.8s in a cluster of 3 (about 6s measured).
type MembershipConfig struct {
	// GossipAddr is the memberlist bind address, UDP and TCP, host:port
	// with an IP host (empty: 0.0.0.0); port 0 picks a free port
	// [--gossip-addr]. Default "127.0.0.1:7946".
	GossipAddr string
	// Join lists the gossip addresses (host:port) of existing members to
	// join through; empty starts a new cluster [--join, repeatable or a
	// comma-separated list; a YAML sequence in the file]. Default none.
	Join []string
	// Label is the memberlist label: nodes with another label are
	// ignored; "" means no label [--cluster-label]. Default "questrt".
	Label string
	// KeyFile names a file holding the memberlist encryption key,
	// base64 of 16, 24 or 32 bytes; further lines hold older keys that
	// still decrypt (for rotation) [--gossip-key-file]. Default "": gossip
	// is not encrypted.
	KeyFile string
	// Keys are the keys read from KeyFile by loadConfig, the
	// first one encrypting. Not a flag.
	Keys [][]byte
	// ProbeInterval is the time between two probes of a random member
	// [--probe-interval]. Default 1s.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a direct probe waits for its ack, below
	// ProbeInterval [--probe-timeout]. Default 500ms.
	ProbeTimeout time.Duration
	// SuspicionMult scales the time a suspect member has to refute before
	// it is declared dead: SuspicionMult x max(1, log10(N)) x
	// ProbeInterval [--suspicion-mult]. Default 4.
	SuspicionMult int
	// GossipInterval is the time between two gossip rounds
	// [--gossip-interval]. Default 200ms.
	GossipInterval time.Duration
	// DeadNodeReclaim is how long after a member is declared dead a node
	// may take over its name from another address (a restarted node on
	// new ports) [--dead-node-reclaim]. Default 100ms.
	DeadNodeReclaim time.Duration
}

// SecurityConfig is the gRPC transport security and authentication of the
// node (node.Config's fields of the same names).
type SecurityConfig struct {
	// Plaintext runs gRPC without TLS; only when asked for, and not
	// together with the TLS files; questd logs a warning at start
	// [--insecure, or its alias --plaintext]. Default false.
	Plaintext bool
	// TLSCert, TLSKey and TLSCA are the PEM files of mutual TLS: this
	// node's certificate and key, and the CA that signs every node's and
	// client's certificate. Required, all three, unless Plaintext; SIGHUP
	// reads them again (see [newCertReloader])
	// [--tls-cert, --tls-key, --tls-ca]. Default "".
	TLSCert, TLSKey, TLSCA string
	// TokenFile names a file holding the bearer token of the cluster
	// (node.Config.Token): every call of the client API
	// (questrt.decode.v1.Decode), the worker API and the collective
	// streams must carry "authorization: Bearer <token>"; every node of
	// a cluster needs the same file [--token-file]. Default "": no token.
	TokenFile string
	// RequireCertRoles refuses callers whose certificate carries no
	// questrt:// role URI SAN (node.Config.RequireCertRoles)
	// [--require-cert-roles]. Default false for one release: such a
	// certificate counts as a node's, with a warning.
	RequireCertRoles bool
	// Token is the token read from TokenFile by loadConfig, whitespace
	// trimmed. Not a flag, and never printed.
	Token string
}

// GridConfig is the model geometry and the CP x TP grid every sequence of
// the cluster is laid out on (engine.Config's fields of the same names);
// they must be the same on every node.
type GridConfig struct {
	// Layers is the number of transformer layers [--layers]. Default 4.
	Layers int
	// Geometry is the attention geometry, handed to engine.Config as it is:
	// QHeads, the number of query heads, a multiple of KVHeads [--q-heads],
	// default 32; KVHeads, the number of KV heads, divisible by TP [--kv-
	// heads], default 8; HeadDim, the head dimension D [--head-dim], default
	// 128; PageSize, S, tokens per KV page [--page-size], default 16. Its
	// DType is plan.Float32 (the zero value), the storage type of the CPU
	// page store.
	plan.Geometry
	// CP is the number of context-parallel ranks per TP group [--cp].
	// Default 1.
	CP int
	// TP is the number of tensor-parallel ranks [--tp]. Default 1.
	TP int
	// CapacityPages is the page pool of one rank [--capacity-pages].
	// Default 1024.
	CapacityPages int
	// BlockPages is the block of the contiguous page placement
	// [--block-pages]. Default 64.
	BlockPages int
	// StepTimeout is the deadline of one decode step when the client's is
	// later [--step-timeout]. Default 2s.
	StepTimeout time.Duration
}

// PolicyConfig is the selection policy (plan.Policy, built by
// [PolicyConfig.plan]) and the CP selection mode; they must be the same on
// every node.
type PolicyConfig struct {
	// BudgetTokens is the token budget per head per step
	// [--budget-tokens]. Default 2048.
	BudgetTokens int
	// SinkPages are the first pages, always read [--sink-pages]. Default 0.
	SinkPages int
	// LocalPages are the last pages, always read [--local-pages].
	// Default 1.
	LocalPages int
	// DenseLayers: layers below this index read every page
	// [--dense-layers]. Default 2.
	DenseLayers int
	// DenseRho: a sparse layer reads every page while 1/S + K/P >= it
	// [--dense-rho] (plan.Policy.DenseRho). Default 0, off.
	DenseRho float64
	// ReuseSteps: a sparse layer ranks afresh every ReuseSteps-th step
	// of a sequence and reuses its last selection plus the newer pages
	// in between [--reuse-steps] (plan.Policy.ReuseSteps). Default 0,
	// off.
	ReuseSteps int
	// ReuseLayers: each listed layer attends the pages the layer before
	// it selected at the same step instead of ranking [--reuse-layers]
	// (plan.Policy.ReuseLayers). Default none.
	ReuseLayers []int
	// GQA is how a KV head's query heads share pages, group_max or
	// per_head [--gqa]. Default group_max.
	GQA plan.GQAMode
	// Selector ranks pages: quest, oracle, recent or dense [--selector].
	// Default quest.
	Selector plan.Selector
	// Selection is how CP ranks agree on pages: exact, union or
	// replicated [--selection]. Default exact.
	Selection plan.SelectMode
	// File is a policy file (plan.ReadPolicyFile, as questctl
	// calibrate writes it) [--policy]: its values fill the policy flags
	// not given on the command line, in the environment or in --config,
	// and it adds per-layer budgets and dense layers. Default "".
	File string
	// LayerBudget is the per-layer token budgets read from File by
	// loadConfig (plan.Policy.LayerBudget). Not a flag.
	LayerBudget map[int]int
}

// DeviceConfig is the kernel backend of the ranks hosted on this node and
// the GPUs they are placed on.
type DeviceConfig struct {
	// Backend runs the hosted ranks' kernels: cpu, or cuda in a -tags
	// cuda build on a GPU host [--backend]. With cuda every hosted rank's
	// pages live only in the memory of its GPU (device-resident; not with
	// --data-dir). Default cpu.
	Backend string
	// Ordinals are the GPU ordinals the hosted ranks are placed over, each
	// rank on the device holding the fewest ranks (counted, not their
	// memory), several ranks sharing a device when there are more ranks
	// than devices (one CUDA context per device) [--devices,
	// comma-separated]. Default: every GPU the driver lists. Only with
	// --backend cuda.
	Ordinals []int
	// KVCacheDType is the storage type of K, V and summaries on the GPU:
	// f32, f16, bf16 or fp8 [--kv-cache-dtype]. Default bf16. Only with
	// --backend cuda; or fp8 with --backend cpu and --model. fp8 (K/V
	// records, summaries f32) is also the served model's pages in every
	// --serve-layout: the in-process engine's (local), the cluster's
	// grids' (cluster: worker.Config.DType, named to the nodes on the
	// worker wire) or the GPU's (device); with --device-budget-pages
	// the GPU's offload slot pools hold fp8 records too.
	KVCacheDType plan.DType
}

// CapacityConfig bounds the pages and the host memory of the ranks hosted
// on this node.
type CapacityConfig struct {
	// MaxPages is the number of pages this node hosts over all the grids
	// placed on it, at least CapacityPages; 0 means 8 x CapacityPages
	// [--max-pages]. Default 0. See [Config.hostPages].
	MaxPages int
	// MaxMemory bounds the host bytes of the node's page pools: a byte
	// count, memlimit.Auto (0, the memory available at start) or
	// memlimit.NoLimit (-1) [--max-memory: bytes like 8GiB, auto or none].
	// Default auto.
	MaxMemory int64
}

// OffloadConfig is the offload of the grids this node coordinates: the
// offload.Settings that engine.Config embeds too, handed over as it is
// (engineConfig), and that travels to the nodes hosting the grid. Its
// fields are flags: DeviceBudgetPages [--device-budget-pages] turns
// offload on, at most that many pages' K/V per rank in its device pool
// and the others in a host tier, at most Grid.CapacityPages, default 0
// (off); Eviction [--eviction], lru or score, default lru;
// PrefetchPages [--prefetch-pages], the pages an offloading rank
// prefetches per step, at most Grid.CapacityPages, needs
// DeviceBudgetPages, default 0 (off); PrefetchCrossLayer
// [--prefetch-cross-layer] prefetches the next layer's pages too, needs
// PrefetchPages, default false.
type OffloadConfig struct {
	offload.Settings
}

// StorageConfig is the persistence of the grids hosted on this node
// (node.Config's fields of the same names).
type StorageConfig struct {
	// DataDir is the directory the grids hosted here persist their
	// sequences in (sealed pages when they seal, everything at a
	// graceful shutdown), one subdirectory per grid derived from its
	// coordinator's name and its shape, so that the same grid opened
	// after a restart recovers them (the recovery is logged and counted
	// in questrt_recovery_*); questd holds DIR/LOCK, and a second questd
	// on DIR fails to start [--data-dir]. The coordinator of the grid
	// (the same node name) adopts the recovered sequences when it opens
	// the grid again (its first Create, or the Decode API's Recovered
	// call, which opens the grid of the node's config): under their old
	// ids, at the length every rank kept, the lost tail tokens reported
	// (Recovered, Status) for the client to append again. A sequence is
	// adopted only by a grid on the nodes it was placed on; on other
	// nodes (one of its nodes not up yet after a full restart) it stays
	// parked on disk for a later grid of its placement. Sequences a node
	// of their placement lost are freed and reported damaged; those
	// whose adoption failed otherwise (a timeout, a node unavailable)
	// stay parked and are reported damaged with parked set. Default "":
	// no persistence.
	DataDir string
	// Durability is when persisted changes become durable: sync (every
	// page seal and sequence change is fsynced before it returns) or
	// periodic (a flusher every SyncInterval) [--durability]. Default
	// sync.
	Durability pagestore.Durability
	// SyncInterval is the flush period of --durability periodic
	// [--sync-interval]. Default 1s.
	SyncInterval time.Duration
	// Verify is when a grid opened on a data directory reads and checks
	// the pages it recovers: at-open (every page read, its checksum and
	// summaries checked, before the grid opens) or on-read (the grid
	// opens on the metadata and the persisted summaries; a page is read
	// and checked at its sequence's first use or by a background scrub,
	// and a page that fails releases the sequences naming it: their
	// calls fail with the damage (DATA_LOSS), the coordinator lists an
	// adopted one as damaged from then on, and the next restart reports
	// them damaged with the failed check) [--recovery-verify]. Default
	// on-read.
	Verify pagestore.Verify
	// ScrubRate is the bytes per second each store's background scrub
	// reads with --recovery-verify on-read, or -1 for no scrub (pages
	// checked at first use only) [--scrub-rate]. Default 64 MiB/s.
	ScrubRate int64
}

// ServeConfig is the OpenAI-compatible completions API (package completion,
// built by [Config.serveConfig]): the model runs on this node under this
// node's selection policy, its KV pages in an in-process engine or on a
// grid of the cluster's nodes (Layout).
type ServeConfig struct {
	// Model is a Hugging Face Llama checkpoint directory to serve
	// [--model]; needs Addr. Default "": no model.
	Model string
	// Addr is the listen address of the completions API [--http-addr];
	// needs Model. Default "".
	Addr string
	// TLSCert and TLSKey are the PEM files of the completions
	// API's TLS certificate and key: with both it serves HTTPS (HTTP/2
	// and HTTP/1.1, TLS 1.2 and up), SIGHUP reloading them
	// [--http-tls-cert, --http-tls-key]. Default "": plaintext HTTP (a
	// warning at start when Addr is not loopback).
	TLSCert, TLSKey string
	// AllowedOrigins are the origins whose browsers may call the
	// completions API cross-origin (CORS; "*": any)
	// [--allowed-origins]. Default none.
	AllowedOrigins []string
	// ModelName is the model's id in the API [--model-name]. Default "":
	// the base name of Model.
	ModelName string
	// ChatTemplate is a Jinja chat template file for POST
	// /v1/chat/completions [--chat-template]. Default "": the
	// checkpoint's own (tokenizer_config.json or chat_template.jinja).
	ChatTemplate string
	// MaxRunning caps the sequences prefilling or decoding at once, one
	// per choice of a request (n x prompts) [--max-running]. Default 16.
	MaxRunning int
	// MaxQueued caps the admitted sequences waiting for a running slot
	// or for their request's pages [--max-queued]: a request is admitted
	// while the running and queued sequences, its own included, number
	// at most MaxRunning + MaxQueued, else refused with 429. Default 64.
	MaxQueued int
	// DefaultMaxTokens is max_tokens of a request that gives none
	// [--default-max-tokens]: at least 1, or -1 for the rest of
	// MaxModelLen after the prompt (completion.RestOfContext). Default 16.
	DefaultMaxTokens int
	// MaxModelLen bounds a request's prompt plus max_tokens
	// [--max-model-len]. Default 0: the model's max_position_embeddings.
	MaxModelLen int
	// MaxRequestBytes bounds a request body [--max-request-bytes].
	// Default 32 MiB (a prompt of millions of bytes, or of token ids).
	MaxRequestBytes int
	// RequestTimeout bounds a request from its arrival to its last token
	// [--request-timeout]; 0: no bound besides the client's. Default 30m.
	RequestTimeout time.Duration
	// SSEKeepAlive is how long a stream may stay silent before it writes
	// an SSE comment [--sse-keepalive]; 0: never. Default 15s.
	SSEKeepAlive time.Duration
	// PrefillChunk is the prompt tokens prefilled between two decode steps
	// [--prefill-chunk-tokens]. Default 512.
	PrefillChunk int
	// MaxBatchedTokens bounds the tokens of one scheduler iteration:
	// a decode token per decoding sequence, then prompt tokens up to the
	// rest [--max-batched-tokens]. Default 0: --prefill-chunk-tokens plus
	// --max-running (decoding never shrinks a chunk).
	MaxBatchedTokens int
	// MaxITLFactor bounds a scheduler iteration beside decoding
	// sequences to this many times their decode step by measured costs:
	// it prefills on the CPU only the prompt tokens that fit, none when
	// not even one does (the unspent time is kept for the next
	// iterations, and a token runs after 16 such iterations in a row
	// whatever it costs) [--max-itl-factor]. Default 2; 0 is off (the
	// token bounds alone); else 1..100.
	MaxITLFactor float64
	// DevicePrefill prefills prompts on the GPU with --serve-layout device
	// (the executor's GEMMs and prefill attention; needs bf16 or f16
	// pages), else on the CPU into the GPU's pages [--device-prefill].
	// Default true.
	DevicePrefill bool
	// CapacityPages is the page pool of the served model's engine
	// [--serve-capacity-pages]. Default 0: with Layout local sized
	// from memory (completion.Config.CapacityPages 0, MemoryFraction), with
	// device from the GPU's memory (GPUMemoryUtilization), with cluster
	// from the free pages the nodes advertise (servePages).
	CapacityPages int
	// MemoryFraction is the share of the available memory a pool
	// sized from memory takes [--serve-memory-fraction]. Default 0.5
	// (completion.DefaultMemoryFraction).
	MemoryFraction float64
	// GrowReservations reserves a request's pages as it grows, and
	// preempts the newest request when the pool runs out
	// (completion.Config.GrowReservations) [--grow-reservations]. Default
	// true; false: a request reserves its whole context when it starts.
	GrowReservations bool
	// GPUMemoryUtilization is, with Layout device and CapacityPages 0,
	// the share of the GPU's total memory questd takes in all (weights,
	// activations, scratch and the pool, which gets what is left once
	// the others are allocated), as vLLM's gpu_memory_utilization
	// [--gpu-memory-utilization]. Default 0.9; 0 < F <= 1.
	GPUMemoryUtilization float64
	// PrefixCaching keeps prompts' full pages for later requests with
	// the same token prefix [--prefix-caching] (completion.Config's; every
	// layout: with cluster, on the requests' grid). Default true.
	PrefixCaching bool
	// PrefixCachePages bounds the pages per shard the prefix cache holds
	// [--prefix-cache-pages]: 0 is as many as the pool leaves free (it
	// gives way to requests first); at most CapacityPages. Default 0.
	PrefixCachePages int
	// Layout is where the served requests' KV pages live
	// [--serve-layout]: "local", an in-process engine on this node, or
	// "cluster", a CP x TP grid of the cluster's nodes that
	// this node coordinates (serveengine.CoordinatorCluster; CapacityPages per
	// rank). Default local.
	Layout string
	// CP and TP are the grid of every served request's
	// sequence [--serve-cp, --serve-tp]: context-parallel ranks (its
	// pages spread over them) and tensor-parallel ranks (the model's KV
	// heads split over them). Default 1 x 1.
	CP, TP int
	// PolicyGrids bounds, with Layout cluster, the grids
	// opened for requests whose quest options (selector, gqa, sink,
	// local) differ from the node's policy (completion.Config.PolicyGrids):
	// each counts while this node runs (the coordinator may close it
	// once idle, --grid-idle-timeout, and reopen it), every rank reserving
	// CapacityPages pages, and a request that would open one more gets 429
	// [--serve-policy-grids]. Default 2.
	PolicyGrids int
	// GridRetries is, with Layout cluster, how many times a
	// request whose grid is lost (a node of it killed, restarted or
	// unreachable) runs again on a new grid, from its prompt and the
	// tokens already generated, before it fails with 503 or an error
	// event (completion.Config.GridRetries) [--serve-grid-retries]; 0: never.
	// GridRetryWait bounds how long a retry keeps trying to create
	// its new grid while the cluster is unavailable (a killed node may
	// be placed again until membership declares it dead)
	// [--serve-grid-retry-wait]. Defaults 1 and 10s.
	GridRetries   int
	GridRetryWait time.Duration
	// ClusterWait bounds, with Layout cluster and a pool sized from the
	// nodes (CapacityPages 0), how long startup waits for the nodes to
	// advertise free pages for one request of MaxModelLen
	// (completion.Config.ClusterWait) [--serve-cluster-wait]; 0: one look.
	// ClusterResize is how often such a pool looks at the nodes again
	// to follow them as they join and leave (completion.Config.ClusterResize)
	// [--serve-cluster-resize]; 0: sized once at startup. Defaults 30s
	// and 2s.
	ClusterWait   time.Duration
	ClusterResize time.Duration
	// MonitorRate is the fraction of decode steps' (layer, KV head) pairs
	// the quality monitor replays with dense attention on the side
	// [--monitor-rate], 0..1. Default 0: off.
	MonitorRate float64
	// MonitorQueue bounds the monitor's replays waiting or running
	// [--monitor-queue]; samples past it are dropped and counted.
	// Default 64.
	MonitorQueue int
	// RequestHistory is how many finished requests the API keeps for
	// GET /admin/requests/{id} and questctl replay-request
	// [--request-history]. Default 64; 0: none.
	RequestHistory int
	// LogStatsInterval is the period of the completions API's stats line
	// (tokens/s, running and queued sequences, pool and prefix cache
	// use; none while idle) [--log-stats-interval]. Default 10s; 0: off.
	LogStatsInterval time.Duration
}

// HTTPConfig is the connections of both HTTP servers, the completions API
// (ServeConfig.Addr) and the metrics server (NodeConfig.MetricsAddr): see
// httpServerConfig for the bounds that are not flags.
type HTTPConfig struct {
	// MaxConns caps the connections each HTTP server holds open; at
	// the cap new clients wait in the listen backlog, holding no file
	// descriptor, until one closes [--http-max-conns], 1..1048576.
	// Default 256.
	MaxConns int
	// ReadHeaderTimeout is how long a connection has to send a
	// request's headers (a silent one is closed then)
	// [--http-read-header-timeout]. Default 5s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that has waited this
	// long for its next request [--http-idle-timeout]. Default 60s.
	IdleTimeout time.Duration
}

// LogConfig is the node's logging on stderr.
type LogConfig struct {
	// Level is the lowest level logged: debug, info, warn or error
	// [--log-level]. Default info.
	Level slog.Level
	// Format is text or json [--log-format]. Default text.
	Format string
}

// errHelp is returned by loadConfig after --help printed the usage: main
// exits 0.
var errHelp = errors.New("questd: help printed")

// errVersion is returned by loadConfig for --version: main prints the
// version line and exits 0.
var errVersion = errors.New("questd: version asked for")

// errPrinted is returned by loadConfig after --print-config printed the
// configuration: main exits 0.
var errPrinted = errors.New("questd: configuration printed")

// loadConfig builds the configuration from args (without the program
// name), the environment read through getenv, the YAML file of --config
// (or QUESTRT_CONFIG) and the defaults, in that order of precedence, and
// validates it. Every flag not given in args takes the environment's
// value if there is one, else the file's; both go through the flag's own
// parser (fs.Set). --help prints the usage to stdout and returns
// [errHelp]. Every other error is a one-line configuration error, in the
// form `--flag "value": why` (a usage error: exit 2).
func loadConfig(args []string, getenv func(string) (string, bool), stdout io.Writer) (Config, error) {
	host, _ := os.Hostname()
	var c Config
	fs, groups := newFlagSet(&c, host)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, groups)
			return Config{}, errHelp
		}
		return Config{}, fmt.Errorf("%s (see 'questd --help')", parseError(fs, err))
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q (see 'questd --help')", fs.Args())
	}
	onCLI := map[string]bool{} // by the flag's own name, given by it or an alias
	fs.Visit(func(f *flag.Flag) { onCLI[canonicalFlag(f.Name)] = true })
	if onCLI[versionFlag] && fs.Lookup(versionFlag).Value.String() == "true" {
		return Config{}, errVersion
	}
	origin := map[string]string{} // flag -> where a value not on the command line came from

	env := map[string]string{}    // flag's own name -> value
	envVar := map[string]string{} // flag's own name -> the variable that gave it
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if cliOnly(f.Name) {
			return
		}
		name := canonicalFlag(f.Name)
		v, ok := getenv(envName(f.Name))
		if !ok || v == "" || onCLI[name] {
			return
		}
		if prev, dup := envVar[name]; dup && !sameValue(f, env[name], v) && envErr == nil {
			envErr = fmt.Errorf("%s %q and %s %q: the same setting (--%s); set one", prev, env[name], envName(f.Name), v, name)
		}
		env[name], envVar[name] = v, envName(f.Name)
	})
	if envErr != nil {
		return Config{}, envErr
	}
	if v, ok := env["config"]; ok {
		if err := fs.Set("config", v); err != nil {
			return Config{}, err
		}
		origin["config"] = envVar["config"]
	}
	if c.ConfigFile != "" {
		if err := applyFile(fs, c.ConfigFile, onCLI, origin); err != nil {
			return Config{}, err
		}
	}
	for _, name := range sortedKeys(env) {
		if name == "config" {
			continue
		}
		f := fs.Lookup(name)
		if l, ok := f.Value.(*listValue); ok {
			l.reset()
		}
		if err := fs.Set(name, env[name]); err != nil {
			return Config{}, fmt.Errorf("%s %q: %s", envVar[name], env[name], setWhy(f, err))
		}
		origin[name] = envVar[name]
	}
	if c.Membership.KeyFile != "" {
		keys, err := readGossipKeys(c.Membership.KeyFile)
		if err != nil {
			return Config{}, withOrigin(fmt.Errorf("--gossip-key-file %q: %w", c.Membership.KeyFile, err), origin["gossip-key-file"])
		}
		c.Membership.Keys = keys
	}
	if c.Security.TokenFile != "" {
		tok, err := readToken(c.Security.TokenFile)
		if err != nil {
			return Config{}, withOrigin(fmt.Errorf("--token-file %q: %w", c.Security.TokenFile, err), origin["token-file"])
		}
		c.Security.Token = tok
	}
	if c.Policy.File != "" {
		given := func(name string) bool { return onCLI[name] || origin[name] != "" }
		if err := c.readPolicy(given); err != nil {
			return Config{}, withOrigin(fmt.Errorf("--policy %q: %w", c.Policy.File, err), origin["policy"])
		}
	}
	if err := c.Validate(); err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return Config{}, withOrigin(err, origin[fe.flag])
		}
		return Config{}, err
	}
	// Secret files other users can read are refused (a file that is
	// missing is reported where it is read).
	for _, f := range []struct{ flag, path string }{{"gossip-key-file", c.Membership.KeyFile}, {"token-file", c.Security.TokenFile}, {"tls-key", c.Security.TLSKey}, {"http-tls-key", c.Serve.TLSKey}} {
		if f.path == "" {
			continue
		}
		if err := checkSecretMode(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return Config{}, withOrigin(fmt.Errorf("--%s %q: %w", f.flag, f.path, unwrapPath(err)), origin[f.flag])
		}
	}
	if onCLI[printConfigFlag] && fs.Lookup(printConfigFlag).Value.String() == "true" {
		if err := printConfig(stdout, fs, groups); err != nil {
			return Config{}, err
		}
		return Config{}, errPrinted
	}
	return c, nil
}

// sameValue reports whether a and b are the same value for flag f (1 and
// true for a bool, 08 and 8 for an integer).
func sameValue(f *flag.Flag, a, b string) bool {
	switch kindOf(f) {
	case kindBool:
		x, errX := strconv.ParseBool(a)
		y, errY := strconv.ParseBool(b)
		return errX == nil && errY == nil && x == y
	case kindInt:
		x, errX := strconv.Atoi(a)
		y, errY := strconv.Atoi(b)
		return errX == nil && errY == nil && x == y
	}
	return a == b
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
