package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/worker/remote"
)

// transportCluster is the "transport" of the lines of bench collective
// --addr: gRPC streams between the nodes of a running cluster, secured
// as the cluster is.
const transportCluster = "cluster"

// clusterMeta is what a line of bench collective --addr adds: the node
// asked and the nodes that ran the ranks, by rank.
type clusterMeta struct {
	Addr  string   `json:"addr"`
	Nodes []string `json:"nodes"`
}

// addrRun is one bench collective --addr invocation: the node to ask
// and what to run.
type addrRun struct {
	addr    string
	dc      decodev1.DecodeClient
	nodes   []int // 0: every node up
	c       collective.BenchConfig
	sw      collective.SweepConfig
	sweep   bool
	timeout time.Duration // of each configuration's run on the nodes
	// emit writes one line; tls and cm are the line's.
	emit      func(r collective.BenchResult, tls bool, cm *clusterMeta) error
	emitSweep func(r collective.SweepResult, tls bool, cm *clusterMeta) error
	progress  io.Writer
}

// run runs every configuration, one BenchCollective call each, and
// emits its lines.
func (a addrRun) run(ctx context.Context) error {
	for _, n := range a.nodes {
		if a.sweep {
			spec := &workerv1.BenchSpec{MinBytes: uint64(a.sw.MinBytes), MaxBytes: uint64(a.sw.MaxBytes), Factor: uint32(a.sw.Factor),
				Steps: uint32(a.sw.Steps), Warmup: uint32(a.sw.Warmup), TimeoutNs: int64(a.timeout)}
			fmt.Fprintf(a.progress, "bench collective --addr %s: all-gather sweep on %s: %d + %d rounds per size over the cluster's streams\n",
				a.addr, nodesWord(n), a.sw.Warmup, a.sw.Steps)
			reps, err := a.call(ctx, n, spec)
			if err != nil {
				return err
			}
			samples := make([]collective.SweepSamples, len(reps))
			for i, r := range reps {
				if err := json.Unmarshal(r.GetReport(), &samples[i]); err != nil {
					return fmt.Errorf("bench collective --addr %s: node %s (rank %d) sent a bad report: %w", a.addr, r.GetNode(), r.GetRank(), err)
				}
			}
			sw := a.sw
			sw.Shards, sw.Transport = []int{len(reps)}, transportCluster
			res, err := collective.SweepCombine(sw, samples)
			if err != nil {
				return fmt.Errorf("bench collective --addr %s: %w", a.addr, err)
			}
			tls, cm := clusterOf(a.addr, reps)
			for _, r := range res {
				r.Processes = len(reps)
				if err := a.emitSweep(r, tls, cm); err != nil {
					return err
				}
			}
			continue
		}
		for _, b := range a.c.Batches {
			c := a.c
			spec := &workerv1.BenchSpec{Batch: uint32(b), KvHeads: uint32(c.KVHeads), QHeads: uint32(c.QHeads), HeadDim: uint32(c.HeadDim),
				K: uint32(c.PageBudget), Pages: uint32(c.Pages), Steps: uint32(c.Steps), Warmup: uint32(c.Warmup), Seed: c.Seed,
				TimeoutNs: int64(a.timeout)}
			fmt.Fprintf(a.progress, "bench collective --addr %s: %s batch %d: %d + %d layer-steps over the cluster's streams\n",
				a.addr, nodesWord(n), b, c.Warmup, c.Steps)
			reps, err := a.call(ctx, n, spec)
			if err != nil {
				return err
			}
			samples := make([]collective.BenchSamples, len(reps))
			for i, r := range reps {
				if err := json.Unmarshal(r.GetReport(), &samples[i]); err != nil {
					return fmt.Errorf("bench collective --addr %s: node %s (rank %d) sent a bad report: %w", a.addr, r.GetNode(), r.GetRank(), err)
				}
			}
			c.Transport = transportCluster
			res, err := collective.BenchCombine(c, b, samples)
			if err != nil {
				return fmt.Errorf("bench collective --addr %s: %w", a.addr, err)
			}
			res.Processes = len(reps)
			tls, cm := clusterOf(a.addr, reps)
			if err := a.emit(res, tls, cm); err != nil {
				return err
			}
		}
	}
	return nil
}

// nodesWord says how many nodes a configuration asks for.
func nodesWord(n int) string {
	if n == 0 {
		return "every node up"
	}
	return fmt.Sprintf("%d nodes", n)
}

// call asks the node for one run on n nodes and checks that every rank
// answered once.
func (a addrRun) call(ctx context.Context, n int, spec *workerv1.BenchSpec) ([]*decodev1.BenchRankReport, error) {
	// The node bounds the run by spec's timeout; this bounds the call
	// too, with room for the nodes to connect and answer.
	cctx, cancel := context.WithTimeout(ctx, a.timeout+2*remote.DefaultConnectTimeout)
	defer cancel()
	rep, err := a.dc.BenchCollective(cctx, &decodev1.BenchCollectiveRequest{Nodes: uint32(n), Spec: spec})
	if err != nil {
		st := grpcstatus.Convert(err)
		switch {
		case st.Code() == codes.InvalidArgument:
			return nil, usageError{fmt.Errorf("bench collective --addr %s: refused: %s", a.addr, st.Message())}
		case strings.HasPrefix(st.Message(), "bench collective"):
			return nil, fmt.Errorf("bench collective --addr %s: %s: %s", a.addr, st.Code(), st.Message())
		}
		return nil, fmt.Errorf("bench collective --addr %s: %w", a.addr, err)
	}
	ranks := rep.GetRanks()
	if n != 0 && len(ranks) != n {
		return nil, fmt.Errorf("bench collective --addr %s: %d ranks answered, want %d", a.addr, len(ranks), n)
	}
	for i, r := range ranks {
		if int(r.GetRank()) != i {
			return nil, fmt.Errorf("bench collective --addr %s: the reply's rank %d is at %d", a.addr, r.GetRank(), i)
		}
	}
	if len(ranks) < 2 {
		return nil, errors.New("bench collective --addr: fewer than 2 ranks answered")
	}
	return ranks, nil
}

