package serve

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/cluster/coord"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// Cluster holds a server's request sequences on a cluster's workers
// instead of an in-process engine (Config.Cluster). The server calls
// Create from a goroutine of the request's (at most Config.MaxRunning at
// once, so that a grid opening does not stall the scheduler) and drives
// the sequences it returns from its scheduler goroutine and from the
// quality monitor's goroutine (a fork's replay), never one sequence from
// two goroutines at once; an implementation must allow concurrent
// Creates and calls on different sequences concurrently.
type Cluster interface {
	// Create creates an empty sequence laid out by ec: its layers and
	// geometry (the model's), its CP x TP grid (Config.CP, Config.TP),
	// the pages of every rank's pool, the policy and the CP selection
	// mode. ctx bounds the placement and, the first time, the opening of
	// a grid on the cluster's nodes. An error that wraps
	// ErrClusterUnavailable answers the request with 503 and
	// Retry-After.
	Create(ctx context.Context, ec engine.Config) (model.Sequence, error)
}

// ErrClusterUnavailable marks a failure of the cluster rather than of
// the request: no room for the request's grid on the cluster's nodes, a
// node of the grid unreachable or gone, the coordinator closed. A
// request that fails with it gets 503 with Retry-After.
var ErrClusterUnavailable = errors.New("serve: cluster unavailable")

// CoordinatorCluster is the Cluster of a node's coordinator (in process:
// cluster/node.Node.Coordinator). Every sequence is created with
// co.Create (striped placement) on the grid the coordinator places for
// the request's engine config, over the cluster's nodes (rank (0, 0) on
// the coordinator's node when it has room), and driven with co.Append,
// co.Step, co.Fork and co.Release: the model runs here, the KV pages
// live on the grid's workers, and each decode step of a layer is one
// coordinator step (the plan to the workers, the partial states back).
// Requests with the same engine config share a grid, which stays open
// on its nodes (its pools reserved) while the coordinator lives, as the
// coordinator's grids do: the server bounds the grids it opens for
// option sets other than its policy's (Config.PolicyGrids). The
// sequences the coordinator adopts after a node restart (a node's data
// directory) are not the server's; it does not release them.
func CoordinatorCluster(co *coord.Coordinator) Cluster { return coordCluster{co} }

type coordCluster struct{ co *coord.Coordinator }

func (c coordCluster) Create(ctx context.Context, ec engine.Config) (model.Sequence, error) {
	cr, err := c.co.Create(ctx, plan.Striped, &ec)
	if err != nil {
		return nil, fmt.Errorf("create a sequence on a %d x %d grid: %w", ec.CP, ec.TP, clusterErr(err))
	}
	c.releaseAdopted(ctx, cr.ID)
	h, err := c.co.Handle(cr.ID)
	if err != nil {
		return nil, fmt.Errorf("sequence %s: %w", cr.ID, clusterErr(err))
	}
	return coordSeq{co: c.co, id: cr.ID, h: h}, nil
}

// releaseAdopted releases the sequences the coordinator adopted onto
// grids of the config of sequence id, one of the server's just created:
// a grid that opens on nodes restarted on their data directories
// (questd --data-dir) adopts the sequences they persisted, under their
// old ids, and nobody holds those (the server creates every sequence
// afresh and never asks for recovered ones), so they would keep their
// pages on the workers outside the server's admission. Sequences
// adopted onto grids of other configs (the Decode API's clients') are
// left alone. Best effort: a release that fails leaves the sequence
// listed for the next Create to try again.
func (c coordCluster) releaseAdopted(ctx context.Context, id string) {
	rec := c.co.Recovery()
	if len(rec.Sequences) == 0 {
		return
	}
	want, err := c.co.SeqConfig(id)
	if err != nil {
		return
	}
	for _, r := range rec.Sequences {
		if r.ID == id {
			continue
		}
		if got, err := c.co.SeqConfig(r.ID); err == nil && sameGridConfig(got, want) {
			_ = c.co.Release(ctx, r.ID)
		}
	}
}

// sameGridConfig reports whether two of a coordinator's grid configs
// are of the same sequences: the fields a Create's config sets.
func sameGridConfig(a, b engine.Config) bool {
	return a.Layers == b.Layers && a.Geometry == b.Geometry && a.CP == b.CP && a.TP == b.TP &&
		a.CapacityPages == b.CapacityPages && a.Selection == b.Selection && reflect.DeepEqual(a.Policy, b.Policy)
}

// coordSeq is one sequence of a coordinator. Its decode steps run
// batched through the coordinator's Stepper (h is its handle there):
// one engine step per grid and token for every sequence of the batch.
type coordSeq struct {
	co *coord.Coordinator
	id string
	h  decode.SeqID
}

func (s coordSeq) Stepper() decode.Stepper { return clusterStepper{s.co} }

func (s coordSeq) SeqID() decode.SeqID { return s.h }

// clusterStepper is a coordinator's Stepper whose errors say when they
// are the cluster's (ErrClusterUnavailable).
type clusterStepper struct{ co *coord.Coordinator }

