package remote

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// closeTimeout bounds the CloseGrid calls that clean up after a failed
// OpenGrid, on a context detached from the caller's.
const closeTimeout = 2 * time.Second

// Client is the coordinator's worker.Worker for the ranks one node hosts
// of one grid, over the node's worker API. Every call passes its ctx to
// gRPC; errors are rebuilt with [FromStatus], so they wrap the worker
// sentinels the node's error wrapped, and ErrUnavailable when the node is
// unreachable or answered UNAVAILABLE. It is safe for concurrent use (the
// node serializes the grid's calls).
type Client struct {
	api       workerv1.WorkerClient
	ref       *workerv1.GridRef
	geo       geometry
	recovered []worker.RecoveredSeq // by ConnectGrid (see Recovered)
	// notRecovered: by ConnectGrid (see NotRecovered).
	notRecovered NotRecovered
	// calls runs the decode steps' BeginStep, Layer and EndStep calls
	// on one Calls stream, kept from step to step until CloseGrid.
	calls *callStream
}

var _ worker.AheadWorker = (*Client)(nil)

// NewClient returns the client of grid ref on the node behind conn; cfg
// is the grid's config (its geometry shapes the tensors). The grid must
// be open and connected on the node (see [OpenGrid]).
func NewClient(conn grpc.ClientConnInterface, ref GridRef, cfg worker.Config) *Client {
	return &Client{api: workerv1.NewWorkerClient(conn), ref: ref.proto(), geo: geometryOf(cfg), calls: newCallStream(conn, MaxReplyElements(cfg))}
}

// Ref returns the client's grid.
func (c *Client) Ref() GridRef { return GridRef{Grid: c.ref.Grid, View: c.ref.View} }

// Create implements worker.Worker.
func (c *Client) Create(ctx context.Context, m worker.CreateRequest) error {
	e := &enc{what: "create request"}
	r := &workerv1.CreateRequest{Ref: c.ref, Seq: m.Seq, Layout: encodeLayout(e, m.Layout)}
	if e.err != nil {
		return e.err
	}
	_, err := c.api.Create(ctx, r)
	return FromStatus(err)
}

// Fork implements worker.Worker.
func (c *Client) Fork(ctx context.Context, m worker.ForkRequest) error {
	_, err := c.api.Fork(ctx, &workerv1.ForkRequest{Ref: c.ref, Parent: m.Parent, Child: m.Child})
	return FromStatus(err)
}

// Release implements worker.Worker.
func (c *Client) Release(ctx context.Context, m worker.ReleaseRequest) error {
	_, err := c.api.Release(ctx, &workerv1.ReleaseRequest{Ref: c.ref, Seq: m.Seq})
	return FromStatus(err)
}

// Check implements worker.Worker.
func (c *Client) Check(ctx context.Context, m worker.CheckRequest) error {
	r, err := encodeCheck(c.ref, m)
	if err != nil {
		return err
	}
	_, err = c.api.Check(ctx, r)
	return FromStatus(err)
}

// Append implements worker.Worker.
func (c *Client) Append(ctx context.Context, m worker.AppendRequest) error {
	r, err := encodeAppend(c.ref, c.geo, m)
	if err != nil {
		return err
	}
	_, err = c.api.Append(ctx, r)
	return FromStatus(err)
}

// Rollback implements worker.Worker.
func (c *Client) Rollback(ctx context.Context, m worker.RollbackRequest) (worker.RollbackReply, error) {
	r, err := encodeRollback(c.ref, c.geo, m)
	if err != nil {
		return worker.RollbackReply{}, err
	}
	rep, err := c.api.Rollback(ctx, r)
	if err != nil {
		return worker.RollbackReply{}, FromStatus(err)
	}
	out, err := decodeRollbackReply(c.geo, rep)
	if err != nil {
		// The node rolled back: the sequence's ranks may now disagree.
		return worker.RollbackReply{}, fmt.Errorf("%w: %w", worker.ErrChanged, err)
	}
	return out, nil
}

