package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/internal/certgen"
)

// upPollEvery is how often up asks every node for its Status while the
// cluster forms.
const upPollEvery = 100 * time.Millisecond

// upManaged are the questd flags that up sets for every node, with what
// to use instead after "--".
var upManaged = map[string]string{
	"name":                         "--base-name",
	"grpc-addr":                    "", // 127.0.0.1:0, reported in the ready line
	"gossip-addr":                  "",
	"metrics-addr":                 "", // 127.0.0.1:0: every node its own free port
	"join":                         "",
	"insecure":                     "questctl up --insecure",
	"plaintext":                    "questctl up --insecure",
	"tls-cert":                     "questctl up --tls-dir DIR to keep the certificates up makes, or --insecure",
	"tls-key":                      "questctl up --tls-dir DIR to keep the certificates up makes, or --insecure",
	"tls-ca":                       "questctl up --tls-dir DIR to keep the certificates up makes, or --insecure",
	"cp":                           "questctl up --cp",
	"tp":                           "questctl up --tp",
	"decode-context-parallel-size": "questctl up --cp",
	"tensor-parallel-size":         "questctl up --tp",
	"model":                        "questctl up --model DIR (the API on the first node)",
	"http-addr":                    "questctl up --model DIR --http-addr HOST:PORT",
	"serve-layout":                 "questctl up --model DIR --serve-layout cluster",
	"serve-cp":                     "questctl up --model DIR --serve-layout cluster --serve-cp C",
	"serve-tp":                     "questctl up --model DIR --serve-layout cluster --serve-tp T",
	"data-dir":                     "questctl up --data-dir DIR (every node its own DIR/NAME)",
}

// upClientName is the name of the client certificate that up writes in
// its TLS directory (DIR/client.pem, DIR/client.key), the one the
// clients' --tls-dir takes.
const upClientName = "client"

var baseNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	own, extra := splitDashDash(args)
	return runCommand(ctx, func() (*flag.FlagSet, action) { return upCommand(extra) }, own, stdout, stderr)
}

// Bounds of up's and demo's local clusters, checked before anything is
// written or started.
const (
	// maxLocalNodes bounds --nodes: every node is a questd process on
	// this host, with its own listeners, goroutines and page pools (a
	// demo of --nodes 100000 started 188 before failing, at load 147).
	maxLocalNodes = 64
	// maxGridCP and maxGridTP are questd's bounds of --cp and --tp, which
	// up passes to every node.
	maxGridCP = 4096
	maxGridTP = 1024
	// maxUpTimeout bounds --timeout and --stop-timeout.
	maxUpTimeout = time.Hour
)

