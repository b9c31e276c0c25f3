package main

import (
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// Config is the configuration of one questd node. [loadConfig] fills it
// from the command line, QUESTRT_* environment variables, a YAML file and
// the defaults, in that order of precedence, and validates it. The flag
// definitions in [newFlagSet] are the single source of truth: each field
// below is one flag (named in brackets), and its default is the flag's.
type Config struct {
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

	// GossipAddr is the memberlist bind address, UDP and TCP, host:port
	// with an IP host (empty: 0.0.0.0); port 0 picks a free port
	// [--gossip-addr]. Default "127.0.0.1:7946".
	GossipAddr string
	// Join lists the gossip addresses (host:port) of existing members to
	// join through; empty starts a new cluster [--join, repeatable or a
	// comma-separated list; a YAML sequence in the file]. Default none.
	Join []string
	// ClusterLabel is the memberlist label: nodes with another label are
	// ignored; "" means no label [--cluster-label]. Default "questrt".
	ClusterLabel string
	// GossipKeyFile names a file holding the memberlist encryption key,
	// base64 of 16, 24 or 32 bytes; further lines hold older keys that
	// still decrypt (for rotation) [--gossip-key-file]. Default "": gossip
	// is not encrypted.
	GossipKeyFile string
	// GossipKeys are the keys read from GossipKeyFile by loadConfig, the
	// first one encrypting. Not a flag.
	GossipKeys [][]byte

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
	// TokenFile names a file holding the bearer token of the client API
	// (node.Config.Token): every call of questrt.decode.v1.Decode must
	// carry "authorization: Bearer <token>" [--token-file]. Default "":
	// no token.
	TokenFile string
	// Token is the token read from TokenFile by loadConfig, whitespace
	// trimmed. Not a flag, and never printed.
	Token string

	// The model geometry and the CP x TP grid every sequence of the
	// cluster is laid out on; they must be the same on every node.

	// Layers is the number of transformer layers [--layers]. Default 4.
	Layers int
	// QHeads is the number of query heads, a multiple of KVHeads
	// [--q-heads]. Default 32.
	QHeads int
	// KVHeads is the number of KV heads, divisible by TP [--kv-heads].
	// Default 8.
	KVHeads int
	// HeadDim is the head dimension D [--head-dim]. Default 128.
	HeadDim int
	// PageSize is S, tokens per KV page [--page-size]. Default 16.
	PageSize int
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

	// The selection policy (plan.Policy) and the CP selection mode.

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
	// GQA is how a KV head's query heads share pages, group_max or
	// per_head [--gqa]. Default group_max.
	GQA plan.GQAMode
	// Selector ranks pages: quest, oracle, recent or dense [--selector].
	// Default quest.
	Selector plan.Selector
	// Selection is how CP ranks agree on pages: exact, union or
	// replicated [--selection]. Default exact.
	Selection plan.SelectMode
	// PolicyFile is a policy file (plan.ReadPolicyFile, as questctl
	// calibrate writes it) [--policy]: its values fill the policy flags
	// not given on the command line, in the environment or in --config,
	// and it adds per-layer budgets and dense layers. Default "".
	PolicyFile string
	// LayerBudget is the per-layer token budgets read from PolicyFile by
	// loadConfig (plan.Policy.LayerBudget). Not a flag.
	LayerBudget map[int]int

	// MaxPages is the number of pages this node hosts over all the grids
	// placed on it, at least CapacityPages; 0 means 8 x CapacityPages
	// [--max-pages]. Default 0. See [Config.hostPages].
	MaxPages int
	// MaxMemory bounds the host bytes of the node's page pools: a byte
	// count, memlimit.Auto (0, the memory available at start) or
	// memlimit.NoLimit (-1) [--max-memory: bytes like 8GiB, auto or none].
	// Default auto.
	MaxMemory int64

	// Offload of the grids this node coordinates (engine.Config's fields
	// of the same name; they travel to the nodes hosting the grid).

	// Backend runs the hosted ranks' kernels: cpu, or cuda in a -tags
	// cuda build on a GPU host [--backend]. With cuda every hosted rank's
	// pages live only in the memory of its GPU (device-resident; not with
	// --data-dir). Default cpu.
	Backend string
	// Devices are the GPU ordinals the hosted ranks are placed over, each
	// rank on the device holding the fewest ranks (counted, not their
	// memory), several ranks sharing a device when there are more ranks
	// than devices (one CUDA context per device) [--devices,
	// comma-separated]. Default: every GPU the driver lists. Only with
	// --backend cuda.
	Devices []int
	// KVCacheDType is the storage type of K, V and summaries on the GPU:
	// f32, f16 or bf16 [--kv-cache-dtype]. Default bf16. Only with
	// --backend cuda.
	KVCacheDType plan.DType

	// DeviceBudgetPages turns offload on: at most that many pages' K/V per
	// rank stay in its device pool, the others in a host tier, at most
	// CapacityPages; 0 is off [--device-budget-pages]. Default 0.
	DeviceBudgetPages int
	// Eviction is the offload eviction policy, lru or score
	// [--eviction]. Default lru.
	Eviction pagestore.Eviction
	// PrefetchPages is the pages an offloading rank prefetches per step,
	// at most CapacityPages; 0 is off; needs DeviceBudgetPages
	// [--prefetch-pages]. Default 0.
	PrefetchPages int
	// PrefetchCrossLayer prefetches the next layer's pages too; needs
	// PrefetchPages [--prefetch-cross-layer]. Default false.
	PrefetchCrossLayer bool

	// Persistence of the grids hosted on this node (node.Config's fields
	// of the same name).

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

	// StepTimeout is the deadline of one decode step when the client's is
	// later [--step-timeout]. Default 2s.
	StepTimeout time.Duration

	// Failure detection (cluster.MemberConfig's fields of the same name).
	// With the defaults, cluster.MemberConfig.DetectionBound puts the time
	// to declare a killed node dead at 9.8s in a cluster of 3 (about 6s
	// measured).

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
	// new ports) [--dead-node-reclaim]. Default 5s.
	DeadNodeReclaim time.Duration

	// DrainTimeout is how long SIGTERM or SIGINT waits for in-flight steps
	// before the node leaves the cluster; 0 leaves at once
	// [--drain-timeout]. Default 10s.
	DrainTimeout time.Duration

	// GridIdle closes a grid this node coordinates once it has held no
	// sequence for that long, freeing the pages its ranks reserve on
	// their nodes; 0 keeps grids open until the node stops
	// [--grid-idle-timeout]. Default 1m.
	GridIdle time.Duration

	// MetricsAddr is the listen address of the HTTP server of /metrics
	// (Prometheus), /healthz and /readyz, host:port with an IP or empty
	// host; port 0 picks a free port; "" disables the server
	// [--metrics-addr]. Default "127.0.0.1:9464".
	MetricsAddr string

	// LogLevel is the lowest level logged: debug, info, warn or error
	// [--log-level]. Default info.
	LogLevel slog.Level
	// LogFormat is text or json [--log-format]. Default text.
	LogFormat string
	// ReadyFile, when set, receives the ready JSON line too (it is always
	// printed on stdout) [--ready-file]. Default "".
	ReadyFile string

	// The OpenAI-compatible completions API (package serve): the model
	// runs on this node under this node's selection policy, its KV pages
	// in an in-process engine or on a grid of the cluster's nodes
	// (ServeLayout).

	// Model is a Hugging Face Llama checkpoint directory to serve
	// [--model]; needs HTTPAddr. Default "": no model.
	Model string
	// HTTPAddr is the listen address of the completions API [--http-addr];
	// needs Model. Default "".
	HTTPAddr string
	// ModelName is the model's id in the API [--model-name]. Default "":
	// the base name of Model.
	ModelName string
	// MaxRunning caps the requests decoding at once [--max-running].
	// Default 16.
	MaxRunning int
	// MaxQueued caps the admitted requests waiting to run
	// [--max-queued]. Default 64.
	MaxQueued int
	// PrefillChunk is the prompt tokens prefilled between two decode steps
	// [--prefill-chunk-tokens]. Default 512.
	PrefillChunk int
	// ServePages is the page pool of the served model's engine
	// [--serve-capacity-pages]. Default 4096.
	ServePages int
	// ServeLayout is where the served requests' KV pages live
	// [--serve-layout]: "local", an in-process engine on this node, or
	// "cluster", a ServeCP x ServeTP grid of the cluster's nodes that
	// this node coordinates (serve.CoordinatorCluster; ServePages per
	// rank). Default local.
	ServeLayout string
	// ServeCP and ServeTP are the grid of every served request's
	// sequence [--serve-cp, --serve-tp]: context-parallel ranks (its
	// pages spread over them) and tensor-parallel ranks (the model's KV
	// heads split over them). Default 1 x 1.
	ServeCP, ServeTP int
	// ServePolicyGrids bounds, with ServeLayout cluster, the grids
	// opened for requests whose quest options (selector, gqa, sink,
	// local) differ from the node's policy (serve.Config.PolicyGrids):
	// each counts while this node runs (the coordinator may close it
	// once idle, --grid-idle-timeout, and reopen it), every rank reserving
	// ServePages pages, and a request that would open one more gets 429
	// [--serve-policy-grids]. Default 2.
	ServePolicyGrids int
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

	// The connections of both HTTP servers, the completions API
	// (HTTPAddr) and the metrics server (MetricsAddr): see
	// httpServerConfig for the bounds that are not flags.

	// HTTPMaxConns caps the connections each HTTP server holds open; at
	// the cap new clients wait in the listen backlog, holding no file
	// descriptor, until one closes [--http-max-conns], 1..1048576.
	// Default 256.
	HTTPMaxConns int
	// HTTPReadHeaderTimeout is how long a connection has to send a
	// request's headers (a silent one is closed then)
	// [--http-read-header-timeout]. Default 5s.
	HTTPReadHeaderTimeout time.Duration
	// HTTPIdleTimeout closes a kept-alive connection that has waited this
	// long for its next request [--http-idle-timeout]. Default 60s.
	HTTPIdleTimeout time.Duration

	// ConfigFile is the YAML file read under the environment
	// [--config, or QUESTRT_CONFIG]. Default "": none.
	ConfigFile string
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

// versionFlag is --version: a flag of the command line only (no
// environment variable, no key in the file), and no Config field.
const versionFlag = "version"

// printConfigFlag is --print-config: of the command line only, like
// --version.
const printConfigFlag = "print-config"

// plaintextAlias is --plaintext, the older name of --insecure: both set
// Config.Plaintext.
const plaintextAlias = "plaintext"

// flagAliases maps every other name of a flag to the flag's own name.
// An alias is the flag's Value registered under a second name, so both
// set the same field; it has its own environment variable and file key
// (QUESTRT_TENSOR_PARALLEL_SIZE, tensor-parallel-size:) at the same
// precedence as the flag's: the command line over the environment over
// the file, whichever name each uses. On the command line the last one
// given wins, as for a flag given twice; the environment or the file
// giving both names with different values is an error. --print-config
// prints the flag's own name only.
var flagAliases = map[string]string{
	plaintextAlias:                 "insecure",
	"tensor-parallel-size":         "tp", // vLLM's name
	"decode-context-parallel-size": "cp", // vLLM's name
}

// canonicalFlag is the flag's own name for name, itself or an alias.
func canonicalFlag(name string) string {
	if c, ok := flagAliases[name]; ok {
		return c
	}
	return name
}

// cliOnly reports whether flag name is of the command line only: no
// environment variable, no key in the file.
func cliOnly(name string) bool { return name == versionFlag || name == printConfigFlag }

// envPrefix starts the environment name of every flag.
const envPrefix = "QUESTRT_"

// envName returns the environment variable of flag name: QUESTRT_ and the
// name in upper case with '-' replaced by '_' (grpc-addr: QUESTRT_GRPC_ADDR).
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

const usageHead = `Usage: questd [flags]

questd is the questrt node daemon. It joins the cluster by memberlist
gossip (--join), hosts the shards of the sequences placed on this node,
and serves the client and worker gRPC APIs and the gRPC health service on
--grpc-addr, and Prometheus metrics (/metrics), liveness (/healthz) and
readiness (/readyz: 200 once joined and serving, 503 while draining) over
HTTP on --metrics-addr. Once serving it prints one line on stdout (and to
--ready-file when set; "metrics" only with a --metrics-addr):

  {"event":"ready","name":"NAME","grpc":"HOST:PORT","gossip":"HOST:PORT","metrics":"HOST:PORT"}

SIGTERM or SIGINT drains: in-flight steps get --drain-timeout to finish,
then the node leaves the cluster and exits 0. SIGHUP reads --tls-cert,
--tls-key and --tls-ca again: new connections, incoming and outgoing,
use the new certificate and CAs, open ones go on; a file that does not
load keeps the old ones (logged).
questd --version prints the version line and exits 0; questd
--print-config prints the effective configuration as YAML in the format
--config reads (no secrets: the token file's name, not its token) and
exits 0.

With --token-file every call of the client API (questrt.decode.v1.Decode)
must carry the metadata "authorization: Bearer <token>"; the worker API
(between nodes, under mutual TLS) and the health service do not.

Every flag can also be set in the environment, as QUESTRT_ and the flag's
name in upper case with '-' as '_' (QUESTRT_GRPC_ADDR; empty variables are
ignored), or in the YAML file of --config (or QUESTRT_CONFIG), whose keys
are the flag names (grpc-addr: 127.0.0.1:7070; lists as YAML sequences).
Precedence: flags, then the environment, then the file, then the defaults.
Another name of a flag (--plaintext for --insecure; vLLM's
--tensor-parallel-size for --tp and --decode-context-parallel-size for
--cp) sets the same value, with its own variable and key at the same
precedence; --print-config prints the flag's own name.
`

// flagGroup is a titled section of the usage text.
type flagGroup struct {
	title string
	names []string
}

// flagDefs registers flags in order, in sections for the usage text.
type flagDefs struct {
	fs     *flag.FlagSet
	groups []flagGroup
}

func (d *flagDefs) group(title string) { d.groups = append(d.groups, flagGroup{title: title}) }

func (d *flagDefs) added(name string) {
	g := &d.groups[len(d.groups)-1]
	g.names = append(g.names, name)
}

func (d *flagDefs) str(p *string, name, def, usage string) {
	d.fs.StringVar(p, name, def, usage)
	d.added(name)
}

func (d *flagDefs) int(p *int, name string, def int, usage string) {
	d.fs.IntVar(p, name, def, usage)
	d.added(name)
}

func (d *flagDefs) bool(p *bool, name string, def bool, usage string) {
	d.fs.BoolVar(p, name, def, usage)
	d.added(name)
}

// alias adds name as another name of the flag canonical, defined
// already (see [flagAliases]).
func (d *flagDefs) alias(name, canonical, usage string) {
	if flagAliases[name] != canonical {
		panic(fmt.Sprintf("questd: --%s is not in flagAliases as an alias of --%s", name, canonical))
	}
	d.fs.Var(d.fs.Lookup(canonical).Value, name, usage)
	d.fs.Lookup(name).DefValue = "" // the usage gives the default once, at the flag
	d.added(name)
}

func (d *flagDefs) dur(p *time.Duration, name string, def time.Duration, usage string) {
	d.fs.DurationVar(p, name, def, usage)
	d.added(name)
}

// text adds a flag parsed by set; def goes through set too, so the
// default and a given value take the same path.
func (d *flagDefs) text(name, def, usage string, set func(string) error) {
	if err := set(def); err != nil {
		panic(fmt.Sprintf("questd: default of --%s: %v", name, err))
	}
	d.fs.Var(&textValue{s: def, set: set}, name, usage)
	d.added(name)
}

func (d *flagDefs) list(p *[]string, name, usage string) {
	d.fs.Var(&listValue{p: p}, name, usage)
	d.added(name)
}

// textValue is a flag parsed by a function, which keeps the text given.
type textValue struct {
	s   string
	set func(string) error
}

func (v *textValue) String() string {
	if v == nil {
		return ""
	}
	return v.s
}

func (v *textValue) Set(s string) error {
	if err := v.set(s); err != nil {
		return err
	}
	v.s = s
	return nil
}

// listValue is a list flag: every Set appends its comma-separated items.
type listValue struct{ p *[]string }

func (v *listValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v *listValue) Set(s string) error {
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*v.p = append(*v.p, item)
		}
	}
	return nil
}