// BeginStep implements worker.Worker.
func (c *Client) BeginStep(ctx context.Context, m worker.BeginRequest) error {
	r, err := encodeBegin(c.ref, m)
	if err != nil {
		return err
	}
	err = c.calls.invoke(ctx, workerv1.Worker_BeginStep_FullMethodName, r, new(workerv1.Ack))
	return FromStatus(err)
}

// BeginsAhead implements worker.AheadWorker: true unless the node is
// this process (a local connection, whose calls are direct).
func (c *Client) BeginsAhead() bool { return !c.calls.local }

// BeginStepAhead implements worker.AheadWorker: BeginStep sent on the
// grid's kept Calls stream without waiting for its answer, which the
// step's next call (its first Layer) reads before its own. The first
// step of a stream (none kept yet) waits as BeginStep does.
func (c *Client) BeginStepAhead(ctx context.Context, m worker.BeginRequest) func(context.Context) error {
	r, err := encodeBegin(c.ref, m)
	if err != nil {
		return func(context.Context) error { return err }
	}
	wait := c.calls.ahead(ctx, workerv1.Worker_BeginStep_FullMethodName, r, new(workerv1.Ack))
	return func(ctx context.Context) error { return FromStatus(wait(ctx)) }
}

// Layer implements worker.Worker. It fills rep, reusing its slices; when
// the call fails, rep.Ranks still says which ranks took which new tokens
// (Appended), as far as the node answered. A call with new tokens that
// got no answer from the node (a lost connection, the deadline) wraps
// worker.ErrChanged: the tokens may or may not be in.
func (c *Client) Layer(ctx context.Context, m worker.LayerRequest, rep *worker.LayerReply) error {
	// Until the node says otherwise, no rank took anything.
	rep.Ranks = resizeOutputs(rep.Ranks, len(m.Ranks))
	for k, in := range m.Ranks {
		rep.Ranks[k].Rank, rep.Ranks[k].Appended = in.Rank, 0
	}
	r, err := encodeLayer(c.ref, c.geo, m)
	if err != nil {
		return err
	}
	var trailer metadata.MD
	out := new(workerv1.LayerReply)
	err = c.calls.invoke(ctx, workerv1.Worker_Layer_FullMethodName, r, out, grpc.Trailer(&trailer))
	if err != nil {
		if !fromNode(err) && carriesTokens(m) {
			// No answer: the node may have taken the new tokens or not.
			return fmt.Errorf("%w: new tokens' fate unknown: %w", worker.ErrChanged, FromStatus(err))
		}
		return FromStatus(err)
	}
	derr := decodeLayerReply(c.geo, out, rep)
	if out.ErrorCode != uint32(codes.OK) {
		st := status.New(codes.Code(out.ErrorCode), out.ErrorMessage)
		if v := trailer.Get(layerTrailer); len(v) > 0 {
			var p spb.Status
			if proto.Unmarshal([]byte(v[0]), &p) == nil {
				st = status.FromProto(&p)
			}
		}
		return errors.Join(FromStatus(st.Err()), derr)
	}
	if derr != nil {
		return derr
	}
	return nil
}

// carriesTokens reports whether a layer request brings new tokens.
func carriesTokens(m worker.LayerRequest) bool {
	for _, in := range m.Ranks {
		if len(in.K) > 0 || len(in.MirrorK) > 0 {
			return true
		}
	}
	return false
}

// EndStep implements worker.Worker.
func (c *Client) EndStep(ctx context.Context, m worker.EndRequest) error {
	r, err := encodeEnd(c.ref, m)
	if err != nil {
		return err
	}
	// The stream stays open for the grid's next step.
	err = c.calls.invoke(ctx, workerv1.Worker_EndStep_FullMethodName, r, new(workerv1.Ack))
	return FromStatus(err)
}

