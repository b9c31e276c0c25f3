package clusterrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/worker/remote"
)

// Transport is the "transport" of the results: gRPC streams between the
// nodes of a running cluster, secured as the cluster is.
const Transport = "cluster"

// Cluster is what a result line adds: the node asked and the nodes that
// ran the ranks, by rank.
type Cluster struct {
	Addr  string   `json:"addr"`
	Nodes []string `json:"nodes"`
}

// ErrRefused is wrapped by Run's error when the node refuses the
// settings (gRPC InvalidArgument).
var ErrRefused = errors.New("bench collective refused by the node")

// refusedError is ErrRefused with its message.
type refusedError struct{ msg string }

func (e refusedError) Error() string        { return e.msg }
func (e refusedError) Is(target error) bool { return target == ErrRefused }

// Config is one run: the node to ask, through Client, and what to run.
type Config struct {
	Addr   string
	Client decodev1.DecodeClient
	// Nodes are the group sizes, one configuration (or sweep) each; 0:
	// every node up.
	Nodes []int
	// Bench is run at each of its Batches, or with IsSweep, Sweep.
	Bench   collective.BenchConfig
	Sweep   collective.SweepConfig
	IsSweep bool
	// Timeout bounds each configuration's run on the nodes.
	Timeout time.Duration
	// Emit and EmitSweep take each result, with whether every rank's
	// streams were encrypted and the nodes that ran it.
	Emit      func(r collective.BenchResult, tls bool, n *Cluster) error
	EmitSweep func(r collective.SweepResult, tls bool, n *Cluster) error
	// Progress takes a line before each configuration.
	Progress io.Writer
}

// Run runs every configuration of c, one BenchCollective call each, and
// emits their results. A node's refusal of the settings wraps
// ErrRefused.
func Run(ctx context.Context, c Config) error {
	a := c
	for _, n := range a.Nodes {
		if a.IsSweep {
			spec := &workerv1.BenchSpec{MinBytes: uint64(a.Sweep.MinBytes), MaxBytes: uint64(a.Sweep.MaxBytes), Factor: uint32(a.Sweep.Factor),
				Steps: uint32(a.Sweep.Steps), Warmup: uint32(a.Sweep.Warmup), TimeoutNs: int64(a.Timeout)}
			fmt.Fprintf(a.Progress, "bench collective --addr %s: all-gather sweep on %s: %d + %d rounds per size over the cluster's streams\n",
				a.Addr, nodesWord(n), a.Sweep.Warmup, a.Sweep.Steps)
			reps, err := a.call(ctx, n, spec)
			if err != nil {
				return err
			}
			samples, err := decode[collective.SweepSamples](a.Addr, reps)
			if err != nil {
				return err
			}
			sw := a.Sweep
			sw.Shards, sw.Transport = []int{len(reps)}, Transport
			res, err := collective.SweepCombine(sw, samples)
			if err != nil {
				return fmt.Errorf("bench collective --addr %s: %w", a.Addr, err)
			}
			tls, cm := clusterOf(a.Addr, reps)
			for _, r := range res {
				r.Processes = len(reps)
				if err := a.EmitSweep(r, tls, cm); err != nil {
					return err
				}
			}
			continue
		}
		for _, b := range a.Bench.Batches {
			c := a.Bench
			spec := &workerv1.BenchSpec{Batch: uint32(b), KvHeads: uint32(c.KVHeads), QHeads: uint32(c.QHeads), HeadDim: uint32(c.HeadDim),
				K: uint32(c.PageBudget), Pages: uint32(c.Pages), Steps: uint32(c.Steps), Warmup: uint32(c.Warmup), Seed: c.Seed,
				TimeoutNs: int64(a.Timeout)}
			fmt.Fprintf(a.Progress, "bench collective --addr %s: %s batch %d: %d + %d layer-steps over the cluster's streams\n",
				a.Addr, nodesWord(n), b, c.Warmup, c.Steps)
			reps, err := a.call(ctx, n, spec)
			if err != nil {
				return err
			}
			samples, err := decode[collective.BenchSamples](a.Addr, reps)
			if err != nil {
				return err
			}
			c.Transport = Transport
			res, err := collective.BenchCombine(c, b, samples)
			if err != nil {
				return fmt.Errorf("bench collective --addr %s: %w", a.Addr, err)
			}
			res.Processes = len(reps)
			tls, cm := clusterOf(a.Addr, reps)
			if err := a.Emit(res, tls, cm); err != nil {
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
func (a Config) call(ctx context.Context, n int, spec *workerv1.BenchSpec) ([]*decodev1.BenchRankReport, error) {
	// The node bounds the run by spec's timeout; this bounds the call
	// too, with room for the nodes to connect and answer.
	cctx, cancel := context.WithTimeout(ctx, a.Timeout+2*remote.DefaultConnectTimeout)
	defer cancel()
	rep, err := a.Client.BenchCollective(cctx, &decodev1.BenchCollectiveRequest{Nodes: uint32(n), Spec: spec})
	if err != nil {
		st := grpcstatus.Convert(err)
		switch {
		case st.Code() == codes.InvalidArgument:
			return nil, refusedError{fmt.Sprintf("bench collective --addr %s: refused: %s", a.Addr, st.Message())}
		case strings.HasPrefix(st.Message(), "bench collective"):
			return nil, fmt.Errorf("bench collective --addr %s: %s: %s", a.Addr, st.Code(), st.Message())
		}
		return nil, fmt.Errorf("bench collective --addr %s: %w", a.Addr, err)
	}
	ranks := rep.GetRanks()
	if n != 0 && len(ranks) != n {
		return nil, fmt.Errorf("bench collective --addr %s: %d ranks answered, want %d", a.Addr, len(ranks), n)
	}
	for i, r := range ranks {
		if int(r.GetRank()) != i {
			return nil, fmt.Errorf("bench collective --addr %s: the reply's rank %d is at %d", a.Addr, r.GetRank(), i)
		}
	}
	if len(ranks) < 2 {
		return nil, errors.New("bench collective --addr: fewer than 2 ranks answered")
	}
	return ranks, nil
}

// clusterOf is the metadata of a run's reports: TLS when every rank's
// streams were encrypted, the node asked and the nodes by rank.
func clusterOf(addr string, reps []*decodev1.BenchRankReport) (bool, *Cluster) {
	tls := true
	cm := &Cluster{Addr: addr}
	for _, r := range reps {
		tls = tls && r.GetTls()
		cm.Nodes = append(cm.Nodes, r.GetNode())
	}
	return tls, cm
}

// decode reads each rank's report as its samples.
func decode[S any](addr string, reps []*decodev1.BenchRankReport) ([]S, error) {
	samples := make([]S, len(reps))
	for i, r := range reps {
		if err := json.Unmarshal(r.GetReport(), &samples[i]); err != nil {
			return nil, fmt.Errorf("bench collective --addr %s: node %s (rank %d) sent a bad report: %w", addr, r.GetNode(), r.GetRank(), err)
		}
	}
	return samples, nil
}