// reset empties the list, so that a later source replaces it.
func (v *listValue) reset() { *v.p = nil }

// newFlagSet defines every flag of questd with c's fields as their
// targets, set to the defaults, and returns the usage sections. hostname
// is the default of --name.
func newFlagSet(c *Config, hostname string) (*flag.FlagSet, []flagGroup) {
	fs := flag.NewFlagSet("questd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	d := &flagDefs{fs: fs}

	d.group("Node and network")
	d.str(&c.Name, "name", hostname, "unique node name in the cluster: letters, digits, '.', '-' and '_' (default: the host name)")
	d.str(&c.GRPCAddr, "grpc-addr", "127.0.0.1:7070", "listen `host:port` of the gRPC API (client, worker, health); an IP or empty host; port 0 picks a free port")
	d.str(&c.Advertise, "advertise", "", "IP address other nodes reach this node's gRPC, collective and gossip listeners at (default: the host of --grpc-addr, which must then not be 0.0.0.0 or ::)")
	d.str(&c.GRPCAdvertise, "grpc-advertise", "", "gRPC `host:port` other nodes dial this node's APIs at, put in its gossip meta: for a proxy or port mapping in front of --grpc-addr (default: the --advertise host and the --grpc-addr port)")
	d.str(&c.GossipAddr, "gossip-addr", "127.0.0.1:7946", "memberlist bind `host:port`, UDP and TCP; an IP or empty host; port 0 picks a free port")
	d.list(&c.Join, "join", "gossip `host:port` of an existing member to join through; repeatable or a comma-separated list (default: none, start a new cluster)")
	d.str(&c.ClusterLabel, "cluster-label", "questrt", "memberlist label: nodes with another label are ignored (\"\": none)")
	d.str(&c.GossipKeyFile, "gossip-key-file", "", "`file` holding the base64 memberlist encryption key of 16, 24 or 32 bytes; further lines: older keys that still decrypt (default: no encryption)")

	d.group("Security")
	d.bool(&c.Plaintext, "insecure", false, "run gRPC without TLS: anyone who reaches --grpc-addr can call both APIs (only on a trusted network; not with the --tls-* files; a warning is logged)")
	d.alias(plaintextAlias, "insecure", "the older name of --insecure, the same")
	d.str(&c.TLSCert, "tls-cert", "", "PEM `file` of this node's certificate for mutual TLS (required with --tls-key and --tls-ca unless --insecure; SIGHUP reloads the three)")
	d.str(&c.TLSKey, "tls-key", "", "PEM `file` of this node's private key for mutual TLS")
	d.str(&c.TLSCA, "tls-ca", "", "PEM `file` of the CA that signs every node's and client's certificate")
	d.str(&c.TokenFile, "token-file", "", "`file` holding the bearer token every client API call, and every request of the completions API (--http-addr; OpenAI clients send it as their API key), must carry as \"authorization: Bearer <token>\" (default: no token)")

	d.group("Model geometry and grid (the same on every node)")
	d.int(&c.Layers, "layers", 4, "transformer layers")
	d.int(&c.QHeads, "q-heads", 32, "query heads, a multiple of --kv-heads")
	d.int(&c.KVHeads, "kv-heads", 8, "KV heads, divisible by --tp")
	d.int(&c.HeadDim, "head-dim", 128, "head dimension D")
	d.int(&c.PageSize, "page-size", 16, "tokens per KV page")
	d.int(&c.CP, "cp", 1, "context-parallel ranks per TP group (pages are spread over them)")
	d.alias("decode-context-parallel-size", "cp", "the same as --cp (vLLM's name)")
	d.int(&c.TP, "tp", 1, "tensor-parallel ranks (KV heads are split over them)")
	d.alias("tensor-parallel-size", "tp", "the same as --tp (vLLM's name)")
	d.int(&c.CapacityPages, "capacity-pages", 1024, "page pool of one rank, in pages")
	d.int(&c.BlockPages, "block-pages", 64, "block of the contiguous page placement, in pages")

	d.group("Selection policy (the same on every node)")
	d.int(&c.BudgetTokens, "budget-tokens", 2048, "token budget per head per step, at least --page-size")
	d.int(&c.SinkPages, "sink-pages", 0, "first pages of a sequence, always read")
	d.int(&c.LocalPages, "local-pages", 1, "last pages of a sequence, always read")
	d.int(&c.DenseLayers, "dense-layers", 2, "layers below this index read every page")
	d.text("gqa", "group_max", "how a KV head's query heads share pages: group_max or per_head", func(s string) (err error) {
		c.GQA, err = plan.ParseGQAMode(s)
		return err
	})
	d.text("selector", "quest", "page ranking: quest, oracle, recent or dense", func(s string) (err error) {
		c.Selector, err = plan.ParseSelector(s)
		return err
	})
	d.text("selection", "exact", "how CP ranks agree on pages: exact, union or replicated (replicated: quest or dense selector only)", func(s string) (err error) {
		c.Selection, err = plan.ParseSelectMode(s)
		return err
	})
	d.str(&c.PolicyFile, "policy", "", "policy `file` (YAML, as questctl calibrate --out writes it): per-layer budgets and dense layers; its page_size must equal --page-size, its other values fill the policy flags not given")

	d.group("Devices")
	d.text("backend", "cpu", "kernel backend of the hosted ranks: cpu, or cuda in a -tags cuda build on a GPU host (pages then live only in GPU memory; not with --data-dir); a -tags cuda build needs the NVIDIA driver to start at all, even with cpu", func(s string) error {
		if s != "cpu" && s != "cuda" {
			return errors.New("want cpu or cuda")
		}
		c.Backend = s
		return nil
	})
	d.text("devices", "", "with --backend cuda: comma-separated GPU ordinals the hosted ranks are placed over, each rank on the device holding the fewest (ranks are counted, not memory: a grid too large for its GPU fails when it connects), several ranks sharing one when there are more ranks than devices; a GPU listed twice gets two contexts (default: every GPU the driver lists)", func(s string) error {
		c.Devices = nil
		if s == "" {
			return nil
		}
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				return fmt.Errorf("%q is not a GPU ordinal", f)
			}
			c.Devices = append(c.Devices, n)
		}
		return nil
	})
	d.text("kv-cache-dtype", "bf16", "with --backend cuda: storage type of K, V and summaries in GPU memory: f32, f16 or bf16", func(s string) (err error) {
		c.KVCacheDType, err = plan.ParseDType(s)
		return err
	})

	d.group("Capacity")
	d.int(&c.MaxPages, "max-pages", 0, "pages this node hosts over all grids, at least --capacity-pages (0: 8 x --capacity-pages)")
	d.text("max-memory", "auto", "most host memory for the node's page pools: bytes like 8GiB or 512MiB, auto (the memory available at start, also the cap of a larger value) or none (no check)", func(s string) (err error) {
		c.MaxMemory, err = parseMaxMemory(s)
		return err
	})
	d.int(&c.DeviceBudgetPages, "device-budget-pages", 0, "offload: pages per rank whose K/V stay in device memory, the others in host memory, at most --capacity-pages (0: offload off); for the grids this node coordinates")
	d.text("eviction", "lru", "offload eviction policy: lru or score (lowest decayed selection count)", func(s string) (err error) {
		if c.Eviction, err = pagestore.ParseEviction(s); err != nil || s == "" {
			return errors.New("want lru or score")
		}
		return nil
	})
	d.int(&c.PrefetchPages, "prefetch-pages", 0, "offload: pages per rank and step prefetched from host memory ahead of use, at most --capacity-pages (0: off; needs --device-budget-pages)")
	d.bool(&c.PrefetchCrossLayer, "prefetch-cross-layer", false, "offload: prefetch the next layer's pages too (needs --prefetch-pages)")

	d.group("Persistence")
	d.str(&c.DataDir, "data-dir", "", "`dir` the grids hosted here persist their sequences in, one subdirectory per grid (coordinator and shape): a restart on the same dir (same --name) recovers them when the grid opens again on the same nodes (the first Create, or the Decode API's Recovered call, which lists them under their old ids with the tail tokens lost, to append again; a grid on other nodes leaves them parked); one questd per dir (default: no persistence)")
	d.text("durability", "sync", "with --data-dir: sync (each sealed page and sequence change is fsynced before the call returns) or periodic (flushed every --sync-interval; a crash loses up to that much more)", func(s string) error {
		switch s {
		case "sync":
			c.Durability = pagestore.SyncOnWrite
		case "periodic":
			c.Durability = pagestore.SyncPeriodic
		default:
			return errors.New("want sync or periodic")
		}
		return nil
	})
	d.dur(&c.SyncInterval, "sync-interval", time.Second, "with --durability periodic: time between two flushes")

	d.group("Timing and failure detection")
	d.dur(&c.StepTimeout, "step-timeout", 2*time.Second, "deadline of one decode step when the client's is later")
	d.dur(&c.ProbeInterval, "probe-interval", time.Second, "time between two failure-detection probes of a random member")
	d.dur(&c.ProbeTimeout, "probe-timeout", 500*time.Millisecond, "how long a probe waits for its ack before indirect probes, below --probe-interval")
	d.int(&c.SuspicionMult, "suspicion-mult", 4, "a suspect member has suspicion-mult x max(1, log10(nodes)) x --probe-interval to refute before it is declared dead; with the defaults a killed node is declared dead in about 6s in a 3-node cluster (5.8s measured on loopback)")
	d.dur(&c.GossipInterval, "gossip-interval", 200*time.Millisecond, "time between two gossip rounds (joins, failures and meta updates spread by them)")
	d.dur(&c.DeadNodeReclaim, "dead-node-reclaim", 5*time.Second, "how long after a member is declared dead a restarted node may take over its name from another address")
	d.dur(&c.DrainTimeout, "drain-timeout", 10*time.Second, "how long SIGTERM or SIGINT waits for in-flight steps before leaving the cluster (0: leave at once)")
	d.dur(&c.GridIdle, "grid-idle-timeout", time.Minute, "close a grid this node coordinates once it has held no sequence for this long, freeing the pages its ranks reserve on every node (a grid per sequence config and placement; 0: keep grids open until the node stops)")

	d.group("Metrics and probes")
	d.str(&c.MetricsAddr, "metrics-addr", "127.0.0.1:9464", "listen `host:port` of the HTTP server of /metrics (Prometheus), /healthz and /readyz; an IP or empty host; port 0 picks a free port; \"\" disables it")

	d.group("Completions API (OpenAI-compatible, the model runs on this node)")
	d.str(&c.Model, "model", "", "Hugging Face Llama checkpoint `dir` to serve at --http-addr (config.json, safetensors, tokenizer.json or the byte tokenizer)")
	d.str(&c.HTTPAddr, "http-addr", "", "listen `host:port` of the completions API (POST /v1/completions, GET /v1/models); needs --model")
	d.str(&c.ModelName, "model-name", "", "the model's id in the API (default: the base name of --model)")
	d.int(&c.MaxRunning, "max-running", 16, "requests decoding at once; more wait in the queue")
	d.int(&c.MaxQueued, "max-queued", 64, "admitted requests waiting to run; beyond it requests get 429")
	d.int(&c.PrefillChunk, "prefill-chunk-tokens", 512, "prompt tokens prefilled between two decode steps (long prompts do not stall the others)")
	d.int(&c.ServePages, "serve-capacity-pages", 4096, "page pool of the served model's engine, in pages; requests whose pages would not fit get 429 (--serve-layout cluster: the pool of every rank of the served grid)")
	d.text("serve-layout", "local", "where the served requests' KV pages live, `local|cluster|device`: local (an in-process engine on this node), cluster (a --serve-cp x --serve-tp grid of the cluster's nodes coordinated by this node; the model runs here, attention steps go to the grid's workers) or device (with --backend cuda: the model's decode steps and the pages on the first GPU of --devices, through the device executor; prompts are prefilled on the CPU into the GPU's pages)", func(v string) error {
		if v != "local" && v != "cluster" && v != "device" {
			return fmt.Errorf("want local, cluster or device")
		}
		c.ServeLayout = v
		return nil
	})
	d.int(&c.ServeCP, "serve-cp", 1, "context-parallel ranks of every served request's sequence (its pages are spread over them): in-process shards, or ranks on the cluster's nodes with --serve-layout cluster")
	d.int(&c.ServeTP, "serve-tp", 1, "tensor-parallel ranks of every served request's sequence (the model's KV heads are split over them; must divide them)")
	d.int(&c.ServePolicyGrids, "serve-policy-grids", 2, "with --serve-layout cluster: grids opened for requests whose quest selector, gqa, sink or local differ from --policy's, at most; each counts while this node runs, even once the coordinator closed it idle (every rank reserving --serve-capacity-pages, so the nodes reserve up to 1 + this many pools per rank), and a request that would open one more gets 429; 0: only --policy's options on the cluster")
	d.text("monitor-rate", "0", "fraction `R` (0..1) of decode steps, per layer and KV head, replayed with dense attention off the requests' path: page recall, attention-mass recall and output error histograms by layer on /metrics; 0 is off", func(v string) error {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return fmt.Errorf("want a fraction 0..1")
		}
		c.MonitorRate = r
		return nil
	})
	d.int(&c.MonitorQueue, "monitor-queue", 64, "replays of --monitor-rate waiting or running at most; samples beyond it are dropped and counted")
	d.int(&c.RequestHistory, "request-history", 64, "finished requests kept (prompt, output, settings) for GET /admin/requests/{id} and questctl replay-request; 0 keeps none. Without --token-file the /admin endpoints have no authentication: whoever reaches --http-addr can read these prompts and outputs")

	d.group("HTTP connections (each of the completions API of --http-addr and the metrics server of --metrics-addr)")
	d.int(&c.HTTPMaxConns, "http-max-conns", defaultHTTPMaxConns, "connections each HTTP server holds open at most, 1 to 1048576; at the cap new clients wait in the listen backlog, holding no file descriptor of the node, until a connection closes (idle ones after --http-idle-timeout, silent ones after --http-read-header-timeout); the servers' caps together should stay under half the open-file limit (ulimit -n), which gRPC, gossip and data files share: questd warns at start otherwise")
	d.dur(&c.HTTPReadHeaderTimeout, "http-read-header-timeout", defaultHTTPReadHeaderTimeout, "how long a connection has to send a request's headers, from its accept (or the next request's first byte on a kept-alive connection); a connection that says nothing is closed then")
	d.dur(&c.HTTPIdleTimeout, "http-idle-timeout", defaultHTTPIdleTimeout, "close a kept-alive connection that has waited this long for its next request; streams are not cut: a completion's response may stream for minutes, each write only has to progress within a minute")

	d.group("Logging and process")
	d.text("log-level", "info", "lowest level logged: debug, info, warn or error", func(s string) (err error) {
		c.LogLevel, err = parseLogLevel(s)
		return err
	})
	d.text("log-format", "text", "log format on stderr: text or json", func(s string) error {
		if s != "text" && s != "json" {
			return fmt.Errorf("want text or json")
		}
		c.LogFormat = s
		return nil
	})
	d.str(&c.ReadyFile, "ready-file", "", "`file` that also receives the ready JSON line (it is always printed on stdout)")
	d.str(&c.ConfigFile, "config", "", "YAML `file` of flag values, under the environment and the command line")
	fs.Bool(versionFlag, false, "print the version line and exit (command line only)")
	d.added(versionFlag)
	fs.Bool(printConfigFlag, false, "print the effective configuration (flags, environment, file, defaults) as YAML for --config, without secrets, and exit (command line only)")
	d.added(printConfigFlag)
	return fs, d.groups
}

