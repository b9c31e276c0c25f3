package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/internal/certgen"
	grpcstatus "google.golang.org/grpc/status"
)

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
	// cpus are the CPUs each node is pinned to, by node (--node-cpus;
	// nil: none).
	cpus [][]int
}

// cpuShares splits the CPUs allowed into n disjoint shares of
// max(1, len(allowed)/n) CPUs each, in order (the CPUs left over pinned
// to no node); nil when there are more nodes than CPUs, or one node.
func cpuShares(allowed []int, n int) [][]int {
	if n < 2 || len(allowed) < n {
		return nil
	}
	k := len(allowed) / n
	shares := make([][]int, n)
	for i := range shares {
		shares[i] = allowed[i*k : (i+1)*k : (i+1)*k]
	}
	return shares
}

// nodeProcsOf is the nodes' GOMAXPROCS for --node-procs v and n nodes
// on this host (0: unset): auto is max(1, CPUs/n).
func nodeProcsOf(v string, n int) (int, error) {
	if v == "auto" {
		return max(1, runtime.NumCPU()/n), nil
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 0 || p > 1024 {
		return 0, fmt.Errorf("--node-procs %q: want auto, 0 (unset) or 1..1024", v)
	}
	return p, nil
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
	if i := len(c.nodes); i < len(c.cpus) {
		if err := pinProcess(n.pid, c.cpus[i]); err != nil {
			// Only slower unpinned: the node runs on.
			fmt.Fprintf(c.stderr, "up: %s: not pinned to CPUs %v: %v\n", name, c.cpus[i], err)
		}
	}
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