func (c clusterStepper) Begin(ctx context.Context, b decode.Batch) (decode.Step, error) {
	st, err := c.co.Begin(ctx, b)
	if err != nil {
		return nil, clusterErr(err)
	}
	return clusterStep{st}, nil
}

type clusterStep struct{ decode.Step }

func (s clusterStep) Layer(ctx context.Context, layer int, q, k, v decode.Tensor, res *decode.Result) error {
	if err := s.Step.Layer(ctx, layer, q, k, v, res); err != nil {
		return clusterErr(err)
	}
	return nil
}

func (s clusterStep) End(ctx context.Context) error {
	if err := s.Step.End(ctx); err != nil {
		return clusterErr(err)
	}
	return nil
}

func (s coordSeq) Append(ctx context.Context, layer int, k, v []float32) error {
	if err := s.co.Append(ctx, s.id, layer, k, v); err != nil {
		return fmt.Errorf("sequence %s: %w", s.id, clusterErr(err))
	}
	return nil
}

func (s coordSeq) Step(ctx context.Context, layer int, r engine.Request, opt engine.StepOptions, res *engine.Result) error {
	if err := s.co.Step(ctx, layer, []coord.StepItem{{Seq: s.id, Request: r}}, opt, res); err != nil {
		return fmt.Errorf("sequence %s: %w", s.id, clusterErr(err))
	}
	return nil
}

func (s coordSeq) ForkSequence(ctx context.Context) (model.Sequence, error) {
	id, err := s.co.Fork(ctx, s.id)
	if err != nil {
		return nil, fmt.Errorf("fork sequence %s: %w", s.id, clusterErr(err))
	}
	h, err := s.co.Handle(id)
	if err != nil {
		return nil, fmt.Errorf("fork sequence %s: %w", s.id, clusterErr(err))
	}
	return coordSeq{co: s.co, id: id, h: h}, nil
}

func (s coordSeq) Release(ctx context.Context) error {
	if err := s.co.Release(ctx, s.id); err != nil {
		return fmt.Errorf("release sequence %s: %w", s.id, clusterErr(err))
	}
	return nil
}

// clusterErr marks err with ErrClusterUnavailable when it is the
// cluster's failure.
func clusterErr(err error) error {
	for _, e := range []error{coord.ErrGridLost, coord.ErrClosed, remote.ErrUnavailable, remote.ErrNodeFull, remote.ErrUnknownGrid, cluster.ErrNoCapacity} {
		if errors.Is(err, e) {
			return fmt.Errorf("%w: %w", ErrClusterUnavailable, err)
		}
	}
	return err
}

// clusterUnavailable is the 503 of a request the cluster could not run.
func (s *Server) clusterUnavailable(err error) *apiError {
	s.log.Warn("cluster unavailable", "err", err)
	return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "cluster_unavailable", retry: s.cfg.RetryAfter,
		message: "The cluster cannot run the request's attention grid now; retry later: " + err.Error()}
}

// countedSeq is a cluster sequence the server holds, counted in n (the
// Stats' EngineSequences of a server on a cluster).
type countedSeq struct {
	model.Sequence
	n *atomic.Int64
}

// Stepper and SeqID forward the inner sequence's, when it has them (nil
// otherwise: it decodes one step per layer).
func (s countedSeq) Stepper() decode.Stepper {
	if ss, ok := s.Sequence.(model.StepperSequence); ok {
		return ss.Stepper()
	}
	return nil
}

func (s countedSeq) SeqID() decode.SeqID {
	if ss, ok := s.Sequence.(model.StepperSequence); ok {
		return ss.SeqID()
	}
	return 0
}

func (s countedSeq) ForkSequence(ctx context.Context) (model.Sequence, error) {
	f, err := s.Sequence.ForkSequence(ctx)
	if err != nil {
		return nil, err
	}
	s.n.Add(1)
	return countedSeq{Sequence: f, n: s.n}, nil
}

// Release frees the sequence; it is no longer counted, whatever the
// cluster answers (nobody releases it again).
func (s countedSeq) Release(ctx context.Context) error {
	s.n.Add(-1)
	return s.Sequence.Release(ctx)
}

// createClusterSeq creates j's sequence on the cluster: the request's
// policy (the serving policy, or its own selection options) on the
// server's CP x TP grid, with pools of CapacityPages pages per rank
// (plus the monitor's slack), so that every request of one policy
// shares one grid and the pages admission reserved always fit it. (A
// grid of a request's own options is not sized by its reservation: the
// coordinator keys grids by their pools and closes none while it runs,
// so every distinct reservation would keep a grid of its own open.) It
// runs on the goroutine startCreate starts.
func (s *Server) createClusterSeq(ctx context.Context, j *job) (model.Sequence, error) {
	pol := s.cfg.Policy
	if j.p.own {
		pol = j.p.sel
	}
	seq, err := s.cfg.Cluster.Create(ctx, s.engineConfig(pol, s.cfg.CapacityPages+s.monitorSlack()))
	if err != nil {
		return nil, err
	}
	s.clusterSeqs.Add(1)
	if j.p.own {
		s.count(func(st *Stats) { st.OwnEngines++ })
	}
	return countedSeq{Sequence: seq, n: &s.clusterSeqs}, nil
}