// parseMaxMemory reads --max-memory: auto, none or a size for
// memlimit.ParseBytes.
func parseMaxMemory(s string) (int64, error) {
	switch strings.TrimSpace(s) {
	case "auto":
		return memlimit.Auto, nil
	case "none":
		return memlimit.NoLimit, nil
	}
	v, err := memlimit.ParseBytes(s)
	if err != nil {
		return 0, errors.New("not a size (want bytes like 8GiB or 512MiB, auto or none)")
	}
	return v, nil
}

// parseLogLevel reads debug, info, warn or error.
func parseLogLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, errors.New("want debug, info, warn or error")
}

// printUsage writes the usage text: what questd does, the precedence
// rule and every flag with its default, by section.
func printUsage(w io.Writer, fs *flag.FlagSet, groups []flagGroup) {
	var b strings.Builder
	b.WriteString(usageHead)
	for _, g := range groups {
		fmt.Fprintf(&b, "\n%s:\n", g.title)
		for _, name := range g.names {
			f := fs.Lookup(name)
			arg, usage := flag.UnquoteUsage(f)
			switch f.Value.(type) {
			case *textValue, *listValue:
				arg = "value"
			}
			if _, ok := f.Value.(interface{ IsBoolFlag() bool }); ok {
				arg = ""
			}
			fmt.Fprintf(&b, "  --%s", name)
			if arg != "" {
				b.WriteString(" " + arg)
			}
			fmt.Fprintf(&b, "\n      %s", usage)
			if f.DefValue != "" && f.DefValue != "[]" && !cliOnly(name) && !strings.Contains(usage, "(default") {
				fmt.Fprintf(&b, " (default %s)", f.DefValue)
			}
			if cliOnly(name) {
				b.WriteString("\n")
				continue
			}
			fmt.Fprintf(&b, "\n      env %s\n", envName(name))
		}
	}
	io.WriteString(w, b.String())
}

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
	if c.GossipKeyFile != "" {
		keys, err := readGossipKeys(c.GossipKeyFile)
		if err != nil {
			return Config{}, withOrigin(fmt.Errorf("--gossip-key-file %q: %w", c.GossipKeyFile, err), origin["gossip-key-file"])
		}
		c.GossipKeys = keys
	}
	if c.TokenFile != "" {
		tok, err := readToken(c.TokenFile)
		if err != nil {
			return Config{}, withOrigin(fmt.Errorf("--token-file %q: %w", c.TokenFile, err), origin["token-file"])
		}
		c.Token = tok
	}
	if c.PolicyFile != "" {
		given := func(name string) bool { return onCLI[name] || origin[name] != "" }
		if err := c.readPolicy(given); err != nil {
			return Config{}, withOrigin(fmt.Errorf("--policy %q: %w", c.PolicyFile, err), origin["policy"])
		}
	}
	if err := c.Validate(); err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return Config{}, withOrigin(err, origin[fe.flag])
		}
		return Config{}, err
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

