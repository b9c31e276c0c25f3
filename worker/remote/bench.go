package remote

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/questrt/questrt/api/wire"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/grpctransport"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/worker"
)

// Bounds of a collective benchmark run on the nodes (the worker API's
// OpenBench and RunBench).
const (
	// DefaultBenchTimeout is a run's deadline when its spec gives none.
	DefaultBenchTimeout = time.Minute
	// MaxBenchTimeout is the longest deadline a spec may ask for.
	MaxBenchTimeout = 10 * time.Minute
	// MaxBenchRanks is the most ranks of one run (one per node).
	MaxBenchRanks = 64
)

// benchHandshakeTimeout bounds the handshake of a connection to a bench
// rank's collective listener.
const benchHandshakeTimeout = 3 * time.Second

// BenchRun is one rank's part of a collective benchmark, from a
// BenchSpec: the selection and merge of one batch (Config), or, when
// Sweep is set, a message-size sweep of the plain all-gather
// (SweepConfig), both for a group of Size ranks.
type BenchRun struct {
	Size    int
	Sweep   bool
	Config  collective.BenchConfig
	SweepC  collective.SweepConfig
	Batch   int
	Timeout time.Duration
}

// DecodeBenchSpec checks spec for a group of size ranks against package
// collective's bounds (a *collective.BenchRangeError names the first
// field out of range; every error wraps worker.ErrBadMessage) and
// returns the run it describes. Memory is not checked here: the node
// that runs a rank checks it against its own limit.
func DecodeBenchSpec(spec *workerv1.BenchSpec, size int) (BenchRun, error) {
	bad := func(err error) (BenchRun, error) {
		return BenchRun{}, fmt.Errorf("%w: bench spec: %w", worker.ErrBadMessage, err)
	}
	if spec == nil {
		return bad(errors.New("no spec"))
	}
	if size < 2 || size > MaxBenchRanks {
		return bad(fmt.Errorf("%d ranks: want 2 to %d", size, MaxBenchRanks))
	}
	toInt := func(v uint64) int { return int(min(v, math.MaxInt32)) }
	r := BenchRun{Size: size, Sweep: spec.GetMaxBytes() != 0 || spec.GetMinBytes() != 0 || spec.GetFactor() != 0}
	switch t := spec.GetTimeoutNs(); {
	case t < 0 || time.Duration(t) > MaxBenchTimeout:
		return bad(fmt.Errorf("timeout %v: want at most %v", time.Duration(t), MaxBenchTimeout))
	case t == 0:
		r.Timeout = DefaultBenchTimeout
	default:
		r.Timeout = time.Duration(t)
	}
	if r.Sweep {
		sw := collective.DefaultSweepConfig()
		sw.Shards, sw.Transport, sw.MaxMemory = []int{size}, "inproc", memlimit.NoLimit
		sw.MinBytes, sw.MaxBytes = int64(min(spec.GetMinBytes(), math.MaxInt32)), int64(min(spec.GetMaxBytes(), math.MaxInt32))
		sw.Factor = toInt(uint64(spec.GetFactor()))
		sw.Steps, sw.Warmup = toInt(uint64(spec.GetSteps())), toInt(uint64(spec.GetWarmup()))
		if err := sw.Validate(); err != nil {
			return bad(err)
		}
		r.SweepC = sw
		return r, nil
	}
	c := collective.DefaultBenchConfig()
	c.Shards, c.Transport, c.MaxMemory = []int{size}, "inproc", memlimit.NoLimit
	r.Batch = toInt(uint64(spec.GetBatch()))
	c.Batches = []int{r.Batch}
	c.KVHeads, c.QHeads, c.HeadDim = toInt(uint64(spec.GetKvHeads())), toInt(uint64(spec.GetQHeads())), toInt(uint64(spec.GetHeadDim()))
	c.PageBudget, c.Pages = toInt(uint64(spec.GetK())), toInt(uint64(spec.GetPages()))
	c.Steps, c.Warmup, c.Seed = toInt(uint64(spec.GetSteps())), toInt(uint64(spec.GetWarmup())), spec.GetSeed()
	if err := c.Validate(); err != nil {
		return bad(err)
	}
	r.Config = c
	return r, nil
}

// benchRank is one bench rank opened on this node.
type benchRank struct {
	id       string
	rank     int
	run      BenchRun
	lis      net.Listener
	deadline time.Time // of RunBench
	running  bool
}