// gridKey is a selection option set, the part of a request's policy
// that may differ from the serving policy's (params.own).
type gridKey struct {
	selector    plan.Selector
	gqa         plan.GQAMode
	sink, local int
}

func gridKeyOf(p plan.Policy) gridKey {
	return gridKey{selector: p.Selector, gqa: p.GQA, sink: p.SinkPages, local: p.LocalPages}
}

// policyGrid is an option set's grid on the cluster (Server.grids).
type policyGrid struct {
	opened  bool // a sequence was created on it: it stays open
	pending int  // admitted jobs whose sequence is not created yet
}

// holdGrid, at j's admission (s.mu held), counts j on the grid of its
// own options on the cluster, or refuses it with 429 when that grid is
// not open and PolicyGrids are already open or opening. The cluster's
// coordinator closes no grid while it runs, so without the bound every
// distinct option set would reserve a pool per rank for good.
func (s *Server) holdGrid(j *job) *apiError {
	if s.cfg.Cluster == nil || !j.p.own {
		return nil
	}
	k := gridKeyOf(j.p.sel)
	g := s.grids[k]
	if g == nil {
		if len(s.grids) >= s.cfg.PolicyGrids {
			return &apiError{status: http.StatusTooManyRequests, typ: typeRateLimit, code: "policy_grid_limit", retry: s.cfg.RetryAfter,
				message: fmt.Sprintf("The request's selection options (selector %s, gqa %s, sink %d, local %d) need a grid of their own on the cluster, "+
					"and the server is at its limit of %d such grids (serve.Config.PolicyGrids, questd --serve-policy-grids), which stay open; "+
					"use the server's options or those of a grid already open, or retry later.",
					j.p.sel.Selector, j.p.sel.GQA, j.p.sel.SinkPages, j.p.sel.LocalPages, s.cfg.PolicyGrids)}
		}
		g = &policyGrid{}
		s.grids[k] = g
	}
	g.pending++
	j.grid = g
	return nil
}

// settleGrid (s.mu held) takes j off its grid's pending jobs, once: the
// grid is open for good when j's sequence was created on it, forgotten
// when no sequence ever was and no other job is waiting for one.
func (s *Server) settleGrid(j *job, created bool) {
	g := j.grid
	if g == nil {
		return
	}
	j.grid = nil
	g.pending--
	if created {
		g.opened = true
	}
	if !g.opened && g.pending == 0 {
		maps.DeleteFunc(s.grids, func(_ gridKey, x *policyGrid) bool { return x == g })
	}
}

// madeSeq is the outcome of a job's Create, for the scheduler.
type madeSeq struct {
	j   *job
	seq model.Sequence
	err error
}

// startCreate creates j's cluster sequence on a goroutine of its own
// (owned by s.creates): the scheduler takes the outcome at an iteration
// boundary (takeCreated), or, when j ended meanwhile, the goroutine
// releases the sequence itself. j's context bounds the Create; j's end
// cancels it. A wake-up on that context's end lets the scheduler end j
// even when Create does not return at once.
func (s *Server) startCreate(j *job) {
	j.creating = true
	j.stopWake = context.AfterFunc(j.ctx, s.poke)
	s.creates.Add(1)
	go func() {
		defer s.creates.Done()
		seq, err := s.createClusterSeq(j.ctx, j)
		s.mu.Lock()
		s.settleGrid(j, err == nil)
		left := j.left
		if !left {
			s.made = append(s.made, madeSeq{j: j, seq: seq, err: err})
		}
		s.mu.Unlock()
		if left {
			if seq != nil {
				s.releaseSeq(j, seq)
			}
			return
		}
		s.poke()
	}()
}

// takeCreated hands the created sequences to their jobs (on the
// scheduler goroutine): a job that ended meanwhile releases its
// sequence, a failed Create ends its job. It reports whether there
// were any.
func (s *Server) takeCreated() bool {
	s.mu.Lock()
	made := s.made
	s.made = nil
	s.mu.Unlock()
	for _, m := range made {
		j := m.j
		j.creating = false
		if j.stopWake != nil {
			j.stopWake()
			j.stopWake = nil
		}
		switch {
		case j.ended:
			if m.seq != nil {
				s.releaseSeq(j, m.seq)
			}
		case m.err != nil:
			s.end(j, nil, s.stepError(j, m.err), "")
		default:
			j.cseq = m.seq
		}
	}
	return len(made) > 0
}

// waitCreates, when the scheduler stops (every job ended, so every
// Create's context is done), waits for the Creates in flight and
// releases the sequences no job took.
func (s *Server) waitCreates() {
	s.creates.Wait()
	s.takeCreated()
}

// releaseSeq releases a cluster sequence of j's that j no longer holds.
func (s *Server) releaseSeq(j *job, seq model.Sequence) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := seq.Release(ctx); err != nil {
		s.log.Warn("release sequence", "request", j.id, "err", err)
	}
}

// releaseTimeout bounds the release of a sequence nobody waits for.
const releaseTimeout = 10 * time.Second

// poke wakes the scheduler.
func (s *Server) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
