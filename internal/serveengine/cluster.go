package serveengine

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker/remote"
)

// CoordinatorCluster is the completion.Cluster of a node's coordinator (in
// process: node.Node.Coordinator). Every sequence is created with
// co.Create (striped placement) on the grid the coordinator places for
// the request's grid (EngineConfig), over the cluster's nodes (rank (0, 0) on
// the coordinator's node when it has room), and driven with co.Append,
// co.Step, co.Fork and co.Release: the model runs here, the KV pages
// live on the grid's workers, and each decode step of a layer is one
// coordinator step (the plan to the workers, the partial states back).
// Requests with the same engine config share a grid, which stays open
// on its nodes (its pools reserved) while the coordinator lives, as the
// coordinator's grids do: the server bounds the grids it opens for
// option sets other than its policy's (completion.Config.PolicyGrids). The
// sequences the coordinator adopts after a node restart (a node's data
// directory) are not the server's; it does not release them. It is a
// completion.ClusterCapacity: the nodes it reports are those the coordinator
// may place a grid on now (co.Placeable), with the free pages their
// membership metadata advertises, so that a pool of 0 pages is sized
// from them, and followed as the membership changes (completion.Config.
// ClusterResize): the pages of the grids it opened for the server count
// as free on their nodes (the server's own), those of every other grid
// (another coordinator's, a Decode API client's) as taken.
func CoordinatorCluster(co *coord.Coordinator) completion.Cluster { return &coordCluster{co: co} }

type coordCluster struct {
	co *coord.Coordinator
	mu sync.Mutex
	// own are the configs of the grids sequences were created on
	// through this Cluster (one per pool size and option set).
	own []engine.Config
}

var _ completion.ClusterCapacity = (*coordCluster)(nil)

// RankPages reports the nodes the coordinator may place a grid on now,
// their free pages and the pages each of ranks ranks can reserve on them
// (completion.ClusterCapacity): PerRank with the pools of the server's own
// open grids counted free on their nodes, Open beside them, Held the
// largest of those pools.
func (c *coordCluster) RankPages(ctx context.Context, ranks int) (completion.NodeCapacity, error) {
	nodes, err := c.co.Placeable(ctx)
	if err != nil {
		return completion.NodeCapacity{}, err
	}
	open := cluster.RankPages(nodes, ranks)
	held := c.co.Reserved(c.isOwn)
	if len(held) > 0 {
		with := make([]cluster.NodeInfo, len(nodes))
		for i, n := range nodes {
			n.FreePages += held[n.Name]
			with[i] = n
		}
		nodes = with
	}
	nc := NodeCapacity(nodes, ranks)
	nc.Open = open
	nc.Held = uint64(c.co.LargestPool(c.isOwn))
	return nc, nil
}

// isOwn reports whether ec is the config of a grid this Cluster created
// a sequence on.
func (c *coordCluster) isOwn(ec engine.Config) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(c.own, func(o engine.Config) bool { return sameGridConfig(o, ec) })
}

// remember records ec as the config of one of the server's grids.
func (c *coordCluster) remember(ec engine.Config) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.ContainsFunc(c.own, func(o engine.Config) bool { return sameGridConfig(o, ec) }) {
		c.own = append(c.own, ec)
	}
}

// NodeCapacity sums nodes' free pages and sizes ranks equal ranks on
// them by placement's rule (cluster.RankPages); Open is PerRank (the
// caller sets it when some of the pages are its own).
func NodeCapacity(nodes []cluster.NodeInfo, ranks int) completion.NodeCapacity {
	nc := completion.NodeCapacity{Nodes: len(nodes), PerRank: cluster.RankPages(nodes, ranks)}
	for _, n := range nodes {
		nc.FreePages += n.FreePages
	}
	nc.Open = nc.PerRank
	return nc
}

