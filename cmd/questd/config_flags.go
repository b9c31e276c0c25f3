package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// versionFlag is --version: a flag of the command line only (no
// environment variable, no key in the file), and no Config field.
const versionFlag = "version"

// printConfigFlag is --print-config: of the command line only, like
// --version.
const printConfigFlag = "print-config"

// plaintextAlias is --plaintext, the older name of --insecure: both set
// Config.Security.Plaintext.
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
	def := DefaultConfig(hostname)

	d.group("Node and network")
	d.str(&c.Node.Name, "name", def.Node.Name, "unique node name in the cluster: letters, digits, '.', '-' and '_' (default: the host name)")
	d.str(&c.Node.GRPCAddr, "grpc-addr", def.Node.GRPCAddr, "listen `host:port` of the gRPC API (client, worker, health); an IP or empty host; port 0 picks a free port")
	d.str(&c.Node.Advertise, "advertise", def.Node.Advertise, "IP address other nodes reach this node's gRPC, collective and gossip listeners at (default: the host of --grpc-addr, which must then not be 0.0.0.0 or ::)")
	d.str(&c.Node.GRPCAdvertise, "grpc-advertise", def.Node.GRPCAdvertise, "gRPC `host:port` other nodes dial this node's APIs at, put in its gossip meta: for a proxy or port mapping in front of --grpc-addr (default: the --advertise host and the --grpc-addr port)")
	d.str(&c.Membership.GossipAddr, "gossip-addr", def.Membership.GossipAddr, "memberlist bind `host:port`, UDP and TCP; an IP or empty host; port 0 picks a free port")
	d.list(&c.Membership.Join, "join", "gossip `host:port` of an existing member to join through; repeatable or a comma-separated list (default: none, start a new cluster)")
	d.str(&c.Membership.Label, "cluster-label", def.Membership.Label, "memberlist label: nodes with another label are ignored (\"\": none)")
	d.str(&c.Membership.KeyFile, "gossip-key-file", def.Membership.KeyFile, "`file` holding the base64 memberlist encryption key of 16, 24 or 32 bytes; further lines: older keys that still decrypt (default: no encryption); at most 64 KiB")

	d.group("Security")
	d.bool(&c.Security.Plaintext, "insecure", def.Security.Plaintext, "run gRPC without TLS: anyone who reaches --grpc-addr can call both APIs (only on a trusted network; not with the --tls-* files; a warning is logged)")
	d.alias(plaintextAlias, "insecure", "the older name of --insecure, the same")
	d.str(&c.Security.TLSCert, "tls-cert", def.Security.TLSCert, "PEM `file` of this node's certificate for mutual TLS (required with --tls-key and --tls-ca unless --insecure; SIGHUP reloads the three); each of the three at most 1 MiB")
	d.str(&c.Security.TLSKey, "tls-key", def.Security.TLSKey, "PEM `file` of this node's private key for mutual TLS")
	d.str(&c.Security.TLSCA, "tls-ca", def.Security.TLSCA, "PEM `file` of the CA that signs every node's and client's certificate")
	d.str(&c.Security.TokenFile, "token-file", def.Security.TokenFile, "`file` holding the bearer token every client API call, and every request of the completions API (--http-addr; OpenAI clients send it as their API key), must carry as \"authorization: Bearer <token>\"; the worker API between nodes too, so every node needs the same file (default: no token); at most 64 KiB")
	d.bool(&c.Security.RequireCertRoles, "require-cert-roles", def.Security.RequireCertRoles, "with TLS, refuse callers whose certificate carries no role URI SAN (questrt://node/NAME or questrt://client/NAME, as questctl up issues); default: such certificates count as nodes' (a warning per certificate). Either way the worker API needs a node certificate and a client certificate reaches the client API only")

	d.group("Model geometry and grid (the same on every node)")
	d.int(&c.Grid.Layers, "layers", def.Grid.Layers, "transformer layers, 1..1024")
	d.int(&c.Grid.QHeads, "q-heads", def.Grid.QHeads, "query heads, a multiple of --kv-heads, 1..1024")
	d.int(&c.Grid.KVHeads, "kv-heads", def.Grid.KVHeads, "KV heads, divisible by --tp, 1..1024")
	d.int(&c.Grid.HeadDim, "head-dim", def.Grid.HeadDim, "head dimension D, 1..1024")
	d.int(&c.Grid.PageSize, "page-size", def.Grid.PageSize, "tokens per KV page, 1..65536")
	d.int(&c.Grid.CP, "cp", def.Grid.CP, "context-parallel ranks per TP group (pages are spread over them), 1..4096")
	d.alias("decode-context-parallel-size", "cp", "the same as --cp (vLLM's name)")
	d.int(&c.Grid.TP, "tp", def.Grid.TP, "tensor-parallel ranks (KV heads are split over them), 1..1024")
	d.alias("tensor-parallel-size", "tp", "the same as --tp (vLLM's name)")
	d.int(&c.Grid.CapacityPages, "capacity-pages", def.Grid.CapacityPages, "page pool of one rank, in pages, 1..2147483647 (its memory is checked against --max-memory when a grid opens)")
	d.int(&c.Grid.BlockPages, "block-pages", def.Grid.BlockPages, "block of the contiguous page placement, in pages, 1..1048576")

	d.group("Selection policy (the same on every node)")
	d.int(&c.Policy.BudgetTokens, "budget-tokens", def.Policy.BudgetTokens, "token budget per head per step, --page-size..1073741824")
	d.int(&c.Policy.SinkPages, "sink-pages", def.Policy.SinkPages, "first pages of a sequence, always read; --sink-pages + --local-pages at most K = --budget-tokens / --page-size")
	d.int(&c.Policy.LocalPages, "local-pages", def.Policy.LocalPages, "last pages of a sequence, always read")
	d.int(&c.Policy.DenseLayers, "dense-layers", def.Policy.DenseLayers, "layers below this index read every page, 0..1024")
	d.text("dense-rho", "0", "a sparse layer reads every page while Quest would read at least this share `R` of the dense bytes, 1/S + K/P >= R (below the context where dense costs no more than scoring plus the sparse read; bench decode --dense-rho measures it), 0..2; 0 is off (dense only when K >= P)", func(v string) error {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || !(r >= 0 && r <= plan.MaxDenseRho) {
			return fmt.Errorf("want 0..%v", plan.MaxDenseRho)
		}
		c.Policy.DenseRho = r
		return nil
	})
	d.text("reuse-steps", "0", "selection reuse: a sparse layer ranks pages afresh every `R`-th decode step of a sequence and in between attends its last selection plus the pages that became candidates since, 0..4096; 0 and 1 are off", func(v string) error {
		r, err := strconv.Atoi(v)
		if err != nil || r < 0 || r > plan.MaxReuseSteps {
			return fmt.Errorf("want 0..%d", plan.MaxReuseSteps)
		}
		c.Policy.ReuseSteps = r
		return nil
	})
	d.text("reuse-layers", "", "selection reuse across layers: comma-separated `layers` (ascending, each after a sparse layer) that attend the pages the layer before them selected at the same step instead of ranking, at most 1024; empty: every sparse layer ranks", func(v string) error {
		c.Policy.ReuseLayers = nil
		if strings.TrimSpace(v) == "" {
			return nil
		}
		for _, f := range strings.Split(v, ",") {
			l, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || l < 1 {
				return fmt.Errorf("want comma-separated layers of 1 or more, not %q", f)
			}
			if n := len(c.Policy.ReuseLayers); n > 0 && l <= c.Policy.ReuseLayers[n-1] {
				return fmt.Errorf("want ascending layers, each once")
			}
			if len(c.Policy.ReuseLayers) == plan.MaxReuseLayers {
				return fmt.Errorf("at most %d layers", plan.MaxReuseLayers)
			}
			c.Policy.ReuseLayers = append(c.Policy.ReuseLayers, l)
		}
		return nil
	})
	d.text("gqa", "group_max", "how a KV head's query heads share pages, `group_max|per_head`", func(s string) (err error) {
		c.Policy.GQA, err = plan.ParseGQAMode(s)
		return err
	})
	d.text("selector", "quest", "page ranking, `quest|oracle|recent|dense`", func(s string) (err error) {
		c.Policy.Selector, err = plan.ParseSelector(s)
		return err
	})
	d.text("selection", "exact", "how CP ranks agree on pages, `exact|union|replicated` (replicated: quest or dense selector only)", func(s string) (err error) {
		c.Policy.Selection, err = plan.ParseSelectMode(s)
		return err
	})
	d.str(&c.Policy.File, "policy", def.Policy.File, "policy `file` (YAML, as questctl calibrate --out writes it): per-layer budgets and dense layers; its page_size must equal --page-size, its other values fill the policy flags not given")

	d.group("Devices")
	d.text("backend", "cpu", "kernel backend of the hosted ranks, `cpu|cuda`: cuda in a -tags cuda build on a GPU host (pages then live only in GPU memory; not with --data-dir); a -tags cuda build needs the NVIDIA driver to start at all, even with cpu", func(s string) error {
		if s != "cpu" && s != "cuda" {
			return errors.New("want cpu or cuda")
		}
		c.Devices.Backend = s
		return nil
	})
	d.text("devices", "", "with --backend cuda: comma-separated GPU `ordinals` the hosted ranks are placed over, each rank on the device holding the fewest (ranks are counted, not memory: a grid too large for its GPU fails when it connects), several ranks sharing one when there are more ranks than devices; a GPU listed twice gets two contexts (default: every GPU the driver lists)", func(s string) error {
		c.Devices.Ordinals = nil
		if s == "" {
			return nil
		}
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				return fmt.Errorf("%q is not a GPU ordinal", f)
			}
			c.Devices.Ordinals = append(c.Devices.Ordinals, n)
		}
		return nil
	})
	d.text("kv-cache-dtype", "bf16", "storage type of the KV pages, `f32|f16|bf16|fp8`: with --backend cuda f32, f16, bf16 or fp8 (K, V and summaries in GPU memory; with --device-budget-pages fp8 K/V offload as stored, codes and scales); fp8 is E4M3 codes with a float32 scale per page, layer and KV head, summaries f32 over the stored keys (a quarter of f32's K/V bytes), and with --model sets the served model's pages in every --serve-layout (cluster: the grid config names it to the nodes, whose CPU pools store it and whose GPUs must hold fp8); with --backend cpu only fp8 (with --model) changes the pages (the CPU stores f32 otherwise)", func(s string) (err error) {
		c.Devices.KVCacheDType, err = plan.ParseDType(s)
		return err
	})

	d.group("Capacity")
	d.int(&c.Capacity.MaxPages, "max-pages", def.Capacity.MaxPages, "pages this node hosts over all grids, --capacity-pages..1099511627776 (0: 8 x --capacity-pages)")
	d.text("max-memory", "auto", "most host memory for the node's page pools, `bytes|auto|none`: bytes like 8GiB or 512MiB, auto (the memory available at start, also the cap of a larger value) or none (no check, but for sizes beyond RAM plus swap or ulimit -v, which no allocation could get: refused, not a crash)", func(s string) (err error) {
		c.Capacity.MaxMemory, err = parseMaxMemory(s)
		return err
	})
	d.int(&c.Offload.DeviceBudgetPages, "device-budget-pages", def.Offload.DeviceBudgetPages, "offload: pages per rank whose K/V stay in device memory, the others in host memory, at most --capacity-pages (0: offload off); for the grids this node coordinates")
	d.text("eviction", "lru", "offload eviction policy, `lru|score` (score: lowest decayed selection count first)", func(s string) (err error) {
		if c.Offload.Eviction, err = pagestore.ParseEviction(s); err != nil || s == "" {
			return errors.New("want lru or score")
		}
		return nil
	})
	d.int(&c.Offload.PrefetchPages, "prefetch-pages", def.Offload.PrefetchPages, "offload: pages per rank and step prefetched from host memory ahead of use, at most --capacity-pages (0: off; needs --device-budget-pages)")
	d.bool(&c.Offload.PrefetchCrossLayer, "prefetch-cross-layer", def.Offload.PrefetchCrossLayer, "offload: prefetch the next layer's pages too (needs --prefetch-pages)")

	d.group("Persistence")
	d.str(&c.Storage.DataDir, "data-dir", def.Storage.DataDir, "`dir` the grids hosted here persist their sequences in, one subdirectory per grid (coordinator and shape): a restart on the same dir (same --name) recovers them when the grid opens again on the same nodes (the first Create, or the Decode API's Recovered call, which lists them under their old ids with the tail tokens lost, to append again; a grid on other nodes leaves them parked); one questd per dir (default: no persistence)")
	d.text("durability", "sync", "with --data-dir, `sync|periodic`: sync (each sealed page and sequence change is fsynced before the call returns) or periodic (flushed every --sync-interval; a crash loses up to that much more)", func(s string) error {
		switch s {
		case "sync":
			c.Storage.Durability = pagestore.SyncOnWrite
		case "periodic":
			c.Storage.Durability = pagestore.SyncPeriodic
		default:
			return errors.New("want sync or periodic")
		}
		return nil
	})
	d.dur(&c.Storage.SyncInterval, "sync-interval", def.Storage.SyncInterval, "with --durability periodic: time between two flushes, above 0 and at most 1h")
	d.text("recovery-verify", def.Storage.Verify.String(), "with --data-dir, when recovered pages are read and checked, `at-open|on-read`: on-read (the grid opens on metadata and persisted summaries, reading no page; each page is read and checked at its sequence's first use or by a background scrub at --scrub-rate, and a damaged page makes the calls on the sequences naming it fail with DATA_LOSS, the coordinator then listing them damaged, as the next restart does with the failed check as the reason; each sealed page also persists its summaries, 1/page-size of its bytes) or at-open (every persisted page is read and checked before its grid opens, damage reported by the recovery)", func(s string) (err error) {
		if c.Storage.Verify, err = pagestore.ParseVerify(s); err != nil || s == "" {
			return errors.New("want at-open or on-read")
		}
		return nil
	})
	d.text("scrub-rate", "64MiB", "with --recovery-verify on-read, `bytes|off`: bytes per second each page store's background scrub reads (like 64MiB), or off (pages checked at first use only)", func(s string) error {
		r, err := parseScrubRate(s)
		c.Storage.ScrubRate = r
		return err
	})

	d.group("Timing and failure detection")
	d.dur(&c.Grid.StepTimeout, "step-timeout", def.Grid.StepTimeout, "deadline of one decode step when the client's is later, above 0 and at most 1h")
	d.dur(&c.Membership.ProbeInterval, "probe-interval", def.Membership.ProbeInterval, "time between two failure-detection probes of a random member, above 0 and at most 1m")
	d.dur(&c.Membership.ProbeTimeout, "probe-timeout", def.Membership.ProbeTimeout, "how long a probe waits for its ack before indirect probes, above 0 and below --probe-interval")
	d.int(&c.Membership.SuspicionMult, "suspicion-mult", def.Membership.SuspicionMult, "a suspect member has suspicion-mult x max(1, log10(nodes)) x --probe-interval to refute before it is declared dead; with the defaults a killed node is declared dead in about 6s in a 3-node cluster (5.8s measured on loopback); 1..100")
	d.dur(&c.Membership.GossipInterval, "gossip-interval", def.Membership.GossipInterval, "time between two gossip rounds (joins, failures and meta updates spread by them), above 0 and at most 1m")
	d.dur(&c.Membership.DeadNodeReclaim, "dead-node-reclaim", def.Membership.DeadNodeReclaim, "how long after a member is declared dead a restarted node may take over its name from another address (a restart before that waits in its join until the others declare the old process dead, then is taken in), above 0 and at most 1h")
	d.dur(&c.Node.DrainTimeout, "drain-timeout", def.Node.DrainTimeout, "how long SIGTERM or SIGINT waits for in-flight steps and completions requests before leaving the cluster, 0..1h (0: leave at once; the completions API waits at least 1s)")
	d.dur(&c.Node.GridIdle, "grid-idle-timeout", def.Node.GridIdle, "close a grid this node coordinates once it has held no sequence for this long, freeing the pages its ranks reserve on every node (a grid per sequence config and placement; 0: keep grids open until the node stops), 0..168h")

	d.group("Metrics and probes")
	d.str(&c.Node.MetricsAddr, "metrics-addr", def.Node.MetricsAddr, "listen `host:port` of the HTTP server of /metrics (Prometheus), /healthz and /readyz; an IP or empty host; port 0 picks a free port; \"\" disables it")

	d.group("Completions API (OpenAI-compatible, the model runs on this node)")
	d.str(&c.Serve.Model, "model", def.Serve.Model, "Hugging Face Llama checkpoint `dir` to serve at --http-addr (config.json, safetensors, tokenizer.json, else SentencePiece's tokenizer.model, else the byte tokenizer)")
	d.str(&c.Serve.Addr, "http-addr", def.Serve.Addr, "listen `host:port` of the completions API (POST /v1/completions, /v1/chat/completions, /tokenize and /detokenize; GET /v1/models, /health and /metrics); needs --model")
	d.str(&c.Serve.TLSCert, "http-tls-cert", def.Serve.TLSCert, "PEM `file` of the completions API's TLS certificate (with --http-tls-key: HTTPS; SIGHUP reloads both; default: plaintext, warned about beyond loopback)")
	d.str(&c.Serve.TLSKey, "http-tls-key", def.Serve.TLSKey, "PEM `file` of the completions API's TLS key (mode 600, 640 or 440: no access for other users); each at most 1 MiB")
	d.list(&c.Serve.AllowedOrigins, "allowed-origins", "comma-separated `origins` (scheme://host[:port], or * for any) whose browsers may call the completions API cross-origin (CORS); default none")
	d.str(&c.Serve.ModelName, "model-name", def.Serve.ModelName, "the model's id in the API (default: the base name of --model)")
	d.str(&c.Serve.ChatTemplate, "chat-template", def.Serve.ChatTemplate, "Jinja chat template `file` that POST /v1/chat/completions renders the messages with (default: the checkpoint's, from tokenizer_config.json or chat_template.jinja; without one, chat requests get 400)")
	d.int(&c.Serve.MaxRunning, "max-running", def.Serve.MaxRunning, "sequences prefilling or decoding at once (each choice of a request, n or a batch of prompts, is one), 1..65536; more wait in the queue")
	d.int(&c.Serve.MaxQueued, "max-queued", def.Serve.MaxQueued, "admitted sequences waiting to run (for a running slot or for their pages), 0..1048576; beyond it requests get 429")
	d.int(&c.Serve.DefaultMaxTokens, "default-max-tokens", def.Serve.DefaultMaxTokens, "max_tokens of a completion or chat request that gives none (nor max_completion_tokens): 16 (OpenAI's legacy completions) or more, up to --max-model-len; -1: the rest of --max-model-len after the prompt (vLLM's default; with --grow-reservations=false, or for a request of n > 1, several prompts or quest options of its own, a request reserves the pages of its prompt plus max_tokens when it starts, so each such request reserves a whole --max-model-len of the pool and fewer run at once). A completion that reaches max_tokens ends with finish_reason \"length\"; a prompt plus max_tokens past --max-model-len or the pool gets 400 context_length_exceeded")
	d.int(&c.Serve.MaxModelLen, "max-model-len", def.Serve.MaxModelLen, "most tokens of a request's prompt plus max_tokens, 0..1073741824 (0: the model's max_position_embeddings); longer requests get 400 context_length_exceeded")
	d.int(&c.Serve.MaxRequestBytes, "max-request-bytes", def.Serve.MaxRequestBytes, "largest request body in bytes, 1..1073741824; larger ones get 413")
	d.dur(&c.Serve.SSEKeepAlive, "sse-keepalive", def.Serve.SSEKeepAlive, "a stream silent this long (a long prompt prefilling) writes an SSE comment, so that proxies with idle timeouts keep it open; 0 (never) or 100ms..1h")
	d.dur(&c.Serve.RequestTimeout, "request-timeout", def.Serve.RequestTimeout, "deadline of a request from its arrival to its last token, 0..168h (0: none besides the client's); past it the request gets 504 or, streaming, an error event")
	d.int(&c.Serve.PrefillChunk, "prefill-chunk-tokens", def.Serve.PrefillChunk, "prompt tokens prefilled between two decode steps, 1..1048576 (long prompts do not stall the others; on a GPU, larger chunks prefill faster)")
	d.int(&c.Serve.MaxBatchedTokens, "max-batched-tokens", def.Serve.MaxBatchedTokens, "tokens one scheduler iteration runs at most (vLLM's max_num_batched_tokens): a decode token for each decoding sequence, then prompt tokens up to the rest (and --prefill-chunk-tokens); lower keeps the running streams' inter-token latency closer to a decode step's while a long prompt prefills, which then takes longer; 0: --prefill-chunk-tokens plus --max-running; else --max-running..4194304")
	d.text("max-itl-factor", strconv.FormatFloat(def.Serve.MaxITLFactor, 'g', -1, 64), "bound a scheduler iteration beside decoding sequences to `F` times their decode step (a stream's inter-token latency while a prompt prefills): it prefills on the CPU only the prompt tokens that fit, by the measured decode step and prefill cost (a fixed cost per chunk plus a cost per token at the prompt's context), and none when those tokens would take less than the chunk's fixed cost (the unspent time carries over, so the token runs once it is covered, and after 16 such iterations in a row it runs whatever it costs: no prompt starves); alone, a prompt prefills in --prefill-chunk-tokens chunks as before; --max-batched-tokens and --prefill-chunk-tokens still bound the tokens; prompts prefilled on the GPU (--device-prefill) keep the token bounds alone; 0 is off, else 1..100", func(v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f == 0 || (f >= 1 && f <= completion.ITLFactorMax)) {
			return fmt.Errorf("want 0 (off) or 1..%v", completion.ITLFactorMax)
		}
		c.Serve.MaxITLFactor = f
		return nil
	})
	d.bool(&c.Serve.DevicePrefill, "device-prefill", def.Serve.DevicePrefill, "with --serve-layout device: prefill prompts on the GPU (needs --kv-cache-dtype bf16 or f16); false: on the CPU, into the GPU's pages")
	d.int(&c.Serve.CapacityPages, "serve-capacity-pages", def.Serve.CapacityPages, "page pool of the served model's engine, in pages; a request starts when its pages fit beside the running ones' and waits in the queue until then (one that could never fit gets 400) (--serve-layout cluster: the pool of every rank of the served grid); 0: with --serve-layout local, sized from memory as vLLM's gpu_memory_utilization (--serve-memory-fraction of the memory available once the model is loaded, at most --max-running requests of --max-model-len, and questd refuses to start when not even one such request fits), with device likewise from the GPU's memory once the weights and activations are allocated (--gpu-memory-utilization), with cluster from the free pages the nodes advertise at start (the most pages per rank with which the --serve-cp x --serve-tp ranks of the served grid and of --serve-policy-grids more grids all fit the nodes, less --monitor-queue with --monitor-rate, at most --max-running requests of --max-model-len; questd waits up to --serve-cluster-wait for the nodes to hold one such request, then refuses to start, and follows the nodes as they come and go, --serve-cluster-resize)")
	d.text("serve-memory-fraction", "0.5", "share `F` of the memory available (MemAvailable, capped by the memory cgroup and --max-memory) that the serving pool takes when --serve-capacity-pages is 0 with --serve-layout local; the rest holds the CPU prefill's copies of cached prompts' keys and values, activations and the heap; 0 < F <= 0.95", func(v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 0.95) {
			return errors.New("want 0 < F <= 0.95")
		}
		c.Serve.MemoryFraction = f
		return nil
	})
	d.text("gpu-memory-utilization", "0.9", "with --serve-layout device and --serve-capacity-pages 0: share `F` of the GPU's total memory questd takes in all, as vLLM's gpu_memory_utilization; the pool gets F x total less what the weights, activations and anything else on the GPU hold once they are allocated, less 256 MiB of scratch; 0 < F <= 1", func(v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 1) {
			return errors.New("want 0 < F <= 1")
		}
		c.Serve.GPUMemoryUtilization = f
		return nil
	})
	d.bool(&c.Serve.GrowReservations, "grow-reservations", def.Serve.GrowReservations, "reserve a request's pages as its sequence grows (its prompt's and next token's when it starts, a page more as it opens one) instead of its whole prompt plus max_tokens, as vLLM does; when the pool has no page for a request's next token (the prefix cache gave way first) the newest running request is preempted: its pages go back to the pool and it runs again from its prompt and the tokens it generated (recompute) once they fit, the client seeing a pause only; requests with n > 1, several prompts or quest options of their own, and every request with --serve-layout cluster, reserve their whole context; on by default, --grow-reservations=false reserves every request's whole context when it starts (fewer run at once, none is preempted)")
	d.bool(&c.Serve.PrefixCaching, "prefix-caching", def.Serve.PrefixCaching, "keep the full pages of prompts (with their summaries) so that later requests with the same token prefix fork them instead of prefilling it again; cached pages give way, least recently used first, to any request that needs the pool (every --serve-layout; with cluster the cached pages stay on the requests' grid, and a lost grid's are dropped)")
	d.int(&c.Serve.PrefixCachePages, "prefix-cache-pages", def.Serve.PrefixCachePages, "pages of the serving pool the prefix cache may hold at most, 0..--serve-capacity-pages; 0: whatever the running requests leave free with the GPU prefill, else a quarter of the pool (a prompt prefilled on the CPU keeps a float32 copy of its keys and values in host memory while cached)")
	d.text("serve-layout", "local", "where the served requests' KV pages live, `local|cluster|device`: local (an in-process engine on this node), cluster (a --serve-cp x --serve-tp grid of the cluster's nodes coordinated by this node; the model runs here, attention steps go to the grid's workers) or device (with --backend cuda: the model's decode steps and the pages on the first GPU of --devices, through the device executor; prompts are prefilled on the GPU, or on the CPU into the GPU's pages with --device-prefill=false)", func(v string) error {
		if v != "local" && v != "cluster" && v != "device" {
			return fmt.Errorf("want local, cluster or device")
		}
		c.Serve.Layout = v
		return nil
	})
	d.int(&c.Serve.CP, "serve-cp", def.Serve.CP, "context-parallel ranks of every served request's sequence (its pages are spread over them): in-process shards, or ranks on the cluster's nodes with --serve-layout cluster; 1..64")
	d.int(&c.Serve.TP, "serve-tp", def.Serve.TP, "tensor-parallel ranks of every served request's sequence (the model's KV heads are split over them; must divide them), 1..64")
	d.int(&c.Serve.PolicyGrids, "serve-policy-grids", def.Serve.PolicyGrids, "with --serve-layout cluster: grids opened for requests whose quest selector, gqa, sink or local differ from --policy's, at most; each counts while this node runs, even once the coordinator closed it idle (every rank reserving --serve-capacity-pages, so the nodes reserve up to 1 + this many pools per rank), and a request that would open one more gets 429, 0..64; 0: only --policy's options on the cluster")
	d.int(&c.Serve.GridRetries, "serve-grid-retries", def.Serve.GridRetries, "with --serve-layout cluster: times a request whose grid is lost (a node of it killed, restarted or unreachable) runs again on a new grid, its prompt prefilled again and the tokens already generated fed again, so that its output goes on as without the loss (a request with n > 1 is not retried); past them it fails with 503 or an error event, 0..100; 0: never")
	d.dur(&c.Serve.GridRetryWait, "serve-grid-retry-wait", def.Serve.GridRetryWait, "with --serve-layout cluster: how long a retried request keeps trying to create its new grid while the cluster is unavailable (a killed node may be placed again until membership declares it dead, --probe-timeout x --suspicion-mult and more), 0..1h")
	d.dur(&c.Serve.ClusterWait, "serve-cluster-wait", def.Serve.ClusterWait, "with --serve-layout cluster and --serve-capacity-pages 0: how long startup waits for the nodes to advertise free pages for one request of --max-model-len before questd refuses to start, 0..1h; 0: one look")
	d.dur(&c.Serve.ClusterResize, "serve-cluster-resize", def.Serve.ClusterResize, "with --serve-layout cluster and --serve-capacity-pages 0: how often the pool sized from the nodes' free pages looks at them again, to grow as nodes join (once a grid of the new size fits beside the open ones) and shrink as they leave (unless a grid of the pool now is still open; the newest running requests that no longer fit run again from their prompt, or fail with 503 pool_shrunk); the pools of this node's own grids count as free, another coordinator's as taken, 0..1h; 0: sized once at startup")
	d.text("monitor-rate", "0", "fraction `R` (0..1) of decode steps, per layer and KV head, replayed with dense attention off the requests' path: page recall, attention-mass recall and output error histograms by layer on /metrics; 0 is off", func(v string) error {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return fmt.Errorf("want a fraction 0..1")
		}
		c.Serve.MonitorRate = r
		return nil
	})
	d.int(&c.Serve.MonitorQueue, "monitor-queue", def.Serve.MonitorQueue, "replays of --monitor-rate waiting or running at most, 1..65536; samples beyond it are dropped and counted")
	d.dur(&c.Serve.LogStatsInterval, "log-stats-interval", def.Serve.LogStatsInterval, "period of the completions API's stats line in the log (prompt and generation tokens/s, running and queued sequences, reserved pool and prefix cache hits, as vLLM's), written only while it has work; 0 (off) or 1s..1h")
	d.int(&c.Serve.RequestHistory, "request-history", def.Serve.RequestHistory, "finished requests kept (prompt, output, settings) for GET /admin/requests/{id} and questctl replay-request, 0..65536; 0 keeps none. Without --token-file the /admin endpoints have no authentication: whoever reaches --http-addr can read these prompts and outputs")

	d.group("HTTP connections (each of the completions API of --http-addr and the metrics server of --metrics-addr)")
	d.int(&c.HTTP.MaxConns, "http-max-conns", def.HTTP.MaxConns, "connections each HTTP server holds open at most, 1 to 1048576; at the cap new clients wait in the listen backlog, holding no file descriptor of the node, until a connection closes (idle ones after --http-idle-timeout, silent ones after --http-read-header-timeout); the servers' caps together should stay under half the open-file limit (ulimit -n), which gRPC, gossip and data files share: questd warns at start otherwise")
	d.dur(&c.HTTP.ReadHeaderTimeout, "http-read-header-timeout", def.HTTP.ReadHeaderTimeout, "how long a connection has to send a request's headers, from its accept (or the next request's first byte on a kept-alive connection); a connection that says nothing is closed then; above 0 and at most 1h")
	d.dur(&c.HTTP.IdleTimeout, "http-idle-timeout", def.HTTP.IdleTimeout, "close a kept-alive connection that has waited this long for its next request; streams are not cut: a completion's response may stream for minutes, each write only has to progress within a minute; above 0 and at most 24h")

	d.group("Logging and process")
	d.text("log-level", "info", "lowest level logged, `debug|info|warn|error`", func(s string) (err error) {
		c.Log.Level, err = parseLogLevel(s)
		return err
	})
	d.text("log-format", "text", "log format on stderr, `text|json`", func(s string) error {
		if s != "text" && s != "json" {
			return fmt.Errorf("want text or json")
		}
		c.Log.Format = s
		return nil
	})
	d.str(&c.Node.ReadyFile, "ready-file", def.Node.ReadyFile, "`file` that also receives the ready JSON line (it is always printed on stdout)")
	d.str(&c.ConfigFile, "config", def.ConfigFile, "YAML `file` of flag values, under the environment and the command line; at most 1 MiB")
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

// parseScrubRate reads --scrub-rate: off (-1) or a positive size for
// memlimit.ParseBytes.
func parseScrubRate(s string) (int64, error) {
	if strings.TrimSpace(s) == "off" {
		return -1, nil
	}
	v, err := memlimit.ParseBytes(s)
	if err != nil || v <= 0 {
		return 0, errors.New("want bytes per second above 0 (like 64MiB), or off")
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