// withOrigin appends where the value came from, when not the command line.
func withOrigin(err error, origin string) error {
	if origin == "" {
		return err
	}
	return fmt.Errorf("%w (set by %s)", err, origin)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// yamlKind is the kind of YAML value a flag takes in the file.
type yamlKind int

const (
	kindString   yamlKind = iota // a string
	kindInt                      // an integer
	kindBool                     // true or false
	kindDuration                 // a duration string such as 2s
	kindText                     // a string or an integer (sizes, names of modes)
	kindList                     // a sequence of strings
)

func kindOf(f *flag.Flag) yamlKind {
	switch v := f.Value.(type) {
	case *listValue:
		return kindList
	case *textValue:
		return kindText
	case flag.Getter:
		switch v.Get().(type) {
		case bool:
			return kindBool
		case int:
			return kindInt
		case time.Duration:
			return kindDuration
		}
	}
	return kindString
}

var kindWant = map[yamlKind]string{
	kindString:   "a string",
	kindInt:      "an integer",
	kindBool:     "true or false",
	kindDuration: "a duration string such as 2s",
	kindText:     "a string",
	kindList:     "a sequence of strings",
}

// applyFile reads the YAML file at path, a mapping from flag names to
// values, and sets every flag not given on the command line from it.
// Unknown keys, repeated keys and values of the wrong kind are refused.
func applyFile(fs *flag.FlagSet, path string, onCLI map[string]bool, origin map[string]string) error {
	bad := func(line int, format string, args ...any) error {
		where := ""
		if line > 0 {
			where = fmt.Sprintf("line %d: ", line)
		}
		return withOrigin(fmt.Errorf("--config %q: %s%s", path, where, fmt.Sprintf(format, args...)), origin["config"])
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return bad(0, "%v", errors.Unwrap(err))
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return bad(0, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil // an empty file
	}
	top := doc.Content[0]
	if top.Kind == yaml.ScalarNode && top.ShortTag() == "!!null" {
		return nil
	}
	if top.Kind != yaml.MappingNode {
		return bad(top.Line, "want a mapping of flag names to values")
	}
	type keyed struct {
		key  *yaml.Node
		vals []string
	}
	seen := map[string]keyed{} // by the flag's own name: the key that set it and its values
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			return bad(k.Line, "key %q is not a flag name", k.Value)
		}
		name := k.Value
		canon := canonicalFlag(name)
		prev, again := seen[canon]
		if again && prev.key.Value == name {
			return bad(k.Line, "key %q repeated (first on line %d)", name, prev.key.Line)
		}
		f := fs.Lookup(name)
		if f == nil {
			hint := ""
			if alt := strings.ToLower(strings.ReplaceAll(name, "_", "-")); fs.Lookup(alt) != nil {
				hint = fmt.Sprintf(" (did you mean %s?)", alt)
			}
			return bad(k.Line, "unknown key %q%s", name, hint)
		}
		if name == "config" {
			return bad(k.Line, "key %q: a config file cannot name another", name)
		}
		if cliOnly(name) {
			return bad(k.Line, "key %q: --%s is for the command line only", name, name)
		}
		vals, err := yamlValues(v, kindOf(f))
		if err != nil {
			return bad(v.Line, "key %q: %v", name, err)
		}
		if again {
			// A flag and its alias: fine with the same value, set once.
			same := len(vals) == len(prev.vals)
			for j := 0; same && j < len(vals); j++ {
				same = sameValue(f, vals[j], prev.vals[j])
			}
			if !same {
				return bad(k.Line, "key %q: the same setting as %q on line %d (--%s), with another value; give one", name, prev.key.Value, prev.key.Line, canon)
			}
			continue
		}
		seen[canon] = keyed{k, vals}
		if onCLI[canon] {
			continue // still checked above
		}
		if l, ok := f.Value.(*listValue); ok {
			l.reset()
		}
		for _, s := range vals {
			if err := fs.Set(name, s); err != nil {
				return bad(v.Line, "%s %q: %s", name, s, setWhy(f, err))
			}
		}
		origin[canon] = fmt.Sprintf("%s line %d", path, k.Line)
	}
	return nil
}

