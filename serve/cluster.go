package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/cluster/coord"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// Cluster holds a server's request sequences on a cluster's workers
// instead of an in-process engine (Config.Cluster). The server calls
// Create from its scheduler goroutine and drives the sequences it
// returns from there and from the quality monitor's goroutine (a fork's
// replay), never one sequence from two goroutines at once; an
// implementation must allow calls on different sequences concurrently.
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
// on its nodes (its pools reserved) while it lives, as the
// coordinator's grids do.
func CoordinatorCluster(co *coord.Coordinator) Cluster { return coordCluster{co} }

type coordCluster struct{ co *coord.Coordinator }

func (c coordCluster) Create(ctx context.Context, ec engine.Config) (model.Sequence, error) {
	cr, err := c.co.Create(ctx, plan.Striped, &ec)
	if err != nil {
		return nil, fmt.Errorf("create a sequence on a %d x %d grid: %w", ec.CP, ec.TP, clusterErr(err))
	}
	return coordSeq{co: c.co, id: cr.ID}, nil
}

// coordSeq is one sequence of a coordinator.
type coordSeq struct {
	co *coord.Coordinator
	id string
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
	return coordSeq{co: s.co, id: id}, nil
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
// shares one grid and the pages admission reserved always fit it.
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