// ErrPageType is OpenGrid's error when a node would store a grid's pages
// in another type than the grid's config names: an fp8 grid on a node
// whose worker predates the page type on the wire (it ignores
// GridConfig.kv_dtype, stores f32 and answers ""), or a type the reply
// does not name.
var ErrPageType = errors.New("node stores another page type")

// checkPageType checks a node's OpenGridReply.kv_dtype (got) against the
// grid's storage type want: an fp8 grid needs "fp8". An f32 grid takes
// any type the node names (a device-resident node stores its devices'
// type, as it did before the field).
func checkPageType(want plan.DType, got string) error {
	if want == plan.Float32 {
		return nil
	}
	have, err := parseWireDType(got)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrPageType, err)
	case have != want:
		return fmt.Errorf("%w: the grid's pages are %v, the node stores %v (a questd older than the page type on the worker wire stores f32: upgrade it, or serve f32 pages)", ErrPageType, want, have)
	}
	return nil
}

// NodeRanks is a node that hosts ranks of a grid: the connection to its
// worker API and the ranks.
type NodeRanks struct {
	Conn  grpc.ClientConnInterface
	Ranks []worker.Rank
	// Name is the node's name, recorded per rank with the sequences a
	// persisting node keeps (worker.Config.Placement); OpenGrid sends the
	// placement when every node has one.
	Name string
}