// yamlValues returns the text of node for fs.Set (one per item of a
// list), checking that it is of kind k.
func yamlValues(n *yaml.Node, k yamlKind) ([]string, error) {
	tag := n.ShortTag()
	wrong := func() error {
		got := map[string]string{"!!str": "a string", "!!int": "an integer", "!!bool": "a boolean",
			"!!float": "a number", "!!null": "empty", "!!timestamp": "a date"}[tag]
		switch {
		case n.Kind == yaml.SequenceNode:
			got = "a sequence"
		case n.Kind == yaml.MappingNode:
			got = "a mapping"
		case got == "":
			got = tag
		}
		hint := ""
		if n.Kind == yaml.ScalarNode && (k == kindString || k == kindText || k == kindDuration) {
			hint = " (quote it)"
		}
		return fmt.Errorf("want %s, not %s%s", kindWant[k], got, hint)
	}
	if k == kindList {
		if n.Kind != yaml.SequenceNode {
			return nil, wrong()
		}
		out := make([]string, 0, len(n.Content))
		for _, item := range n.Content {
			if item.Kind != yaml.ScalarNode || item.ShortTag() != "!!str" {
				return nil, fmt.Errorf("item on line %d: want a string", item.Line)
			}
			if strings.Contains(item.Value, ",") {
				return nil, fmt.Errorf("item %q: one address per item, no commas", item.Value)
			}
			out = append(out, item.Value)
		}
		return out, nil
	}
	if n.Kind != yaml.ScalarNode {
		return nil, wrong()
	}
	switch {
	case k == kindInt && tag == "!!int":
		var v int
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("%q: too large for an integer", n.Value)
		}
		return []string{strconv.Itoa(v)}, nil
	case k == kindBool && tag == "!!bool":
		var v bool
		if err := n.Decode(&v); err != nil {
			return nil, wrong()
		}
		return []string{strconv.FormatBool(v)}, nil
	case (k == kindString || k == kindDuration) && tag == "!!str",
		k == kindText && (tag == "!!str" || tag == "!!int"):
		return []string{n.Value}, nil
	}
	return nil, wrong()
}

