package completion

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
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
	// Create creates an empty sequence laid out by spec: its layers and
	// geometry (the model's), its CP x TP grid (Config.CP, Config.TP),
	// the pages of every rank's pool, the policy and the CP selection
	// mode. ctx bounds the placement and, the first time, the opening of
	// a grid on the cluster's nodes. An error that wraps
	// ErrClusterUnavailable answers the request with 503 and
	// Retry-After. An error of a sequence's operation that wraps
	// ErrGridLost says that the sequence is gone with its grid: the
	// server may create a new one for the request (Config.GridRetries).
	Create(ctx context.Context, spec GridSpec) (model.Sequence, error)
}

// ErrClusterUnavailable marks a failure of the cluster rather than of
// the request: no room for the request's grid on the cluster's nodes, a
// node of the grid unreachable or gone, the coordinator closed. A
// request that fails with it gets 503 with Retry-After.
var ErrClusterUnavailable = errors.New("serve: cluster unavailable")

// ErrGridLost marks, beside ErrClusterUnavailable, the failure of a
// sequence whose grid lost a node (coord.ErrGridLost: a node killed,
// restarted or unreachable, a missed step deadline): the sequence's
// pages are gone, through no fault of the request's, and a new sequence
// on a new grid may run it (Config.GridRetries).
var ErrGridLost = errors.New("serve: the sequence's grid was lost")

// ErrClusterFull marks, beside ErrClusterUnavailable, a failure for
// want of pages on the cluster's nodes: placement found no room for the
// grid (cluster.ErrNoCapacity), or a node refused its pools
// (remote.ErrNodeFull). Several coordinators that serve on one cluster
// (two questd with --serve-layout cluster on the same nodes) size their
// pools from the same free pages, and the first to open its grids gets
// them: the others' requests fail with it (503 "cluster_unavailable",
// whose message names the cause) until their pools follow the pages
// left (Config.ClusterResize).
var ErrClusterFull = errors.New("serve: no room on the cluster's nodes")

// clusterUnavailable is the 503 of a request the cluster could not run.
func (s *Server) clusterUnavailable(err error) *apiError {
	s.log.Warn("cluster unavailable", "err", err)
	if errors.Is(err, ErrClusterFull) {
		return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "cluster_unavailable", retry: s.cfg.RetryAfter,
			message: "The cluster's nodes have no room for the request's attention grid now: their pages are reserved by other grids " +
				"(another coordinator's, such as a second questd serving on these nodes, which takes them first come, first served; " +
				"or this server's grids of an earlier pool size until they close idle); retry later: " + err.Error()}
	}
	return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "cluster_unavailable", retry: s.cfg.RetryAfter,
		message: "The cluster cannot run the request's attention grid now; retry later: " + err.Error()}
}

// countedSeq is a cluster sequence the server holds, counted in n (the
// Stats' EngineSequences of a server on a cluster).
type countedSeq struct {
	model.Sequence
	n *atomic.Int64
}

// StepLayer forwards the inner sequence's one-layer step
// (model.LayerStepper: a coordinator's sequences have one).
func (s countedSeq) StepLayer(ctx context.Context, layer int, row decode.Row, q, k, v []float32, opt decode.Options, res *decode.Result) error {
	ls, ok := s.Sequence.(model.LayerStepper)
	if !ok {
		return fmt.Errorf("step layer %d: the cluster's sequence (%T) has no one-layer step", layer, s.Sequence)
	}
	return ls.StepLayer(ctx, layer, row, q, k, v, opt, res)
}

func (s countedSeq) ForkSequence(ctx context.Context) (model.Sequence, error) {
	f, err := s.Sequence.ForkSequence(ctx)
	if err != nil {
		return nil, err
	}
	s.n.Add(1)
	return countedSeq{Sequence: f, n: s.n}, nil
}

// Rollback forwards the inner sequence's, when it has one.
func (s countedSeq) Rollback(ctx context.Context, n int) error {
	r, ok := s.Sequence.(interface {
		Rollback(ctx context.Context, n int) error
	})
	if !ok {
		return fmt.Errorf("roll back %d tokens: the cluster's sequence (%T) cannot roll back", n, s.Sequence)
	}
	return r.Rollback(ctx, n)
}

// GridLost forwards the inner sequence's (a sequence without one is
// never lost: its failures say so).
func (s countedSeq) GridLost() bool {
	g, ok := s.Sequence.(gridLoser)
	return ok && g.GridLost()
}

// gridLoser is a cluster sequence that can tell whether its grid is
// lost without asking the workers (coordSeq).
type gridLoser interface{ GridLost() bool }

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
// runs on the goroutine startCreate starts. For a retry (j's grid was
// lost) it creates again while the cluster answers unavailable, for
// GridRetryWait at most: a killed node stays in the membership view,
// and placement may choose it, until the view declares it dead.
func (s *Server) createClusterSeq(ctx context.Context, j *job, retry bool) (model.Sequence, error) {
	pol := s.cfg.Policy
	if j.p.own {
		pol = j.p.sel
	}
	gs := s.gridSpec(pol, s.capacity()+s.monitorSlack())
	seq, err := s.cfg.Cluster.Create(ctx, gs)
	if retry {
		deadline := time.Now().Add(s.cfg.GridRetryWait)
		for wait := 50 * time.Millisecond; err != nil && errors.Is(err, ErrClusterUnavailable) && time.Now().Add(wait).Before(deadline); wait = min(2*wait, time.Second) {
			s.log.Debug("a retried request's new grid is unavailable; creating again", "request", j.id, "in", wait, "err", err)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("%w (waiting to create again: %w)", err, context.Cause(ctx))
			case <-t.C:
			}
			seq, err = s.cfg.Cluster.Create(ctx, gs)
		}
	}
	if err != nil {
		return nil, err
	}
	s.clusterSeqs.Add(1)
	if j.p.own && !retry {
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
					"and the server is at its limit of %d such grids (completion.Config.PolicyGrids, questd --serve-policy-grids), which stay open; "+
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
	retry := j.retries > 0 || j.requeued
	go func() {
		defer s.creates.Done()
		seq, err := s.createClusterSeq(j.ctx, j, retry)
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