// OpenGrid opens grid ref with config cfg on the given nodes, which must
// host every rank of cfg's TP x CP grid exactly once between them: it
// calls OpenGrid on every node, then ConnectGrid on all of them at once
// with every rank's collective address, and returns one client per node,
// in node order. On any failure it sends CloseGrid to every node whose
// OpenGrid succeeded (on a short context detached from ctx) and returns
// the error; a node that opened the grid without answering frees it
// after its ConnectTimeout.
func OpenGrid(ctx context.Context, nodes []NodeRanks, ref GridRef, cfg worker.Config) ([]*Client, error) {
	where := make(map[worker.Rank]int)
	for i, n := range nodes {
		if n.Conn == nil || len(n.Ranks) == 0 {
			return nil, fmt.Errorf("open grid %s: %w: node %d has no connection or no ranks", ref.Grid, worker.ErrBadMessage, i)
		}
		for _, r := range n.Ranks {
			if r.TP < 0 || r.TP >= cfg.TP || r.CP < 0 || r.CP >= cfg.CP {
				return nil, fmt.Errorf("open grid %s: %w: node %d: rank %v outside the %d x %d grid", ref.Grid, worker.ErrBadMessage, i, r, cfg.TP, cfg.CP)
			}
			if j, dup := where[r]; dup {
				return nil, fmt.Errorf("open grid %s: %w: rank %v on nodes %d and %d", ref.Grid, worker.ErrBadMessage, r, j, i)
			}
			where[r] = i
		}
	}
	if len(where) != cfg.TP*cfg.CP {
		return nil, fmt.Errorf("open grid %s: %w: the nodes host %d of the %d ranks", ref.Grid, worker.ErrBadMessage, len(where), cfg.TP*cfg.CP)
	}
	gc, err := encodeConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("open grid %s: %w", ref.Grid, err)
	}
	pref := ref.proto()
	apis := make([]workerv1.WorkerClient, len(nodes))
	conns := make([]grpc.ClientConnInterface, len(nodes))
	opened := make([]bool, len(nodes))
	peers := make([]string, cfg.TP*cfg.CP)
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		apis[i], conns[i] = workerv1.NewWorkerClient(n.Conn), n.Conn
		e := &enc{what: "open grid request"}
		req := &workerv1.OpenGridRequest{Ref: pref, Config: gc}
		for _, r := range n.Ranks {
			req.Ranks = append(req.Ranks, e.rank("rank", r))
		}
		wg.Go(func() {
			rep, err := apis[i].OpenGrid(ctx, req)
			if err != nil {
				errs[i] = fmt.Errorf("open grid %s on node %d: %w", ref.Grid, i, FromStatus(err))
				return
			}
			opened[i] = true
			if len(rep.Addrs) != len(n.Ranks) {
				errs[i] = fmt.Errorf("open grid %s on node %d: %w: %d addresses for %d ranks", ref.Grid, i, errBadReply, len(rep.Addrs), len(n.Ranks))
				return
			}
			if err := checkPageType(cfg.DType, rep.GetKvDtype()); err != nil {
				errs[i] = fmt.Errorf("open grid %s on node %d: %w", ref.Grid, i, err)
				return
			}
			for k, r := range n.Ranks {
				peers[r.TP*cfg.CP+r.CP] = rep.Addrs[k]
			}
		})
	}
	wg.Wait()
	closeOpened := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		var wg sync.WaitGroup
		for i, ok := range opened {
			if ok {
				wg.Go(func() { _, _ = apis[i].CloseGrid(cctx, &workerv1.CloseGridRequest{Ref: pref}) })
			}
		}
		wg.Wait()
	}
	if err := errors.Join(errs...); err != nil {
		closeOpened()
		return nil, err
	}
	// Every node connects at once (each waits for its peers); the first
	// failure cancels the others.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recovered := make([][]worker.RecoveredSeq, len(nodes))
	notRecovered := make([]NotRecovered, len(nodes))
	placement := make([]string, cfg.TP*cfg.CP)
	for _, n := range nodes {
		for _, r := range n.Ranks {
			placement[r.TP*cfg.CP+r.CP] = n.Name
		}
	}
	if slices.Contains(placement, "") {
		placement = nil
	}
	for i := range nodes {
		wg.Go(func() {
			rep, err := apis[i].ConnectGrid(cctx, &workerv1.ConnectGridRequest{Ref: pref, Peers: peers, Placement: placement})
			if err != nil {
				errs[i] = fmt.Errorf("connect grid %s on node %d: %w", ref.Grid, i, FromStatus(err))
				cancel()
				return
			}
			d := &dec{what: "connect grid reply", sentinel: errBadReply}
			for _, r := range rep.GetRecovered() {
				recovered[i] = append(recovered[i], decodeRecovered(d, r, cfg.Layers))
			}
			notRecovered[i].Quarantined = rep.GetQuarantined()
			for _, r := range rep.GetDamaged() {
				notRecovered[i].Damaged = append(notRecovered[i].Damaged, DamagedSeq{Key: r.GetKey(), Seq: r.GetSeq(), Grid: r.GetGrid(), Reason: r.GetReason()})
			}
			if d.err != nil {
				errs[i] = fmt.Errorf("connect grid %s on node %d: %w", ref.Grid, i, d.err)
				cancel()
			}
		})
	}
	wg.Wait()
	if err := worker.Cause(errs...); err != nil {
		closeOpened()
		return nil, err
	}
	out := make([]*Client, len(nodes))
	for i := range nodes {
		out[i] = &Client{api: apis[i], ref: pref, geo: geometryOf(cfg), recovered: recovered[i], notRecovered: notRecovered[i], calls: newCallStream(conns[i], MaxReplyElements(cfg))}
	}
	return out, nil
}

// CloseGrid closes the clients' grid on their nodes, all at once, and
// returns their errors joined. A node that no longer holds the grid
// answers OK.
func CloseGrid(ctx context.Context, clients ...*Client) error {
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		c.calls.close() // a step in progress ends with the grid
		wg.Go(func() {
			if _, err := c.api.CloseGrid(ctx, &workerv1.CloseGridRequest{Ref: c.ref}); err != nil {
				errs[i] = fmt.Errorf("close grid %s: %w", c.ref.Grid, FromStatus(err))
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Keys implements worker.Worker.
func (c *Client) Keys(ctx context.Context, m worker.KeysRequest, rep *worker.KeysReply) error {
	r, err := encodeKeys(c.ref, m)
	if err != nil {
		return err
	}
	out, err := c.api.Keys(ctx, r)
	if err != nil {
		return FromStatus(err)
	}
	return decodeKeysReply(c.geo, out, m.Count, rep)
}