// parseErrorRE matches the flag package's "invalid value" errors.
var parseErrorRE = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([^:]+): (.*)$`)

// parseError rewrites fs.Parse's errors as `--flag "value": why`.
func parseError(fs *flag.FlagSet, err error) string {
	m := parseErrorRE.FindStringSubmatch(err.Error())
	if m == nil {
		s := strings.Replace(err.Error(), "flag provided but not defined: -", "unknown flag --", 1)
		return strings.Replace(s, "flag needs an argument: -", "flag needs an argument: --", 1)
	}
	return fmt.Sprintf("--%s %q: %s", m[2], m[1], setWhy(fs.Lookup(m[2]), errors.New(m[3])))
}

// setWhy says in words why a value did not parse for f.
func setWhy(f *flag.Flag, err error) string {
	why := err.Error()
	kind := "a value"
	if f != nil {
		switch kindOf(f) {
		case kindInt:
			kind = "an integer"
		case kindBool:
			kind = "true or false"
		case kindDuration:
			kind = "a duration such as 2s"
		}
	}
	switch {
	case strings.HasSuffix(why, "parse error"), strings.HasSuffix(why, "invalid syntax"):
		return "not " + kind
	case strings.HasSuffix(why, "value out of range"):
		return "too large for " + kind
	}
	return why
}

// readGossipKeys reads the base64 keys of a gossip key file, one per
// line (blank lines and lines starting with '#' are skipped).
func readGossipKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, errors.Unwrap(err)
	}
	var keys [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: not base64", i+1)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no key in the file")
	}
	return keys, nil
}

// readToken reads the bearer token of a token file: its text with the
// surrounding whitespace trimmed, one token of printable ASCII without
// spaces (an HTTP/2 header value).
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", errors.Unwrap(err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", errors.New("empty: want one token")
	}
	for _, r := range tok {
		if r <= ' ' || r > '~' {
			return "", errors.New("want one token of printable ASCII, no spaces or line breaks inside")
		}
	}
	return tok, nil
}

// fieldError is a validation error about one flag's value.
type fieldError struct {
	flag, value, why string
}

func (e *fieldError) Error() string { return fmt.Sprintf("--%s %q: %s", e.flag, e.value, e.why) }

func bad(name, value, format string, args ...any) error {
	return &fieldError{flag: name, value: value, why: fmt.Sprintf(format, args...)}
}

// splitAddr splits a listen address whose host is an IP or empty.
func splitAddr(name, s string) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, bad(name, s, "want host:port")
	}
	if h != "" {
		if _, err := netip.ParseAddr(h); err != nil {
			return "", 0, bad(name, s, "host %q is not an IP address", h)
		}
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, bad(name, s, "port %q: want 0-65535", p)
	}
	return h, int(n), nil
}

// unspecified reports whether host listens on every interface.
func unspecified(host string) bool {
	if host == "" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsUnspecified()
}

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
	if err := checkMember(func(m *cluster.MemberConfig) { m.Name = c.Name }); err != nil {
		if c.Name == "" {
			return bad("name", c.Name, "empty (the host name is unknown: set --name)")
		}
		return bad("name", c.Name, "want 1 to 128 bytes of letters, digits, '.', '-' and '_'")
	}
	grpcHost, _, err := splitAddr("grpc-addr", c.GRPCAddr)
	if err != nil {
		return err
	}
	if c.Advertise != "" {
		a, err := netip.ParseAddr(c.Advertise)
		switch {
		case err != nil:
			return bad("advertise", c.Advertise, "not an IP address")
		case a.IsUnspecified():
			return bad("advertise", c.Advertise, "unspecified: want the address other nodes reach this node at")
		}
	} else if unspecified(grpcHost) {
		return bad("grpc-addr", c.GRPCAddr, "listens on every interface: set --advertise to the address other nodes reach this node at")
	}
	if c.GRPCAdvertise != "" {
		switch h, p, err := splitAddr("grpc-advertise", c.GRPCAdvertise); {
		case err != nil:
			return err
		case unspecified(h):
			return bad("grpc-advertise", c.GRPCAdvertise, "unspecified host: want the address other nodes reach this node's gRPC API at")
		case p == 0:
			return bad("grpc-advertise", c.GRPCAdvertise, "port 0: want the port other nodes dial")
		}
	}
	gossipHost, _, err := splitAddr("gossip-addr", c.GossipAddr)
	if err != nil {
		return err
	}
	switch {
	case c.Model != "" && c.HTTPAddr == "":
		return bad("model", c.Model, "needs --http-addr (where the completions API listens)")
	case c.HTTPAddr != "" && c.Model == "":
		return bad("http-addr", c.HTTPAddr, "needs --model (the checkpoint to serve)")
	case c.MaxRunning < 1:
		return bad("max-running", itoa(c.MaxRunning), "must be at least 1")
	case c.MaxQueued < 0:
		return bad("max-queued", itoa(c.MaxQueued), "must not be negative")
	case c.PrefillChunk < 1:
		return bad("prefill-chunk-tokens", itoa(c.PrefillChunk), "must be at least 1")
	case c.ServePages < 1 || c.ServePages > plan.MaxPages:
		return bad("serve-capacity-pages", itoa(c.ServePages), "want 1..%d", plan.MaxPages)
	case c.ServeCP < 1 || c.ServeCP > 64:
		return bad("serve-cp", itoa(c.ServeCP), "want 1..64")
	case c.ServeTP < 1 || c.ServeTP > 64:
		return bad("serve-tp", itoa(c.ServeTP), "want 1..64")
	case c.ServePolicyGrids < 0:
		return bad("serve-policy-grids", itoa(c.ServePolicyGrids), "must not be negative")
	case c.Model == "" && c.ServeLayout != "local":
		return bad("serve-layout", c.ServeLayout, "needs --model and --http-addr (the completions API whose KV pages it places)")
	case c.Model == "" && (c.ServeCP != 1 || c.ServeTP != 1):
		return bad("serve-cp", itoa(c.ServeCP), "--serve-cp %d x --serve-tp %d needs --model and --http-addr (the completions API it lays out)", c.ServeCP, c.ServeTP)
	case c.ServeLayout == "device" && c.Backend != "cuda":
		return bad("serve-layout", c.ServeLayout, "needs --backend cuda (the device executor runs on a GPU)")
	case c.ServeLayout == "device" && (c.ServeCP != 1 || c.ServeTP != 1):
		return bad("serve-layout", c.ServeLayout, "runs one rank: not with --serve-cp %d x --serve-tp %d", c.ServeCP, c.ServeTP)
	case c.ServeLayout == "device" && c.MonitorRate > 0:
		return bad("serve-layout", c.ServeLayout, "not with --monitor-rate (the monitor replays every layer's q and k, which stay on the GPU)")
	case c.ServeLayout == "cluster" && c.servePagesPerRank() > c.hostPages():
		return bad("serve-capacity-pages", itoa(c.ServePages), "with --serve-layout cluster every rank of the served grid reserves %d pages (plus --monitor-queue with --monitor-rate), more than this node's --max-pages %d", c.servePagesPerRank(), c.hostPages())
	case c.MonitorQueue < 1:
		return bad("monitor-queue", itoa(c.MonitorQueue), "must be at least 1")
	case c.RequestHistory < 0:
		return bad("request-history", itoa(c.RequestHistory), "must not be negative")
	case c.HTTPMaxConns < 1 || c.HTTPMaxConns > maxHTTPConns:
		return bad("http-max-conns", itoa(c.HTTPMaxConns), "want 1..%d connections per HTTP server", maxHTTPConns)
	case c.HTTPReadHeaderTimeout <= 0:
		return bad("http-read-header-timeout", c.HTTPReadHeaderTimeout.String(), "must be positive (a silent connection would be held forever)")
	case c.HTTPIdleTimeout <= 0:
		return bad("http-idle-timeout", c.HTTPIdleTimeout.String(), "must be positive (an idle connection would be held forever)")
	}
	if err := c.httpServer().Validate(); err != nil {
		// Not reached for configs that passed the checks above.
		return fmt.Errorf("questd: %w", err)
	}
	if c.HTTPAddr != "" {
		if _, _, err := splitAddr("http-addr", c.HTTPAddr); err != nil {
			return err
		}
	}
	if c.MetricsAddr != "" {
		if _, _, err := splitAddr("metrics-addr", c.MetricsAddr); err != nil {
			return err
		}
	}
	if c.Advertise == "" && !unspecified(gossipHost) && gossipHost != grpcHost {
		return bad("gossip-addr", c.GossipAddr, "binds %s but the node advertises %s, the host of --grpc-addr (bind both to one address, or set --advertise)", gossipHost, grpcHost)
	}
	if adv, err := netip.ParseAddr(c.advertiseHost()); err == nil && !adv.IsLoopback() {
		for _, l := range []struct{ flag, addr, host string }{{"grpc-addr", c.GRPCAddr, grpcHost}, {"gossip-addr", c.GossipAddr, gossipHost}} {
			if h, err := netip.ParseAddr(l.host); err == nil && h.IsLoopback() {
				return bad(l.flag, l.addr, "binds a loopback address, which other nodes cannot reach at --advertise %s", adv)
			}
		}
	}
	for _, j := range c.Join {
		h, p, err := net.SplitHostPort(j)
		if err != nil || h == "" {
			return bad("join", j, "want host:port")
		}
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return bad("join", j, "port %q: want 1-65535", p)
		}
	}
	if err := checkMember(func(m *cluster.MemberConfig) { m.Label = c.ClusterLabel }); err != nil {
		return bad("cluster-label", c.ClusterLabel, "%d bytes, limit 255", len(c.ClusterLabel))
	}
	for i, k := range c.GossipKeys {
		if err := checkMember(func(m *cluster.MemberConfig) { m.SecretKeys = [][]byte{k} }); err != nil {
			return bad("gossip-key-file", c.GossipKeyFile, "key %d is %d bytes: want 16, 24 or 32", i+1, len(k))
		}
	}

	tls := []struct{ flag, v string }{{"tls-cert", c.TLSCert}, {"tls-key", c.TLSKey}, {"tls-ca", c.TLSCA}}
	for _, t := range tls {
		switch {
		case c.Plaintext && t.v != "":
			return bad("insecure", "true", "conflicts with --%s %q: choose TLS or --insecure (--plaintext)", t.flag, t.v)
		case !c.Plaintext && t.v == "":
			return bad(t.flag, t.v, "mutual TLS needs --tls-cert, --tls-key and --tls-ca (or --insecure to run without TLS)")
		}
	}

	for _, g := range []struct {
		flag string
		v    int
	}{
		{"layers", c.Layers}, {"q-heads", c.QHeads}, {"kv-heads", c.KVHeads}, {"head-dim", c.HeadDim},
		{"page-size", c.PageSize}, {"cp", c.CP}, {"tp", c.TP}, {"capacity-pages", c.CapacityPages},
		{"block-pages", c.BlockPages}, {"suspicion-mult", c.SuspicionMult},
	} {
		if g.v < 1 {
			return bad(g.flag, itoa(g.v), "must be at least 1")
		}
	}
	switch {
	case c.KVHeads%c.TP != 0:
		return bad("kv-heads", itoa(c.KVHeads), "not divisible by --tp %d", c.TP)
	case c.QHeads%c.KVHeads != 0:
		return bad("q-heads", itoa(c.QHeads), "not a multiple of --kv-heads %d", c.KVHeads)
	case c.CapacityPages > plan.MaxPages:
		return bad("capacity-pages", itoa(c.CapacityPages), "more than %d", plan.MaxPages)
	case c.BudgetTokens < c.PageSize:
		return bad("budget-tokens", itoa(c.BudgetTokens), "below one page (--page-size %d)", c.PageSize)
	case c.SinkPages < 0:
		return bad("sink-pages", itoa(c.SinkPages), "must not be negative")
	case c.LocalPages < 0:
		return bad("local-pages", itoa(c.LocalPages), "must not be negative")
	case c.Selector != plan.Dense && c.SinkPages+c.LocalPages > c.BudgetTokens/c.PageSize:
		return bad("sink-pages", itoa(c.SinkPages), "plus --local-pages %d forced pages exceed K = %d pages (--budget-tokens %d / --page-size %d, forced pages included)",
			c.LocalPages, c.BudgetTokens/c.PageSize, c.BudgetTokens, c.PageSize)
	case c.DenseLayers < 0:
		return bad("dense-layers", itoa(c.DenseLayers), "must not be negative")
	case c.Selection == plan.Replicated && c.Selector != plan.Quest && c.Selector != plan.Dense:
		return bad("selection", c.Selection.String(), "needs --selector quest or dense, not %v", c.Selector)
	case c.MaxPages < 0:
		return bad("max-pages", itoa(c.MaxPages), "must not be negative (0: 8 x --capacity-pages)")
	case c.MaxPages > 0 && c.MaxPages < c.CapacityPages:
		return bad("max-pages", itoa(c.MaxPages), "below --capacity-pages %d: a node hosts whole ranks", c.CapacityPages)
	case c.MaxMemory < memlimit.NoLimit:
		return bad("max-memory", strconv.FormatInt(c.MaxMemory, 10), "want bytes, auto or none")
	case c.DeviceBudgetPages < 0:
		return bad("device-budget-pages", itoa(c.DeviceBudgetPages), "must not be negative (0: offload off)")
	case c.DeviceBudgetPages > c.CapacityPages:
		return bad("device-budget-pages", itoa(c.DeviceBudgetPages), "above --capacity-pages %d", c.CapacityPages)
	case c.Eviction != pagestore.EvictLRU && c.Eviction != pagestore.EvictScore:
		return bad("eviction", c.Eviction.String(), "want lru or score")
	case c.PrefetchPages < 0:
		return bad("prefetch-pages", itoa(c.PrefetchPages), "must not be negative (0: off)")
	case c.PrefetchPages > c.CapacityPages:
		return bad("prefetch-pages", itoa(c.PrefetchPages), "above --capacity-pages %d", c.CapacityPages)
	case c.PrefetchPages > 0 && c.DeviceBudgetPages == 0:
		return bad("prefetch-pages", itoa(c.PrefetchPages), "needs --device-budget-pages (prefetch needs offload)")
	case c.PrefetchCrossLayer && c.PrefetchPages == 0:
		return bad("prefetch-cross-layer", "true", "needs --prefetch-pages")
	case c.SyncInterval <= 0:
		return bad("sync-interval", c.SyncInterval.String(), "must be positive")
	case c.DataDir != "" && c.Selection == plan.Replicated:
		return bad("data-dir", c.DataDir, "not with --selection replicated (its summary mirrors are not persisted)")
	case c.Backend == "cuda" && !cudaBuild:
		return bad("backend", "cuda", "needs a questd built with -tags cuda (README: building for a GPU host)")
	case c.DataDir != "" && c.Backend == "cuda":
		return bad("data-dir", c.DataDir, "not with --backend cuda (pages in GPU memory do not persist)")
	case len(c.Devices) > 0 && c.Backend != "cuda":
		return bad("devices", joinInts(c.Devices), "needs --backend cuda")
	case c.KVCacheDType != plan.BFloat16 && c.Backend != "cuda":
		return bad("kv-cache-dtype", c.KVCacheDType.String(), "needs --backend cuda (the CPU backend stores f32)")
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
		{"step-timeout", c.StepTimeout}, {"probe-interval", c.ProbeInterval},
		{"probe-timeout", c.ProbeTimeout}, {"gossip-interval", c.GossipInterval},
		{"dead-node-reclaim", c.DeadNodeReclaim},
	} {
		if d.v <= 0 {
			return bad(d.flag, d.v.String(), "must be positive")
		}
	}
	switch {
	case c.ProbeTimeout >= c.ProbeInterval:
		return bad("probe-timeout", c.ProbeTimeout.String(), "must be below --probe-interval %v", c.ProbeInterval)
	case c.DrainTimeout < 0:
		return bad("drain-timeout", c.DrainTimeout.String(), "must not be negative")
	case c.GridIdle < 0:
		return bad("grid-idle-timeout", c.GridIdle.String(), "must not be negative (0 keeps grids open)")
	case c.LogFormat != "text" && c.LogFormat != "json":
		return bad("log-format", c.LogFormat, "want text or json")
	}
	if _, err := parseLogLevel(strings.ToLower(c.LogLevel.String())); err != nil {
		return bad("log-level", c.LogLevel.String(), "want debug, info, warn or error")
	}
	if err := c.memberConfig().Validate(); err != nil {
		return fmt.Errorf("questd: %w", err)
	}
	return nil
}

// advertiseHost is the IP address other nodes reach this node at:
// Advertise, or the host of GRPCAddr.
func (c Config) advertiseHost() string {
	if c.Advertise != "" {
		return c.Advertise
	}
	h, _, _ := net.SplitHostPort(c.GRPCAddr)
	return h
}

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

// readPolicy reads PolicyFile into c: its page size must equal PageSize
// where the page size was given, and its budget, sink, local, dense
// layers, GQA mode and selector replace the flags that were not given.
func (c *Config) readPolicy(given func(flag string) bool) error {
	f, err := os.Open(c.PolicyFile)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := plan.ReadPolicyFile(f)
	if err != nil {
		return err
	}
	if p.PageSize != c.PageSize {
		if given("page-size") {
			return fmt.Errorf("its page_size %d differs from --page-size %d", p.PageSize, c.PageSize)
		}
		c.PageSize = p.PageSize
	}
	for _, v := range []struct {
		flag string
		dst  *int
		val  int
	}{
		{"budget-tokens", &c.BudgetTokens, p.BudgetTokens}, {"sink-pages", &c.SinkPages, p.SinkPages},
		{"local-pages", &c.LocalPages, p.LocalPages}, {"dense-layers", &c.DenseLayers, p.DenseLayers},
	} {
		if !given(v.flag) {
			*v.dst = v.val
		}
	}
	if !given("gqa") {
		c.GQA = p.GQA
	}
	if !given("selector") {
		c.Selector = p.Selector
	}
	c.LayerBudget = p.LayerBudget
	return nil
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
		LocalPages: c.LocalPages, DenseLayers: c.DenseLayers, GQA: c.GQA, Selector: c.Selector, LayerBudget: c.LayerBudget}
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

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