// upCommand builds the flags and the action of
// 'questctl up' without running it (see [runCommand]).
func upCommand(extra []string) (*flag.FlagSet, action) {
	fs := newFlags("up", `Usage: questctl up --nodes N [--cp C --tp T] [--model DIR [--http-addr HOST:PORT] [--serve-layout cluster --serve-cp C --serve-tp T]] [--questd PATH] [--timeout 30s] [--insecure | --tls-dir DIR] [--data-dir DIR] [flags] [-- questd flags...]

Starts a local questd cluster on the loopback interface and keeps it
running until interrupted (SIGINT or SIGTERM). Node 0 is started first
with --name BASE-0 --grpc-addr 127.0.0.1:0 --gossip-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0
--tls-cert DIR/BASE-0.pem --tls-key DIR/BASE-0.key --tls-ca DIR/ca.pem (with --insecure:
--insecure) --cp C --tp T and the flags after "--"; nodes 1..N-1 get the
same flags (each its own certificate) plus --join with node 0's gossip
address. Each node's
ready line ({"event":"ready",...} on its stdout) gives its addresses; its
stderr is passed through prefixed with its name, or written to
DIR/NAME.log with --log-dir.

With --model DIR node 0 also serves the OpenAI-compatible completions
API of that checkpoint (questd --model DIR --http-addr HOST:PORT,
--http-addr 127.0.0.1:0 by default: a free port), and up prints its
URL once the cluster is up, "completions: http://ADDR/v1 (model NAME on
BASE-0)" (with --json, "http" and "url" in node 0's object). The API's
own flags (--max-running, --monitor-rate, --request-history, ...) go
after "--" (every node gets them; only node 0 serves a model). The API
is plain HTTP whatever the gRPC security. By default the served
requests' KV pages live in node 0's own engine; with --serve-layout
cluster --serve-cp C --serve-tp T (node 0's flags) every request's
pages live on a C x T grid placed over the cluster's nodes, node 0
coordinating it and running the model (one decode step per token and
grid), and up prints "serving: attention on C x T grids ...".

Mutual TLS by default: up makes a throwaway CA (ECDSA P-256, valid 7
days; its key is never written), a certificate for every node and one
for the client (SANs 127.0.0.1, ::1, localhost), and writes them in
--tls-dir: ca.pem, NAME.pem and NAME.key (mode 0600), client.pem and
client.key. Without --tls-dir that is a new temporary directory, named
on stderr and removed when up exits (unless --keep-tls-dir). Clients
reach the cluster with --tls-dir DIR ('questctl status --addr ADDR
--tls-dir DIR'; replay --addr and generate --addr take it too).
--insecure (alias --plaintext) runs the nodes without TLS, with
questd --insecure, and makes no certificates.

The gossip layer is keyed by default too: under TLS up writes a fresh
random key (32 bytes, base64) as DIR/gossip.key (mode 0600) next to the
certificates and starts every node with --gossip-key-file DIR/gossip.key,
so a process without the key cannot join the cluster or read its gossip.
A --gossip-key-file after "--" is used instead of a new key. With
--insecure the gossip is plaintext as well (unless "--" passes a key).

Once every node's Status lists all N nodes alive, up prints one line per
node, "NAME grpc=ADDR gossip=ADDR metrics=ADDR pid=PID" (metrics: the
node's /metrics, /healthz and /readyz), then the command that
reaches the cluster, "connect: questctl status --addr ADDR [--tls-dir
DIR]" (with --token-file when the nodes have one), then "cluster up: N
nodes" (with --json, one JSON object per node instead, with "metrics",
and "tls_dir" under TLS). Everything up to there must happen within --timeout, or up
stops the nodes it started and exits 1.

With --data-dir DIR every node persists the sequences of the grids it
hosts in a directory of its own, DIR/NAME (questd --data-dir DIR/BASE-0
and so on; DIR and those directories are created 0700 when missing):
stop up (or kill a node) and run up again with the same --data-dir,
--base-name, --nodes and grid flags, and each node finds its sequences
again; they come back when their grid opens (the first create, or
Recovered: 'questctl status' then lists them, with the tail tokens a
kill lost). A SIGINT or SIGTERM stop saves every sequence in full (a
node that cannot, its disk full, says so and stops with exit status 1,
which up reports). up refuses, before it starts any node, a DIR or
DIR/NAME that is not a directory or cannot be written. One up per DIR:
a node whose directory another questd holds exits at once, naming it.

A node that exits by itself (a crash, kill -9) is reported with its exit
status and the others keep running, as a cluster does without it; once
every node has exited up exits 1. On SIGINT or SIGTERM up sends SIGTERM
to every node, waits --stop-timeout for them to drain and leave, kills
the rest and exits 0 (naming on stderr the nodes that had exited by
themselves before). On Linux the nodes also get SIGTERM if questctl dies
(a killed questctl leaves its temporary TLS directory behind).

--node-procs P starts every node with GOMAXPROCS=P. By default (auto)
P is max(1, CPUs/N) for N nodes: the nodes all run on this host and share
its CPUs, so each runs on its share, as it would in a container limited
to that many CPUs (where Go sets GOMAXPROCS to the limit itself), and its
threads stop waking each other across the other nodes' CPUs on every
message (measured on 2 cores, 2 nodes: generate --addr from 0.39x to
0.44x of in process with P = 1, bench/results/2026-12-06-cluster-generate-cpu-2.md
and -3.md). --node-procs 0 leaves GOMAXPROCS unset (every node uses
every CPU, or what up's own environment says): a node serving --model
runs the model too, which may want every CPU.

--node-cpus auto (the default, with --node-procs auto, on Linux, when
there are no more nodes than CPUs that up may run on) pins node i to the
i-th share of those CPUs (its P of them, as --node-procs sizes it), the
way separate hosts would not share a core: unpinned, the kernel places a
node woken by a message on the CPU of the node that sent it, busy with
its own rank of the same layer, and the layer's path waits for it
(measured on 2 cores, 2 nodes, with other processes running: generate
--addr's message to node 1 waited for node 0's attention in about half
the layers; bench/results/2026-12-06-cluster-generate-cpu-5.md).
--node-cpus off leaves the nodes unpinned.

questd is --questd, else a questd next to the questctl executable, else
questd on $PATH.`)
	nodes := fs.Int("nodes", 0, fmt.Sprintf("number of questd nodes to start, each a process on this host (required, 1..%d)", maxLocalNodes))
	cp, tp := new(int), new(int)
	*cp, *tp = 1, 1
	gridFlags(fs, cp, tp, fmt.Sprintf("context-parallel degree of the cluster's grid, passed to every node as --cp (1..%d)", maxGridCP),
		fmt.Sprintf("tensor-parallel degree of the cluster's grid, passed to every node as --tp (1..%d)", maxGridTP))
	questd := fs.String("questd", "", "path of the questd binary (default: questd next to questctl, else on $PATH)")
	timeout := fs.Duration("timeout", 30*time.Second, fmt.Sprintf("the whole cluster must be ready, with every node seeing all N alive, within this time (above 0, at most %v)", maxUpTimeout))
	stopTimeout := fs.Duration("stop-timeout", 10*time.Second, fmt.Sprintf("after SIGTERM, how long the nodes have to drain before they are killed (above 0, at most %v)", maxUpTimeout))
	baseName := fs.String("base-name", "node", "node names are BASE-0 .. BASE-(N-1)")
	var insecure bool
	fs.BoolVar(&insecure, "insecure", false, "run the nodes' gRPC without TLS (questd --insecure; a loopback cluster): no certificates")
	fs.BoolVar(&insecure, "plaintext", false, "the older name of --insecure, the same")
	tlsDir := fs.String("tls-dir", "", "write the CA and the certificates in DIR (created 0700 if missing; files up writes there are replaced) and keep them (default: a new temporary directory, removed on exit)")
	keepTLS := fs.Bool("keep-tls-dir", false, "keep the temporary TLS directory when up exits (its path is printed on stderr)")
	logDir := fs.String("log-dir", "", "write each node's stderr to DIR/NAME.log (overwritten) instead of questctl's stderr")
	asJSON := fs.Bool("json", false, `print one JSON object per node, {"name","grpc","gossip","pid"} and "tls_dir" with TLS, "http" and "url" on the node serving --model, "data_dir" with --data-dir, instead of the text lines`)
	modelDir := fs.String("model", "", "Hugging Face Llama checkpoint `dir` that node 0 serves with the completions API (questd --model); up prints the API's URL")
	httpAddr := fs.String("http-addr", "127.0.0.1:0", "with --model: listen `host:port` of node 0's completions API (port 0: a free one)")
	serveLayout := fs.String("serve-layout", "local", "with --model: where the served requests' KV pages live, `local|cluster`: local (node 0's own engine) or cluster (a --serve-cp x --serve-tp grid over the cluster's nodes, coordinated by node 0)")
	serveCP := fs.Int("serve-cp", 1, "with --model: context-parallel ranks of every served request (1..64; with --serve-layout cluster, ranks on the cluster's nodes)")
	serveTP := fs.Int("serve-tp", 1, "with --model: tensor-parallel ranks of every served request (1..64)")
	nodeProcs := fs.String("node-procs", "auto", "run every node with GOMAXPROCS=`P`: auto (max(1, CPUs/nodes): the nodes share this host), 0 (unset: every CPU, or up's own environment's), or 1..1024")
	nodeCPUs := fs.String("node-cpus", "auto", "pin each node to its own share of the CPUs up may run on: `auto` (with --node-procs auto, on Linux, when nodes <= CPUs) or off")
	dataDir := fs.String("data-dir", "", "persist each node's sequences in `dir`/NAME (questd --data-dir; created 0700 if missing): a later up with the same --data-dir and --base-name recovers them (default: nothing persists)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		switch {
		case !flagSet(fs, "nodes"):
			return usageError{errors.New("--nodes is required: how many questd nodes to start (see 'questctl up --help')")}
		case *nodes < 1 || *nodes > maxLocalNodes:
			return usageError{fmt.Errorf("--nodes %q: want 1..%d (each node is a process on this host)", fmt.Sprint(*nodes), maxLocalNodes)}
		case *cp < 1 || *cp > maxGridCP:
			return usageError{fmt.Errorf("--cp %q: want 1..%d", fmt.Sprint(*cp), maxGridCP)}
		case *tp < 1 || *tp > maxGridTP:
			return usageError{fmt.Errorf("--tp %q: want 1..%d", fmt.Sprint(*tp), maxGridTP)}
		case *timeout <= 0 || *timeout > maxUpTimeout:
			return usageError{fmt.Errorf("--timeout %q: want above 0 and at most %v", timeout.String(), maxUpTimeout)}
		case *stopTimeout <= 0 || *stopTimeout > maxUpTimeout:
			return usageError{fmt.Errorf("--stop-timeout %q: want above 0 and at most %v", stopTimeout.String(), maxUpTimeout)}
		case !baseNameRE.MatchString(*baseName):
			return usageError{fmt.Errorf("--base-name %q: want letters, digits, '.', '_' or '-', starting with a letter or digit", *baseName)}
		case insecure && *tlsDir != "":
			return usageError{fmt.Errorf("--tls-dir %q: not with --insecure (no certificates without TLS)", *tlsDir)}
		case insecure && *keepTLS:
			return usageError{errors.New("--keep-tls-dir: not with --insecure (no certificates without TLS)")}
		case flagSet(fs, "http-addr") && *modelDir == "":
			return usageError{fmt.Errorf("--http-addr %q: only with --model (the completions API serves a model)", *httpAddr)}
		case *modelDir == "" && (flagSet(fs, "serve-layout") || flagSet(fs, "serve-cp") || flagSet(fs, "serve-tp")):
			return usageError{errors.New("--serve-layout, --serve-cp and --serve-tp: only with --model (they lay out the served model's requests)")}
		case *serveLayout != "local" && *serveLayout != "cluster":
			return usageError{fmt.Errorf("--serve-layout %q: want local or cluster", *serveLayout)}
		case *serveCP < 1 || *serveCP > 64:
			return usageError{fmt.Errorf("--serve-cp %q: want 1..64", fmt.Sprint(*serveCP))}
		case *serveTP < 1 || *serveTP > 64:
			return usageError{fmt.Errorf("--serve-tp %q: want 1..64", fmt.Sprint(*serveTP))}
		}
		procs, err := nodeProcsOf(*nodeProcs, *nodes)
		if err != nil {
			return usageError{err}
		}
		var cpus [][]int // per node: the CPUs it is pinned to (nil: none)
		switch *nodeCPUs {
		case "auto":
			if *nodeProcs == "auto" {
				cpus = cpuShares(allowedCPUs(), *nodes)
			}
		case "off":
		default:
			return usageError{fmt.Errorf("--node-cpus %q: want auto or off", *nodeCPUs)}
		}
		var first []string // node 0's own flags
		if *modelDir != "" {
			if fi, err := os.Stat(*modelDir); err != nil || !fi.IsDir() {
				why := "not a directory"
				if err != nil {
					why = err.Error()
				}
				return usageError{fmt.Errorf("--model %q: %s (want a checkpoint directory: config.json and safetensors)", *modelDir, why)}
			}
			if err := checkHostPort(*httpAddr); err != nil {
				return usageError{fmt.Errorf("--http-addr %q: %v", *httpAddr, err)}
			}
			abs, err := filepath.Abs(*modelDir)
			if err != nil {
				return usageError{fmt.Errorf("--model %q: %v", *modelDir, err)}
			}
			first = []string{"--model", abs, "--http-addr", *httpAddr}
			if *serveLayout != "local" || *serveCP != 1 || *serveTP != 1 {
				first = append(first, "--serve-layout", *serveLayout, "--serve-cp", fmt.Sprint(*serveCP), "--serve-tp", fmt.Sprint(*serveTP))
			}
		}
		if err := checkExtraFlags(extra); err != nil {
			return err
		}
		// The nodes' token, for up's own Status calls and the connect line.
		tokenFile := extraFlagValue(extra, "token-file")
		token, err := readTokenFile(tokenFile)
		if err != nil {
			return err
		}
		bin, err := findQuestd(*questd)
		if err != nil {
			return err
		}
		var nodeDirs []string // with --data-dir: each node's directory
		if *dataDir != "" {
			if nodeDirs, err = prepareDataDirs(*dataDir, nodeNames(*baseName, *nodes)); err != nil {
				return usageError{fmt.Errorf("--data-dir %q: %v", *dataDir, err)}
			}
		}
		if *logDir != "" {
			if err := os.MkdirAll(*logDir, 0o755); err != nil {
				return fmt.Errorf("--log-dir %q: %v", *logDir, err)
			}
		}

		sigCtx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stopSignals()
		errw := &syncWriter{w: stderr}
		c := &upCluster{
			bin: bin, plaintext: insecure, token: token, logDir: *logDir, stderr: errw,
			exited: make(chan *upNode, *nodes), first: first, dataDirs: nodeDirs, procs: procs, cpus: cpus,
		}
		var common []string
		if insecure {
			common = append(common, "--insecure")
		} else {
			dir, temp := *tlsDir, *tlsDir == ""
			if temp {
				if dir, err = os.MkdirTemp("", "questctl-up-tls-"); err != nil {
					return fmt.Errorf("TLS directory: %v", err)
				}
				if !*keepTLS {
					defer os.RemoveAll(dir) // after c.stop: every return below stops the nodes first
				}
			}
			if err := writeUpCerts(dir, *baseName, *nodes); err != nil {
				if temp && *keepTLS {
					os.RemoveAll(dir)
				}
				if !temp {
					err = fmt.Errorf("--tls-dir %q: %w", dir, err)
				}
				return err
			}
			fate := ""
			switch {
			case temp && *keepTLS:
				fate = " (kept: --keep-tls-dir)"
			case temp:
				fate = " (removed when up exits; --keep-tls-dir keeps it)"
			}
			keyNote := ""
			if extraFlagValue(extra, "gossip-key-file") == "" {
				key, err := writeGossipKey(dir)
				if err != nil {
					if !temp {
						err = fmt.Errorf("--tls-dir %q: %w", dir, err)
					}
					return err
				}
				common = append(common, "--gossip-key-file", key)
				keyNote = ", gossip key " + upGossipKeyFile
			}
			fmt.Fprintf(errw, "questctl up: mutual TLS: CA, node and client certificates (valid %d days)%s in %s%s\n",
				int(certgen.Validity.Hours()/24), keyNote, dir, fate)
			c.tlsDir = dir
		}
		common = append(append(common, "--cp", fmt.Sprint(*cp), "--tp", fmt.Sprint(*tp)), extra...)
		if len(nodeDirs) > 0 {
			fmt.Fprintf(errw, "questctl up: each node persists its sequences in %s (a later up with the same --data-dir and --base-name recovers them)\n",
				filepath.Join(filepath.Dir(nodeDirs[0]), *baseName+"-N"))
		}

		startCtx, cancel := context.WithTimeout(sigCtx, *timeout)
		err = c.start(startCtx, *baseName, *nodes, common)
		cancel()
		if err != nil {
			started := len(c.nodes)
			c.stop(*stopTimeout)
			var late startTimeout
			if sigCtx.Err() != nil {
				err = errors.New("interrupted while the cluster was starting")
			} else if errors.As(err, &late) {
				err = fmt.Errorf("cluster not up within --timeout %v: %s", *timeout, late.what)
			}
			if started > 0 {
				return fmt.Errorf("%w; stopped the %d node(s) started", err, started)
			}
			return err
		}

		for _, n := range c.nodes {
			if *asJSON {
				url := ""
				if n.http != "" {
					url = "http://" + n.http + "/v1"
				}
				err = bench.WriteJSONLine(stdout, struct {
					Name    string `json:"name"`
					GRPC    string `json:"grpc"`
					Gossip  string `json:"gossip"`
					Metrics string `json:"metrics,omitempty"`
					PID     int    `json:"pid"`
					TLSDir  string `json:"tls_dir,omitempty"`
					HTTP    string `json:"http,omitempty"`
					URL     string `json:"url,omitempty"`
					DataDir string `json:"data_dir,omitempty"`
				}{n.name, n.grpc, n.gossip, n.metrics, n.pid, c.tlsDir, n.http, url, n.dataDir})
			} else {
				metrics := ""
				if n.metrics != "" {
					metrics = " metrics=" + n.metrics
				}
				_, err = fmt.Fprintf(stdout, "%s grpc=%s gossip=%s%s pid=%d\n", n.name, n.grpc, n.gossip, metrics, n.pid)
			}
			if err != nil {
				c.stop(*stopTimeout)
				return err
			}
		}
		if !*asJSON {
			connect := "questctl status --addr " + c.nodes[0].grpc
			if c.tlsDir != "" {
				connect += " --tls-dir " + shellQuote(c.tlsDir)
			}
			if tokenFile != "" {
				connect += " --token-file " + shellQuote(tokenFile)
			}
			fmt.Fprintf(stdout, "connect: %s\n", connect)
			if n0 := c.nodes[0]; n0.http != "" {
				fmt.Fprintf(stdout, "completions: http://%s/v1 (model %s on %s)\n", n0.http, filepath.Base(first[1]), n0.name)
				if *serveLayout == "cluster" {
					fmt.Fprintf(stdout, "serving: attention on %d x %d grids over the cluster's nodes (--serve-layout cluster)\n", *serveCP, *serveTP)
				}
			}
			fmt.Fprintf(stdout, "cluster up: %d nodes\n", len(c.nodes))
		}

		// A node that exits by itself (a crash, kill -9) is reported and the
		// others keep running, as a cluster does without it; up ends on a
		// signal, or with an error once every node has exited.
		var crashed []string // nodes that exited by themselves
		for left := len(c.nodes); left > 0; {
			select {
			case <-sigCtx.Done():
				left = -1
				continue
			case n := <-c.exited:
				// A Ctrl-C reaches the nodes too (they share questctl's
				// process group): an exit just before questctl sees the
				// signal is the signal's doing, not the node's.
				select {
				case <-sigCtx.Done():
					left = -1
					continue
				case <-time.After(200 * time.Millisecond):
				}
				left--
				crashed = append(crashed, fmt.Sprintf("%s (%s)", n.name, n.exitStatus()))
				fmt.Fprintf(errw, "questctl up: %s (pid %d) exited by itself (%s); %d node(s) still running\n", n.name, n.pid, n.exitStatus(), left)
				if left == 0 {
					c.stop(*stopTimeout)
					return fmt.Errorf("every node exited; the last was %s (%s)", n.name, n.exitStatus())
				}
			}
		}
		fmt.Fprintf(errw, "questctl up: stopping %d node(s)\n", len(c.nodes))
		c.stop(*stopTimeout)
		if len(crashed) > 0 {
			fmt.Fprintf(errw, "questctl up: stopped; before that %d node(s) exited by themselves: %s\n", len(crashed), strings.Join(crashed, ", "))
		}
		return nil
	}
}

// splitDashDash splits args at the first "--": questctl's flags before
// it, questd's after it.
func splitDashDash(args []string) (own, extra []string) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:]
		}
	}
	return args, nil
}

// checkExtraFlags refuses questd flags that up sets itself.
func checkExtraFlags(extra []string) error {
	for _, a := range extra {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name := strings.TrimLeft(a, "-")
		name, _, _ = strings.Cut(name, "=")
		instead, ok := upManaged[name]
		if !ok {
			continue
		}
		why := "questctl up sets it for every node"
		if instead != "" {
			why += "; use " + instead
		}
		return usageError{fmt.Errorf("questd flag %q after \"--\": %s (see 'questctl up --help')", a, why)}
	}
	return nil
}

// extraFlagValue is the value of questd flag name in extra (--name V,
// --name=V, one dash or two; the last one wins), or "".
func extraFlagValue(extra []string, name string) string {
	v := ""
	for i := 0; i < len(extra); i++ {
		a := extra[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		n, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if n != name {
			continue
		}
		if hasVal {
			v = val
		} else if i+1 < len(extra) {
			v = extra[i+1]
			i++
		}
	}
	return v
}