// clusterOf is the metadata of a run's reports: TLS when every rank's
// streams were encrypted, the node asked and the nodes by rank.
func clusterOf(addr string, reps []*decodev1.BenchRankReport) (bool, *clusterMeta) {
	tls := true
	cm := &clusterMeta{Addr: addr}
	for _, r := range reps {
		tls = tls && r.GetTls()
		cm.Nodes = append(cm.Nodes, r.GetNode())
	}
	return tls, cm
}

// addrFlags are the flags of bench collective that --addr reads besides
// the sizes.
type addrFlags struct {
	addr           string
	conn           *connFlags
	tokenFile      string
	nodes, batches string
	timeout        time.Duration
	asJSON         bool
}

// benchCollectiveAddr is bench collective --addr: it checks the flags
// (every refusal before anything runs), then runs each configuration on
// the cluster.
func benchCollectiveAddr(ctx context.Context, fs *flag.FlagSet, f addrFlags, c collective.BenchConfig, sw collective.SweepConfig, sweep bool, stdout, stderr io.Writer) error {
	for _, name := range []string{"shards", "transport", "max-memory"} {
		if flagSet(fs, name) {
			return usageError{fmt.Errorf("--%s: not with --addr (the ranks run on the cluster's nodes, over its streams, within each node's memory limit)", name)}
		}
	}
	if err := checkHostPort(f.addr); err != nil {
		return usageError{fmt.Errorf("--addr %q: %v", f.addr, err)}
	}
	timeout := remote.DefaultBenchTimeout
	if flagSet(fs, "timeout") {
		timeout = f.timeout
	}
	if timeout <= 0 || timeout > remote.MaxBenchTimeout {
		return usageError{fmt.Errorf("--timeout %v: with --addr, want a positive duration of at most %v", timeout, remote.MaxBenchTimeout)}
	}
	nodes := []int{0}
	if flagSet(fs, "nodes") {
		var err error
		if nodes, err = sizeList("nodes", f.nodes); err != nil {
			return usageError{err}
		}
		for _, n := range nodes {
			if n < 2 || n > remote.MaxBenchRanks {
				return usageError{fmt.Errorf("--nodes %d: want 2 to %d (one rank per node of the cluster)", n, remote.MaxBenchRanks)}
			}
			if !sweep && c.Pages >= 1 && n > c.Pages {
				return usageError{fmt.Errorf("--nodes %d: more ranks than the %d pages of a sequence (--pages)", n, c.Pages)}
			}
		}
	}
	// Sizes are checked here as for the local modes, for the largest
	// group asked (2 when every node up: the node checks the rest).
	check := slices.Max(nodes)
	check = max(check, 2)
	var err error
	if sweep {
		sw.Shards, sw.Transport, sw.MaxMemory = []int{check}, "inproc", memlimit.NoLimit
		sw.Steps, sw.Warmup = sweepSteps, sweepWarmup
		if flagSet(fs, "steps") {
			sw.Steps = c.Steps
		}
		if flagSet(fs, "warmup") {
			sw.Warmup = c.Warmup
		}
		err = sw.Validate()
	} else {
		if c.Batches, err = sizeList("batch", f.batches); err != nil {
			return usageError{err}
		}
		c.Shards, c.Transport, c.MaxMemory = []int{check}, "inproc", memlimit.NoLimit
		err = c.Validate()
	}
	if err != nil {
		var re *collective.BenchRangeError
		if errors.As(err, &re) {
			limit := ""
			if re.Limit != "" {
				limit = fmt.Sprintf(" (--%s)", collectiveFlags[re.Limit])
			}
			field := collectiveFlags[re.Field]
			if re.Field == "Shards" {
				field = "nodes"
			}
			return usageError{fmt.Errorf("--%s %d: want %d to %d%s", field, re.Value, re.Min, re.Max, limit)}
		}
		return usageError{err}
	}
	sec, err := f.conn.settings()
	if err != nil {
		return err
	}
	token, err := readTokenFile(f.tokenFile)
	if err != nil {
		return err
	}
	cc, err := dialDecode(f.addr, sec, token)
	if err != nil {
		return err
	}
	defer cc.Close()
	lw := newLineWriter(stdout, stderr, f.asJSON)
	start := time.Now()
	err = addrRun{addr: f.addr, dc: decodev1.NewDecodeClient(cc), nodes: nodes, c: c, sw: sw, sweep: sweep, timeout: timeout,
		emit: lw.collective, emitSweep: lw.sweep, progress: stderr}.run(ctx)
	if err != nil {
		return err
	}
	if !f.asJSON {
		fmt.Fprintf(stderr, "done in %.1fs\n", time.Since(start).Seconds())
	}
	return nil
}