// OpenBench implements workerv1.WorkerServer: it checks the caller
// (authorizeBench) and the spec, listens for the rank's collective
// streams and answers the address.
func (s *Server) OpenBench(ctx context.Context, r *workerv1.OpenBenchRequest) (*workerv1.OpenBenchReply, error) {
	id := r.GetBench()
	if err := authorizeBench(ctx, id); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, statusErr(fmt.Errorf("open bench: %w: no bench id", worker.ErrBadMessage))
	}
	run, err := DecodeBenchSpec(r.GetSpec(), int(min(r.GetSize(), math.MaxInt32)))
	if err != nil {
		return nil, statusErr(fmt.Errorf("open bench %q: %w", id, err))
	}
	if int(r.GetRank()) >= run.Size {
		return nil, statusErr(fmt.Errorf("open bench %q: %w: rank %d of %d", id, worker.ErrBadMessage, r.GetRank(), run.Size))
	}
	l, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Host, "0"))
	if err != nil {
		return nil, statusErr(fmt.Errorf("open bench %q: listen: %w", id, err))
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.benchOK(); err != nil {
		l.Close()
		return nil, statusErr(fmt.Errorf("open bench %q: %w", id, err))
	}
	if _, ok := s.benches[id]; ok {
		l.Close()
		return nil, statusErr(fmt.Errorf("open bench %q: %w: exists", id, ErrGridState))
	}
	s.benches[id] = &benchRank{id: id, rank: int(r.GetRank()), run: run, lis: l, deadline: time.Now().Add(s.cfg.ConnectTimeout)}
	return &workerv1.OpenBenchReply{Addr: net.JoinHostPort(s.cfg.Host, port)}, nil
}

// benchOK reports whether the server takes benches (s.mu held), after
// freeing those whose RunBench is overdue.
func (s *Server) benchOK() error {
	if s.closed {
		return fmt.Errorf("worker server: %w", worker.ErrClosed)
	}
	now := time.Now()
	for id, b := range s.benches {
		if !b.running && now.After(b.deadline) {
			s.log.Warn("worker server: freeing a bench that was not run in time", "bench", id, "timeout", s.cfg.ConnectTimeout)
			b.lis.Close()
			delete(s.benches, id)
		}
	}
	return nil
}

// CloseBench implements workerv1.WorkerServer: it frees an opened bench
// that has not begun to run.
func (s *Server) CloseBench(ctx context.Context, r *workerv1.CloseBenchRequest) (*workerv1.Ack, error) {
	if err := authorizeBench(ctx, r.GetBench()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.benches[r.GetBench()]; ok && !b.running {
		b.lis.Close()
		delete(s.benches, b.id)
	}
	return &workerv1.Ack{}, nil
}

// RunBench implements workerv1.WorkerServer: it connects the opened
// rank to its peers over a collective transport configured as the
// grids' are, runs the measured loop and answers the samples.
func (s *Server) RunBench(ctx context.Context, r *workerv1.RunBenchRequest) (*workerv1.RunBenchReply, error) {
	id := r.GetBench()
	if err := authorizeBench(ctx, id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	err := s.benchOK()
	b, ok := s.benches[id]
	switch {
	case err != nil:
	case !ok:
		err = fmt.Errorf("%w: %q (never opened, already run, or not run within %v)", ErrUnknownBench, id, s.cfg.ConnectTimeout)
	case b.running:
		err = fmt.Errorf("%w: bench %q is running", ErrGridState, id)
	case len(r.GetPeers()) != b.run.Size:
		err = fmt.Errorf("%w: %d peer addresses for %d ranks", worker.ErrBadMessage, len(r.GetPeers()), b.run.Size)
	}
	if err != nil {
		s.mu.Unlock()
		return nil, statusErr(fmt.Errorf("run bench: %w", err))
	}
	b.running = true
	s.benchRuns.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.benches, id)
		s.mu.Unlock()
		s.benchRuns.Done()
	}()
	rep, err := s.runBench(ctx, b, r.GetPeers())
	if err != nil {
		what := fmt.Sprintf("run bench %s rank %d of %d", id, b.rank, b.run.Size)
		return nil, statusErr(s.redactPeers(what, fmt.Errorf("%s: %w", what, err)))
	}
	return rep, nil
}

// runBench runs the opened bench b (its listener taken over) with the
// peers' addresses; it ends at the run's deadline, with ctx, or when the
// server closes.
func (s *Server) runBench(ctx context.Context, b *benchRank, peers []string) (*workerv1.RunBenchReply, error) {
	ctx, cancel := context.WithTimeout(ctx, b.run.Timeout)
	defer cancel()
	defer context.AfterFunc(s.benchCtx, cancel)()
	tc := grpctransport.DefaultConfig()
	tc.Group, tc.Rank, tc.Peers, tc.Listener = "bench/"+b.id, b.rank, peers, b.lis
	tc.TLS, tc.Plaintext, tc.Logger = s.cfg.TLS, s.cfg.Plaintext, s.log
	tc.ServerOptions = append(append(tc.ServerOptions, wire.ServerFlowOptions()...), s.cfg.CollectiveServerOptions...)
	// The transport's Close (gRPC's Server.Stop) waits for connections
	// still in their handshake; a bench's peers connect once, at its
	// start, so a later one is stray and need not hold Close for the
	// transport's default 20 s.
	tc.ServerOptions = append(tc.ServerOptions, grpc.ConnectionTimeout(benchHandshakeTimeout))
	tc.DialOptions = append(append(tc.DialOptions, wire.DialFlowOptions()...), s.cfg.CollectiveDialOptions...)
	if b.run.Sweep {
		tc.MaxMessageBytes = max(tc.MaxMessageBytes, int(b.run.SweepC.MaxMsgBytes()))
	}
	// Connecting is bounded like a grid's; the run by its own deadline.
	cctx, ccancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	tr, err := grpctransport.New(cctx, tc)
	ccancel()
	if err != nil {
		b.lis.Close()
		return nil, &peerError{fmt.Errorf("connect: %w", err)}
	}
	defer tr.Close()
	var report any
	if b.run.Sweep {
		sw := b.run.SweepC
		sw.MaxMemory = s.cfg.MemoryLimit
		report, err = collective.SweepRank(ctx, sw, tr)
	} else {
		c := b.run.Config
		c.MaxMemory = s.cfg.MemoryLimit
		report, err = collective.BenchRank(ctx, c, b.run.Batch, tr)
	}
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(report)
	if err != nil {
		return nil, err
	}
	return &workerv1.RunBenchReply{Report: js, Tls: s.cfg.TLS != nil}, nil
}