func (c *coordCluster) Create(ctx context.Context, spec completion.GridSpec) (model.Sequence, error) {
	ec := EngineConfig(spec)
	cr, err := c.co.Create(ctx, plan.Striped, &ec)
	if err == nil {
		if got, cerr := c.co.SeqConfig(cr.ID); cerr == nil {
			c.remember(got)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("create a sequence on a %d x %d grid: %w", ec.CP, ec.TP, ClusterError(err))
	}
	c.releaseAdopted(ctx, cr.ID)
	h, err := c.co.Handle(cr.ID)
	if err != nil {
		return nil, fmt.Errorf("sequence %s: %w", cr.ID, ClusterError(err))
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
func (c *coordCluster) releaseAdopted(ctx context.Context, id string) {
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
// are the cluster's (completion.ErrClusterUnavailable).
type clusterStepper struct{ co *coord.Coordinator }

func (c clusterStepper) Begin(ctx context.Context, b decode.Batch) (decode.Step, error) {
	st, err := c.co.Begin(ctx, b)
	if err != nil {
		return nil, ClusterError(err)
	}
	return clusterStep{st}, nil
}

type clusterStep struct{ decode.Step }

func (s clusterStep) Layer(ctx context.Context, layer int, q, k, v decode.Tensor, res *decode.Result) error {
	if err := s.Step.Layer(ctx, layer, q, k, v, res); err != nil {
		return ClusterError(err)
	}
	return nil
}

func (s clusterStep) End(ctx context.Context) error {
	if err := s.Step.End(ctx); err != nil {
		return ClusterError(err)
	}
	return nil
}

func (s coordSeq) Append(ctx context.Context, layer int, k, v []float32) error {
	if err := s.co.Append(ctx, s.id, layer, k, v); err != nil {
		return fmt.Errorf("sequence %s: %w", s.id, ClusterError(err))
	}
	return nil
}

// StepLayer implements model.LayerStepper: a step of one layer for this
// sequence alone through the coordinator's Step (which runs
// diagnostics inside the step).
func (s coordSeq) StepLayer(ctx context.Context, layer int, row decode.Row, q, k, v []float32, opt decode.Options, res *decode.Result) error {
	r := engine.Request{Q: q, K: k, V: v, BudgetTokens: row.Budget, DenseLayers: row.DenseLayers}
	err := engine.StepInto(res, func(er *engine.Result) error {
		return s.co.Step(ctx, layer, []coord.StepItem{{Seq: s.id, Request: r}}, opt, er)
	})
	if err != nil {
		return fmt.Errorf("sequence %s: %w", s.id, ClusterError(err))
	}
	return nil
}

func (s coordSeq) ForkSequence(ctx context.Context) (model.Sequence, error) {
	id, err := s.co.Fork(ctx, s.id)
	if err != nil {
		return nil, fmt.Errorf("fork sequence %s: %w", s.id, ClusterError(err))
	}
	h, err := s.co.Handle(id)
	if err != nil {
		return nil, fmt.Errorf("fork sequence %s: %w", s.id, ClusterError(err))
	}
	return coordSeq{co: s.co, id: id, h: h}, nil
}

// Rollback drops the last n tokens of every layer (a prefix cache's
// entry is a fork of a prompt's sequence rolled back to its last full
// page: model.EngineAttention.ForkPrefix).
func (s coordSeq) Rollback(ctx context.Context, n int) error {
	if err := s.co.Rollback(ctx, s.id, n); err != nil {
		return fmt.Errorf("roll back sequence %s: %w", s.id, ClusterError(err))
	}
	return nil
}

// GridLost reports whether the sequence's grid is lost (its pages gone
// with it): the coordinator's record, no call to the workers.
func (s coordSeq) GridLost() bool {
	_, err := s.co.SeqConfig(s.id)
	return errors.Is(err, coord.ErrGridLost)
}

func (s coordSeq) Release(ctx context.Context) error {
	if err := s.co.Release(ctx, s.id); err != nil {
		return fmt.Errorf("release sequence %s: %w", s.id, ClusterError(err))
	}
	return nil
}

// ClusterError marks err, an error of a coordinator's, with
// completion.ErrClusterUnavailable when it is the cluster's failure (a node
// unreachable or full, a grid unknown or lost, no capacity, the
// coordinator closed), with completion.ErrGridLost too when it is a grid's
// loss, and with completion.ErrClusterFull too when it is a want of pages
// on the nodes: the errors the server answers with 503 or retries.
func ClusterError(err error) error {
	if errors.Is(err, coord.ErrGridLost) && !errors.Is(err, coord.ErrClosed) {
		return fmt.Errorf("%w: %w: %w", completion.ErrClusterUnavailable, completion.ErrGridLost, err)
	}
	if errors.Is(err, remote.ErrNodeFull) || errors.Is(err, cluster.ErrNoCapacity) {
		return fmt.Errorf("%w: %w: %w", completion.ErrClusterUnavailable, completion.ErrClusterFull, err)
	}
	for _, e := range []error{coord.ErrGridLost, coord.ErrClosed, remote.ErrUnavailable, remote.ErrUnknownGrid} {
		if errors.Is(err, e) {
			return fmt.Errorf("%w: %w", completion.ErrClusterUnavailable, err)
		}
	}
	return err
}
