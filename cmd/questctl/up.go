package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/internal/certgen"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	grpcstatus "google.golang.org/grpc/status"
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

--node-procs P starts every node with GOMAXPROCS=P (by default each
node, as any Go program, uses every CPU). N nodes on one host share its
CPUs: with P = CPUs/N each node runs on its share, as it would in a
container limited to that many CPUs (where Go sets GOMAXPROCS to the
limit itself), and its threads stop waking each other across the
other nodes' CPUs on every message (measured on 2 cores, 2 nodes,
--node-procs 1: generate --addr from 0.39x to 0.44x of in process,
bench/results/2026-12-06-cluster-generate-cpu-2.md). A node serving
--model runs the model too: leave it unset there unless the model is
small.

questd is --questd, else a questd next to the questctl executable, else
questd on $PATH.`)
	nodes := fs.Int("nodes", 0, "number of questd nodes to start (required, at least 1)")
	cp, tp := new(int), new(int)
	*cp, *tp = 1, 1
	gridFlags(fs, cp, tp, "context-parallel degree of the cluster's grid, passed to every node as --cp",
		"tensor-parallel degree of the cluster's grid, passed to every node as --tp")
	questd := fs.String("questd", "", "path of the questd binary (default: questd next to questctl, else on $PATH)")
	timeout := fs.Duration("timeout", 30*time.Second, "the whole cluster must be ready, with every node seeing all N alive, within this time")
	stopTimeout := fs.Duration("stop-timeout", 10*time.Second, "after SIGTERM, how long the nodes have to drain before they are killed")
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
	nodeProcs := fs.Int("node-procs", 0, "run every node with GOMAXPROCS=`P` (0: unset, every CPU; 1..1024)")
	dataDir := fs.String("data-dir", "", "persist each node's sequences in `dir`/NAME (questd --data-dir; created 0700 if missing): a later up with the same --data-dir and --base-name recovers them (default: nothing persists)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		switch {
		case !flagSet(fs, "nodes"):
			return usageError{errors.New("--nodes is required: how many questd nodes to start (see 'questctl up --help')")}
		case *nodes < 1:
			return usageError{fmt.Errorf("--nodes %q: want at least 1", fmt.Sprint(*nodes))}
		case *cp < 1:
			return usageError{fmt.Errorf("--cp %q: want at least 1", fmt.Sprint(*cp))}
		case *tp < 1:
			return usageError{fmt.Errorf("--tp %q: want at least 1", fmt.Sprint(*tp))}
		case *timeout <= 0:
			return usageError{fmt.Errorf("--timeout %q: must be positive", timeout.String())}
		case *stopTimeout <= 0:
			return usageError{fmt.Errorf("--stop-timeout %q: must be positive", stopTimeout.String())}
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
		case *nodeProcs < 0 || *nodeProcs > 1024:
			return usageError{fmt.Errorf("--node-procs %q: want 0 (unset) or 1..1024", fmt.Sprint(*nodeProcs))}
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
			exited: make(chan *upNode, *nodes), first: first, dataDirs: nodeDirs, procs: *nodeProcs,
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
			fmt.Fprintf(errw, "questctl up: mutual TLS: CA, node and client certificates (valid %d days) in %s%s\n",
				int(certgen.Validity.Hours()/24), dir, fate)
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

// upNodeName is the name of node i of a cluster called base.
func upNodeName(base string, i int) string { return fmt.Sprintf("%s-%d", base, i) }

// writeUpCerts makes a throwaway CA, a node certificate
// (questrt://node/NAME) for each of the count nodes called base-0.. and a
// client certificate (questrt://client/client) for the client
// (upClientName), and writes them in dir (internal/certgen).
func writeUpCerts(dir, base string, count int) error {
	ca, err := certgen.NewCA("questctl up " + base + " CA")
	if err != nil {
		return err
	}
	leaves := map[string]*certgen.Leaf{}
	if leaves[upClientName], err = ca.IssueClient(upClientName); err != nil {
		return err
	}
	for _, name := range nodeNames(base, count) {
		if leaves[name], err = ca.IssueNode(name); err != nil {
			return err
		}
	}
	return certgen.WriteFiles(dir, ca, leaves)
}

// nodeNames are the names of a cluster's count nodes.
func nodeNames(base string, count int) []string {
	names := make([]string, count)
	for i := range names {
		names[i] = upNodeName(base, i)
	}
	return names
}

// prepareDataDirs makes the data directory of each node named in names,
// dir/NAME (absolute), creating dir and them (0700) when missing, and
// checks that a file can be created in each: the reason it cannot, one
// line, naming the directory, before any node starts.
func prepareDataDirs(dir string, names []string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	dirs := make([]string, len(names))
	for i, name := range names {
		dirs[i] = filepath.Join(abs, name)
	}
	for _, d := range append([]string{abs}, dirs...) {
		fi, err := os.Stat(d)
		switch {
		case err == nil && !fi.IsDir():
			return nil, fmt.Errorf("%s is not a directory", d)
		case errors.Is(err, fs.ErrNotExist):
			if err := os.MkdirAll(d, 0o700); err != nil {
				return nil, fmt.Errorf("cannot create %s: %v", d, pathReason(err))
			}
		case err != nil:
			return nil, fmt.Errorf("cannot use %s: %v", d, pathReason(err))
		}
	}
	for _, d := range dirs {
		f, err := os.CreateTemp(d, ".questctl-up-probe-")
		if err != nil {
			return nil, fmt.Errorf("cannot write in %s: %v", d, pathReason(err))
		}
		f.Close()
		os.Remove(f.Name())
	}
	return dirs, nil
}

// pathReason is the reason of a file system error without the path it
// names (the caller names it).
func pathReason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:@%+=,-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// findQuestd returns the questd binary to run: flagValue, else questd next
// to this executable, else questd on $PATH.
func findQuestd(flagValue string) (string, error) {
	if flagValue != "" {
		if err := checkExecutable(flagValue); err != nil {
			return "", usageError{fmt.Errorf("--questd %q: %v", flagValue, err)}
		}
		abs, err := filepath.Abs(flagValue) // exec would look a bare name up in $PATH
		if err != nil {
			return "", usageError{fmt.Errorf("--questd %q: %v", flagValue, err)}
		}
		return abs, nil
	}
	next := "questd next to questctl"
	if exe, err := os.Executable(); err == nil {
		next = filepath.Join(filepath.Dir(exe), "questd")
		if checkExecutable(next) == nil {
			return next, nil
		}
	}
	if p, err := exec.LookPath("questd"); err == nil {
		return p, nil
	}
	return "", usageError{fmt.Errorf("no questd binary: not at %s nor on $PATH; build it (go build -o DIR ./cmd/questd) or pass --questd PATH", next)}
}

// checkExecutable reports why path is not an executable file, if it is not.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("no such file")
	case err != nil:
		return err
	case fi.IsDir():
		return errors.New("is a directory")
	case fi.Mode()&0o111 == 0:
		return errors.New("not executable")
	}
	return nil
}

// upCluster is the set of questd processes one up started.
type upCluster struct {
	bin       string
	plaintext bool   // the nodes run with --insecure (common holds it)
	tlsDir    string // else: the certificates writeUpCerts wrote, one per node
	token     string // the nodes' bearer token, for up's Status calls
	logDir    string
	stderr    *syncWriter
	nodes     []*upNode
	exited    chan *upNode // each node once, when its Wait returns
	// first are node 0's own flags (--model, --http-addr): its ready
	// line must then name its HTTP address.
	first []string
	// dataDirs are the nodes' --data-dir directories, by node (none
	// without up's --data-dir).
	dataDirs []string
	// procs is the nodes' GOMAXPROCS (--node-procs; 0: unset).
	procs int
}

// security is how up's own calls reach the nodes.
func (c *upCluster) security() connSecurity {
	if c.plaintext {
		return connSecurity{plaintext: true}
	}
	return connSecurity{ca: filepath.Join(c.tlsDir, certgen.CAFile), cert: filepath.Join(c.tlsDir, certgen.CertFile(upClientName)),
		key: filepath.Join(c.tlsDir, certgen.KeyFile(upClientName)), dir: c.tlsDir}
}

// start starts count nodes one after the other, each ready before the
// next, then waits until every node sees all of them alive. Without
// plaintext each node gets its certificate in tlsDir.
func (c *upCluster) start(ctx context.Context, base string, count int, common []string) error {
	for i := range count {
		name := upNodeName(base, i)
		args := []string{"--name", name, "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}
		if !c.plaintext {
			args = append(args, "--tls-cert", filepath.Join(c.tlsDir, certgen.CertFile(name)),
				"--tls-key", filepath.Join(c.tlsDir, certgen.KeyFile(name)), "--tls-ca", filepath.Join(c.tlsDir, certgen.CAFile))
		}
		if i < len(c.dataDirs) {
			args = append(args, "--data-dir", c.dataDirs[i])
		}
		if i > 0 {
			args = append(args, "--join", c.nodes[0].gossip)
		} else {
			args = append(args, c.first...)
		}
		n, err := c.startNode(name, append(args, common...))
		if err != nil {
			return err
		}
		if i < len(c.dataDirs) {
			n.dataDir = c.dataDirs[i]
		}
		if err := n.awaitReady(ctx, i == 0 && c.first != nil); err != nil {
			return err
		}
	}
	return c.awaitAlive(ctx)
}

// startNode starts one questd. The node is in c.nodes once it has
// started, so that stop stops it whatever happens next.
func (c *upCluster) startNode(name string, args []string) (*upNode, error) {
	n := &upNode{
		name:    name,
		ready:   make(chan readyLine, 1),
		done:    make(chan struct{}),
		outDone: make(chan struct{}),
	}
	var errSink, outSink io.Writer
	if c.logDir != "" {
		f, err := os.Create(filepath.Join(c.logDir, name+".log"))
		if err != nil {
			return nil, fmt.Errorf("--log-dir: %v", err)
		}
		n.closers = append(n.closers, f.Close)
		errSink, outSink = f, f
	} else {
		ep := &prefixWriter{out: c.stderr, prefix: name + ": "}
		op := &prefixWriter{out: c.stderr, prefix: name + ": "}
		n.closers = append(n.closers, ep.flush, op.flush)
		errSink, outSink = ep, op
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		n.close()
		return nil, fmt.Errorf("start %s: %v", name, err)
	}
	n.stdout = pr
	cmd := exec.Command(c.bin, args...)
	if c.procs > 0 {
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(c.procs))
	}
	cmd.Stdout = pw
	cmd.Stderr = errSink
	cmd.SysProcAttr = childSysProcAttr()
	cmd.WaitDelay = 2 * time.Second // a grandchild holding stderr open cannot hang Wait
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		n.close()
		return nil, fmt.Errorf("start %s (%s): %v", name, c.bin, err)
	}
	pw.Close()
	n.cmd, n.pid = cmd, cmd.Process.Pid
	c.nodes = append(c.nodes, n)
	go n.readStdout(outSink)
	go func() {
		n.err = cmd.Wait()
		close(n.done)
		c.exited <- n
	}()
	return n, nil
}

// awaitAlive polls every node's Status until each lists exactly the
// cluster's nodes as alive.
func (c *upCluster) awaitAlive(ctx context.Context) error {
	want := make([]string, len(c.nodes))
	clients := make([]decodev1.DecodeClient, len(c.nodes))
	for i, n := range c.nodes {
		want[i] = n.name
		conn, err := dialDecode(n.grpc, c.security(), c.token)
		if err != nil {
			return err
		}
		defer conn.Close()
		clients[i] = decodev1.NewDecodeClient(conn)
	}
	sort.Strings(want)
	tick := time.NewTicker(upPollEvery)
	defer tick.Stop()
	for {
		var behind string // the first node not there yet, and why
		for i, n := range c.nodes {
			if n.exited() {
				return fmt.Errorf("%s (pid %d) exited while the cluster was forming (%s)", n.name, n.pid, n.exitStatus())
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			r, err := clients[i].Status(cctx, &decodev1.StatusRequest{})
			cancel()
			if err != nil {
				if behind == "" {
					behind = fmt.Sprintf("%s: Status: %s", n.name, grpcstatus.Convert(err).Message())
				}
				continue
			}
			var alive []string
			for _, m := range r.GetMembers() {
				if m.GetState() == "alive" {
					alive = append(alive, m.GetName())
				}
			}
			sort.Strings(alive)
			if strings.Join(alive, ",") != strings.Join(want, ",") && behind == "" {
				behind = fmt.Sprintf("%s sees %d of %d alive [%s]", n.name, len(alive), len(want), strings.Join(alive, " "))
			}
		}
		if behind == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return startError(ctx, behind)
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM to every running node, waits up to grace for them,
// kills the rest and reaps them all. It reports the nodes it had to kill
// and those that stopped with a failure status; a node that had exited
// before is the caller's to report.
func (c *upCluster) stop(grace time.Duration) {
	signalled := map[*upNode]bool{}
	for _, n := range c.nodes {
		if !n.exited() {
			n.cmd.Process.Signal(syscall.SIGTERM)
			signalled[n] = true
		}
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	expired := false
	for _, n := range c.nodes {
		if !expired {
			select {
			case <-n.done:
			case <-timer.C:
				expired = true
			}
		}
		if !n.exited() {
			n.cmd.Process.Kill()
			<-n.done
			fmt.Fprintf(c.stderr, "questctl up: %s (pid %d) did not stop within %v of SIGTERM: killed\n", n.name, n.pid, grace)
		} else if signalled[n] && !n.cmd.ProcessState.Success() {
			fmt.Fprintf(c.stderr, "questctl up: %s (pid %d) stopped with %s\n", n.name, n.pid, n.exitStatus())
		}
	}
	for _, n := range c.nodes {
		n.close()
	}
}

// upNode is one questd process.
type upNode struct {
	name   string
	cmd    *exec.Cmd
	pid    int
	stdout *os.File       // the read end of the node's stdout
	ready  chan readyLine // the node's first ready line
	done   chan struct{}  // closed when cmd.Wait has returned
	err    error          // cmd.Wait's error, once done is closed

	outDone chan struct{} // closed when readStdout has returned
	closers []func() error

	grpc, gossip string // from the ready line
	metrics      string // the metrics server's (/metrics), from the ready line
	http         string // the completions API's, from the ready line of a node with --model
	dataDir      string // its --data-dir, "" for none
}

// readyLine is the line questd prints on its stdout once it serves.
type readyLine struct {
	Event  string `json:"event"`
	Name   string `json:"name"`
	GRPC   string `json:"grpc"`
	Gossip string `json:"gossip"`
	// HTTP is the completions API's address (questd --model).
	HTTP string `json:"http,omitempty"`
	// Metrics is the metrics server's address (questd --metrics-addr).
	Metrics string `json:"metrics,omitempty"`
}

// readStdout passes the node's first ready line to n.ready and every
// other line of its stdout to sink.
func (n *upNode) readStdout(sink io.Writer) {
	defer close(n.outDone)
	defer n.stdout.Close()
	sent := false
	br := bufio.NewReader(n.stdout)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			var r readyLine
			if !sent && json.Unmarshal([]byte(line), &r) == nil && r.Event == "ready" {
				n.ready <- r
				sent = true
			} else {
				io.WriteString(sink, line)
			}
		}
		if err != nil {
			return
		}
	}
}

// awaitReady waits for the node's ready line and takes its addresses
// (with api, the completions API's too).
func (n *upNode) awaitReady(ctx context.Context, api bool) error {
	select {
	case r := <-n.ready:
		if r.Name != n.name {
			return fmt.Errorf("%s (pid %d): its ready line names %q", n.name, n.pid, r.Name)
		}
		if err := checkHostPort(r.GRPC); err != nil {
			return fmt.Errorf("%s (pid %d): ready line: grpc %q: %v", n.name, n.pid, r.GRPC, err)
		}
		if err := checkHostPort(r.Gossip); err != nil {
			return fmt.Errorf("%s (pid %d): ready line: gossip %q: %v", n.name, n.pid, r.Gossip, err)
		}
		if api {
			if err := checkHostPort(r.HTTP); err != nil {
				return fmt.Errorf("%s (pid %d): ready line: http %q (the completions API of --model): %v", n.name, n.pid, r.HTTP, err)
			}
			n.http = r.HTTP
		}
		n.grpc, n.gossip, n.metrics = r.GRPC, r.Gossip, r.Metrics
		return nil
	case <-n.done:
		return fmt.Errorf("%s (pid %d) exited before it was ready (%s)", n.name, n.pid, n.exitStatus())
	case <-ctx.Done():
		return startError(ctx, fmt.Sprintf("%s (pid %d) printed no ready line", n.name, n.pid))
	}
}

// startTimeout is the start-up deadline passing; what says what was
// still missing.
type startTimeout struct{ what string }

func (e startTimeout) Error() string { return e.what + ": start-up deadline passed" }

// startError is the error of a start-up step cut short by ctx.
func startError(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return startTimeout{what}
	}
	return fmt.Errorf("%s: %w", what, ctx.Err())
}

// exited reports whether the node's process has exited and been reaped.
func (n *upNode) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// exitStatus describes how the node exited ("exit status 3", "signal:
// killed"); call it once done is closed.
func (n *upNode) exitStatus() string {
	if n.cmd.ProcessState != nil {
		return n.cmd.ProcessState.String()
	}
	return n.err.Error()
}

// close releases what the node's output used, once the process is
// reaped: it waits briefly for the rest of its stdout (a grandchild may
// hold it open), then closes the log file or flushes the prefixed lines.
func (n *upNode) close() {
	if n.cmd != nil {
		select {
		case <-n.outDone:
		case <-time.After(2 * time.Second):
			n.stdout.Close()
			<-n.outDone
		}
	}
	for _, f := range n.closers {
		f()
	}
	n.closers = nil
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// prefixWriter writes whole lines to out, each starting with prefix.
type prefixWriter struct {
	out    io.Writer
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		// A failing stderr must not stop the node's output being read.
		io.WriteString(p.out, p.prefix+string(p.buf[:i+1]))
		p.buf = p.buf[i+1:]
	}
}

// flush writes a last unterminated line.
func (p *prefixWriter) flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) == 0 {
		return nil
	}
	_, err := io.WriteString(p.out, p.prefix+string(p.buf)+"\n")
	p.buf = nil
	return err
}