// BenchNode is a node a collective benchmark runs a rank on: its name,
// its gRPC address and a connection to its worker API.
type BenchNode struct {
	Name, Addr string
	Conn       workerv1.WorkerClient
}

// BenchReport is one rank's answer: RunBenchReply's report and TLS.
type BenchReport struct {
	Rank       int
	Name, Addr string
	Report     []byte
	TLS        bool
}

// benchFailGrace is how long RunGroupBench waits, after a rank's first
// failure, for the others' (the rank that noticed first is often not the
// cause) before it names one and cancels the rest.
const benchFailGrace = 500 * time.Millisecond

// RunGroupBench runs the benchmark spec with rank r on nodes[r]: it opens
// a rank on every node (OpenBench), then runs them all at once
// (RunBench) and returns their reports by rank. It returns only once
// every call it made has returned. On failure the error names a node:
// one that could not be reached (its call failed without an answer from
// it, or it answered UNAVAILABLE for itself) before one whose run failed
// because a peer did, and ErrUnavailable is wrapped when the named node's
// call failed so. A bad spec is refused (worker.ErrBadMessage) before
// any call.
func RunGroupBench(ctx context.Context, id string, spec *workerv1.BenchSpec, nodes []BenchNode) ([]BenchReport, error) {
	run, err := DecodeBenchSpec(spec, len(nodes))
	if err != nil {
		return nil, err
	}
	peers := make([]string, len(nodes))
	for r, nd := range nodes {
		rep, err := nd.Conn.OpenBench(ctx, &workerv1.OpenBenchRequest{Bench: id, Rank: uint32(r), Size: uint32(len(nodes)), Spec: spec})
		if err != nil {
			for _, o := range nodes[:r] {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				o.Conn.CloseBench(cctx, &workerv1.CloseBenchRequest{Bench: id})
				cancel()
			}
			return nil, fmt.Errorf("node %s (%s, rank %d): open bench: %w", nd.Name, nd.Addr, r, FromStatus(err))
		}
		peers[r] = rep.GetAddr()
	}
	// The run's own deadline plus the time to connect and answer.
	rctx, cancel := context.WithTimeout(ctx, run.Timeout+DefaultConnectTimeout)
	defer cancel()
	type answer struct {
		rank int
		rep  *workerv1.RunBenchReply
		err  error
	}
	answers := make(chan answer, len(nodes))
	for r, nd := range nodes {
		go func() {
			rep, err := nd.Conn.RunBench(rctx, &workerv1.RunBenchRequest{Bench: id, Peers: peers})
			answers <- answer{r, rep, err}
		}()
	}
	reports := make([]BenchReport, len(nodes))
	// failures are the calls that failed before this function cancelled
	// the rest (those are only waited for).
	var failures []answer
	var grace <-chan time.Time
	cancelled := false
	for got := 0; got < len(nodes); {
		select {
		case a := <-answers:
			got++
			if a.err != nil {
				if !cancelled || len(failures) == 0 {
					failures = append(failures, a)
				}
				if grace == nil {
					grace = time.After(benchFailGrace)
				}
				continue
			}
			nd := nodes[a.rank]
			reports[a.rank] = BenchReport{Rank: a.rank, Name: nd.Name, Addr: nd.Addr, Report: a.rep.GetReport(), TLS: a.rep.GetTls()}
		case <-grace:
			cancel() // the others end too; their answers are still awaited
			cancelled, grace = true, nil
		}
	}
	if len(failures) == 0 {
		return reports, nil
	}
	blame := failures[0]
	for _, f := range failures {
		if !fromNode(f.err) {
			blame = f
			break
		}
	}
	nd := nodes[blame.rank]
	err = FromStatus(blame.err)
	if !fromNode(blame.err) {
		err = fmt.Errorf("unreachable: %w", err)
	}
	return nil, fmt.Errorf("node %s (%s, rank %d of %d): %w", nd.Name, nd.Addr, blame.rank, len(nodes), err)
}

// BenchID returns a fresh bench id for a run coordinated by name: name,
// '/', a random text. Over TLS a node refuses the bench methods on it to
// any caller but the node certificate of name (authorizeBench).
func BenchID(name string) string { return name + "/" + rand.Text() }
