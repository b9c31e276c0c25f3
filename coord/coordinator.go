package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
)

// Config configures a node's coordinator. Name, Engine, View and Conn are
// required.
type Config struct {
	// Name is this node's name in the cluster; sequence ids start with it.
	Name string
	// Instance is this node process's membership instance
	// (Membership.Instance): sequence and grid ids carry it, so that a
	// node restarted under the same name never reuses an id.
	Instance uint64
	// Engine is the geometry, the CP x TP grid, each rank's pool, the
	// policy, the selection mode and the step deadline of every sequence
	// this node coordinates (the same on every node of a cluster). Its
	// Backend, Transports, DeviceResident and MemoryLimit are the
	// workers' business and are ignored.
	Engine engine.Config
	// View returns the current membership view (Membership.View).
	View func() cluster.View
	// Conn returns a connection to the node serving gRPC at addr; the
	// caller owns and caches the connections.
	Conn func(addr string) (grpc.ClientConnInterface, error)
	// Vet, when set, says whether a member of the view may be placed
	// on: nil admits it, an error refuses it, and a refused member is
	// left out of the placement of every grid opened after (node
	// checks the member's gRPC certificate against its gossip name). It
	// is called for every member placement would use before each
	// placement, concurrently and outside the coordinator's lock; it may
	// block (a dial), until ctx ends, and should keep its verdicts.
	// Default nil: every member that is up and serves gRPC is placeable.
	Vet func(ctx context.Context, m cluster.Member) error
	// OpenTimeout bounds the opening of a grid on its nodes, and each
	// adoption of a sequence they recovered (10s).
	OpenTimeout time.Duration
	// RecoverWait bounds how long Recover (the Decode API's Recovered)
	// waits for the recovery it reports: the opening of the grid of
	// Engine and the adoption of what its nodes recovered, retried
	// while a node of it is unavailable (a peer restarting, a grid
	// lost). The caller's deadline bounds it too. When the recovery is
	// still not done then, Recover fails with ErrRecovering (UNAVAILABLE:
	// retry; the recovery goes on meanwhile). Default 30s.
	RecoverWait time.Duration
	// GridIdle, when positive, closes a grid (on its nodes too, freeing
	// the pages its ranks reserve) once it has held no sequence for that
	// long; the next Create for its config and placement opens a fresh
	// one. 0 (the default) keeps every grid open until the coordinator
	// closes or the grid is lost.
	GridIdle time.Duration
	// Logger receives the coordinator's logs (default: discard).
	Logger *slog.Logger
	// Observe, when set, is called once after every Step and every
	// decode step (Begin .. End) this coordinator runs, failed ones included (forwarded calls are
	// observed by the node that coordinates them). It is called on the
	// caller's goroutine, concurrently for concurrent steps: it must be
	// safe for concurrent use and quick (update counters, no I/O).
	Observe func(StepStats)
}

// StepStats describes one Step or decode step a coordinator ran, for
// Config.Observe: the phase times, the batch and the pages it read next
// to a dense read's.
type StepStats struct {
	// Kind is "step" (Step: one layer) or "steps" (a decode step of the
	// Stepper, Begin .. End: a range of layers, as the Steps stream of
	// the Decode API runs them).
	Kind string
	// Time is the step's phase times: for Step those of its first grid
	// (engine.Result.Time); for a decode step each phase summed over
	// the layers that came back, and Total the whole step's. A step that failed
	// after it started has its Total only (the time until it failed); one
	// refused before it ran (a bad item, an unknown sequence) none.
	Time engine.Times
	// Items is the number of sequences in the batch.
	Items int
	// Layers is the number of layers whose outputs came back (1 for a
	// Step that succeeded, last-first for a decode step that did; fewer,
	// or 0, for a failed one).
	Layers int
	// PagesRead and PagesTotal count (KV head, page) pairs over the items
	// and the layers that came back: plan.Reads() x KVHeads pages read,
	// and plan.Pages x KVHeads, what a dense read of every page would
	// read. Their ratio is the bytes of K and V read vs dense.
	PagesRead, PagesTotal int64
	// Err is the step's error (nil on success); Code its gRPC code as
	// the Decode API answers it (codes.OK on success).
	Err  error
	Code codes.Code
	// PeerErrors are the nodes of the step's grids whose calls failed
	// the step, at most one entry per node and kind (see [PeerError]);
	// none for a step that succeeded, or failed before it reached a
	// node (bad input, an unknown sequence, a grid lost before) or by
	// the caller's cancellation.
	PeerErrors []PeerError
}

// Kinds of [PeerError].
const (
	// PeerUnavailable: the node could not be reached, its worker or
	// collective transport is gone, or the membership view declared it
	// gone while the step ran.
	PeerUnavailable = "unavailable"
	// PeerTimeout: the node's call passed the step's deadline.
	PeerTimeout = "timeout"
	// PeerOther: any other failure the node answered (a full pool, a
	// grid it no longer holds, a step out of order).
	PeerOther = "other"
)

// PeerError is one node whose worker call (BeginStep, Layer or the
// diagnostics' Keys) failed a step, and the kind of the failure. A node
// that answers that a collective peer aborted or closed (the echo of a
// failure elsewhere) is blamed only when no node failed by itself; calls
// the coordinator cancelled after another node failed are not blamed.
type PeerError struct {
	Node string // the node's name
	Kind string // PeerUnavailable, PeerTimeout or PeerOther
}

// peerWorker is a grid node's worker as the grid's engine drives it: the
// failures of the calls of a step are logged, with the node's name, in
// the step's peerLog, which onGrid puts in the step's context.
type peerWorker struct {
	worker.Worker
	node string
}

func (w peerWorker) BeginStep(ctx context.Context, m worker.BeginRequest) error {
	err := w.Worker.BeginStep(ctx, m)
	logPeer(ctx, w.node, err)
	return err
}

func (w peerWorker) Layer(ctx context.Context, m worker.LayerRequest, rep *worker.LayerReply) error {
	err := w.Worker.Layer(ctx, m, rep)
	logPeer(ctx, w.node, err)
	return err
}

func (w peerWorker) Keys(ctx context.Context, m worker.KeysRequest, rep *worker.KeysReply) error {
	err := w.Worker.Keys(ctx, m, rep)
	logPeer(ctx, w.node, err)
	return err
}

// peerLog collects the failed calls of one step on one grid.
type peerLog struct {
	mu    sync.Mutex
	fails []peerFail
}

type peerFail struct {
	node string
	err  error
}

type peerLogKey struct{}

// logPeer records node's failed call in ctx's peerLog, if it has one.
func logPeer(ctx context.Context, node string, err error) {
	if err == nil {
		return
	}
	if l, _ := ctx.Value(peerLogKey{}).(*peerLog); l != nil {
		l.mu.Lock()
		l.fails = append(l.fails, peerFail{node, err})
		l.mu.Unlock()
	}
}

// blame returns the nodes to blame for a failed step on a grid: the node
// the membership view declared gone while it ran (cause, the reason the
// step's context ended), else the nodes whose calls failed by themselves,
// else those that answered a collective abort or a closed peer. Calls
// ended by a cancellation are nobody's fault.
func blame(cause error, fails []peerFail) []PeerError {
	var gone nodeGoneError
	if errors.As(cause, &gone) {
		return []PeerError{{Node: gone.node, Kind: PeerUnavailable}}
	}
	var own, echoes []PeerError
	for _, f := range fails {
		if errors.Is(f.err, context.Canceled) {
			continue
		}
		kind := PeerOther
		switch {
		case errors.Is(f.err, context.DeadlineExceeded):
			kind = PeerTimeout
		case errors.Is(f.err, remote.ErrUnavailable):
			kind = PeerUnavailable
		}
		pe := PeerError{Node: f.node, Kind: kind}
		if errors.Is(f.err, collective.ErrAborted) || errors.Is(f.err, collective.ErrPeerClosed) {
			echoes = appendPeer(echoes, pe)
		} else {
			own = appendPeer(own, pe)
		}
	}
	if len(own) > 0 {
		return own
	}
	return echoes
}

// appendPeer appends pe to ps unless it is there.
func appendPeer(ps []PeerError, pe PeerError) []PeerError {
	for _, p := range ps {
		if p == pe {
			return ps
		}
	}
	return append(ps, pe)
}

// nodeGoneError says that the membership view no longer shows a node of
// a grid up.
type nodeGoneError struct{ node string }

func (e nodeGoneError) Error() string { return "node " + e.node + " is gone from the view" }

// addPlans adds the pages of plans (one layer of a grid with kvHeads KV
// heads) to st.
func (st *StepStats) addPlans(plans []plan.Plan, kvHeads int) {
	for _, p := range plans {
		st.PagesRead += int64(p.Reads()) * int64(kvHeads)
		st.PagesTotal += int64(p.Pages) * int64(kvHeads)
	}
}

// observe finishes st with err's code and hands it to Config.Observe.
func (c *Coordinator) observe(ctx context.Context, st StepStats, err error) {
	if c.cfg.Observe == nil {
		return
	}
	st.Err = err
	st.Code = status.Code(statusCtx(ctx, err))
	c.cfg.Observe(st)
}

// Errors callers act on (the Decode service maps them to gRPC codes).
var (
	// ErrUnknownSequence: a sequence id this node does not coordinate.
	ErrUnknownSequence = errors.New("unknown sequence")
	// ErrBadSequenceID: a sequence id that is not "node/instance.number".
	ErrBadSequenceID = errors.New("malformed sequence id")
	// ErrGridLost: the sequence's grid lost a node (a broken stream,
	// membership declared it gone, the node no longer holds the grid, or
	// it holds a step this coordinator ended); the sequence's pages on it
	// are gone.
	ErrGridLost = errors.New("grid lost a node")
	// ErrClosed: the coordinator is closed.
	ErrClosed = errors.New("coordinator closed")
)

// Coordinator coordinates the sequences created on this node: it places
// each one on a grid of nodes chosen from the membership view
// (cluster.PlaceGrid: rank (0, 0) here when it has capacity, the other
// ranks on distinct nodes by rendezvous hashing, capacity-aware), opens
// the grid on its nodes once (worker/remote.OpenGrid; later sequences
// with the same placement share it) and drives the grid's workers with an
// engine opened over remote clients (engine.Open). A grid that loses a
// node fails its sequences with ErrGridLost; sequences on other grids are
// not affected. Methods are safe for concurrent use: operations of one
// grid serialize on its engine, grids run in parallel.
type Coordinator struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	closed bool
	grids  map[string]*grid // by placement key
	seqs   map[string]*seq  // by sequence id
	// handles are the same sequences by their Stepper handle.
	handles    map[decode.SeqID]*seq
	nextHandle decode.SeqID
	next       uint64         // next sequence number
	ngrid      uint64         // grids opened
	wg         sync.WaitGroup // grid closers
	// adopted are the sequences adopted after a restart and not released
	// (by id), damaged those found and not adopted (see adopt.go).
	adopted map[string]RecoveredSeq
	damaged []DamagedSeq
	// opening has one entry per placement key whose grid gridFor is
	// opening, closed when that opening ends: concurrent gridFor calls of
	// the key wait for it rather than open grids that race for the
	// nodes' data directories.
	opening map[string]chan struct{}
	// closing are the grids whose close on their nodes (closeGrid) has
	// not ended: each node holds such a grid's data directory until it
	// has closed it, so gridFor waits for those sharing a node with a
	// grid it opens (a node that still held the directory gave the new
	// grid a fresh one and recovered nothing).
	closing map[*grid]struct{}
	// recovering is the recovery Recover runs, nil when none (adopt.go).
	recovering *recoverRun
	// released are the ids of sequences released while their grid was
	// lost (whose nodes may still hold them on disk), the oldest first
	// in releasedOrder, at most maxReleased: a restarted node's copy of
	// one is dropped, not adopted (adopt.go).
	released      map[string]bool
	releasedOrder []string
}

// maxReleased bounds Coordinator.released.
const maxReleased = 4096

// grid is one placement's engine and remote workers.
type grid struct {
	ec      engine.Config // the grid's geometry, grid, policy and mode
	ref     remote.GridRef
	key     string
	nodes   []string // per rank tp*CP+cp
	members map[string]uint64
	eng     *engine.Engine
	ranks   []remote.NodeRanks
	clients []*remote.Client
	workers []string // the node of each entry of ranks and clients
	lost    error    // set once the grid lost a node
	seqs    int
	// pending counts the Creates that got the grid from gridFor and have
	// not registered their sequence yet; idle is the timer that closes
	// the grid when it stays empty (Config.GridIdle).
	pending int
	idle    *time.Timer
	// adopted is closed once the opening that made the grid has adopted
	// what its nodes recovered (Recover waits for it).
	adopted chan struct{}
	// ctx ends when the grid is lost (its cause the loss): the steps in
	// flight on it end at once instead of at their deadline.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// closed, set by closeGrid, is closed once the grid's nodes answered
	// its CloseGrid (or the close timed out).
	closed chan struct{}
	// parked are the recovered sequences (by the grid that wrote them
	// and their engine id there) that the grid's nodes recovered and its
	// adoption left parked, placed on other nodes (adopt): the grid's
	// directories hold them on its nodes until it closes.
	parked map[parkedKey]bool
}

// parkedKey names a recovered sequence: the grid that wrote it and its
// engine id there (worker.RecoveredSeq.Grid and Seq).
type parkedKey struct {
	grid string
	seq  uint64
}

// seq is a sequence this node coordinates.
type seq struct {
	name string
	g    *grid
	id   engine.SeqID
	// h is its handle in this coordinator's decode.Stepper (see Handle).
	h decode.SeqID
}

// addSeqLocked registers sequence name with a new Stepper handle.
func (c *Coordinator) addSeqLocked(name string, s *seq) {
	c.nextHandle++
	s.h, s.name = c.nextHandle, name
	c.seqs[name] = s
	c.handles[s.h] = s
}

// New returns a coordinator; it opens grids on demand.
func New(cfg Config) (*Coordinator, error) {
	switch {
	case cfg.Name == "":
		return nil, errors.New("coordinator: no node name")
	case cfg.View == nil || cfg.Conn == nil:
		return nil, errors.New("coordinator: View and Conn are required")
	}
	if err := cfg.Engine.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = 10 * time.Second
	}
	if cfg.RecoverWait <= 0 {
		cfg.RecoverWait = DefaultRecoverWait
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Coordinator{cfg: cfg, log: log, grids: map[string]*grid{}, seqs: map[string]*seq{}, handles: map[decode.SeqID]*seq{}, next: 1, adopted: map[string]RecoveredSeq{},
		opening: map[string]chan struct{}{}, closing: map[*grid]struct{}{}, released: map[string]bool{}}, nil
}

// Sequences is the number of sequences this node coordinates; Grids the
// number of grids it drives.
func (c *Coordinator) Sequences() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.seqs) }

// Grids is the number of grids this node drives.
func (c *Coordinator) Grids() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.grids) }

// Owner returns the name of the node that coordinates sequence id
// ("node/instance.number": the node's name, its process's membership
// instance in hex and a number).
func Owner(id string) (string, error) {
	i := strings.LastIndexByte(id, '/')
	if i <= 0 {
		return "", fmt.Errorf("sequence %q: %w", id, ErrBadSequenceID)
	}
	inst, num, ok := strings.Cut(id[i+1:], ".")
	if !ok {
		return "", fmt.Errorf("sequence %q: %w", id, ErrBadSequenceID)
	}
	if _, err := strconv.ParseUint(inst, 16, 64); err != nil {
		return "", fmt.Errorf("sequence %q: %w", id, ErrBadSequenceID)
	}
	if _, err := strconv.ParseUint(num, 10, 64); err != nil {
		return "", fmt.Errorf("sequence %q: %w", id, ErrBadSequenceID)
	}
	return id[:i], nil
}

// seqName is the id of this node's sequence number n.
func (c *Coordinator) seqName(n uint64) string {
	return c.cfg.Name + "/" + strconv.FormatUint(c.cfg.Instance, 16) + "." + strconv.FormatUint(n, 10)
}

// GridOwner returns the coordinator of grid id: its node name and
// process instance (ok false for an id no coordinator made).
func GridOwner(id string) (name string, instance uint64, ok bool) {
	rest, _, ok := cutLast(id, '/')
	if !ok {
		return "", 0, false
	}
	name, inst, ok := cutLast(rest, '/')
	if !ok {
		return "", 0, false
	}
	instance, err := strconv.ParseUint(inst, 16, 64)
	return name, instance, err == nil && name != ""
}

func cutLast(s string, sep byte) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// Created is what Create answers.
type Created struct {
	ID    string
	Nodes []string // per rank tp*CP+cp
	View  uint64
}

// Create places a new empty sequence and returns its id. ec, when not
// nil, is the sequence's config (geometry, layers, grid, pages per rank,
// policy, mode; its step timeout and memory fields are the node's);
// nil: the node's.
func (c *Coordinator) Create(ctx context.Context, p plan.Placement, ec *engine.Config) (Created, error) {
	if p != plan.Striped && p != plan.Contiguous {
		return Created{}, fmt.Errorf("placement %d: %w", p, engine.ErrBadInput)
	}
	cfg := c.cfg.Engine
	if ec != nil {
		cfg.Layers, cfg.Geometry, cfg.CP, cfg.TP = ec.Layers, ec.Geometry, ec.CP, ec.TP
		cfg.CapacityPages, cfg.Policy, cfg.Selection = ec.CapacityPages, ec.Policy.WithGeometry(ec.Geometry), ec.Selection
		if err := cfg.Validate(); err != nil {
			return Created{}, fmt.Errorf("config: %w: %w", engine.ErrBadInput, err)
		}
	}
	g, err := c.gridFor(ctx, cfg)
	if err != nil {
		return Created{}, err
	}
	// g.pending counts this Create until its sequence is registered (or
	// it fails): an idle grid is not closed under it.
	done := func(g *grid) {
		c.mu.Lock()
		g.pending--
		c.idleLocked(g)
		c.mu.Unlock()
	}
	// The engine id is the sequence's number (the workers' tables keep
	// it: an adopted sequence keeps its name, see adopt.go).
	n, err := c.number()
	if err != nil {
		done(g)
		return Created{}, err
	}
	id := engine.SeqID(n)
	err = g.eng.CreateIDContext(ctx, id, p)
	if err != nil && errors.Is(err, remote.ErrUnknownGrid) {
		// A node forgot the grid (swept it while its view still showed
		// this coordinator gone, or restarted): lose it and create on a
		// fresh grid once.
		c.check(g, err)
		done(g)
		if g, err = c.gridFor(ctx, cfg); err != nil {
			return Created{}, err
		}
		err = g.eng.CreateIDContext(ctx, id, p)
	}
	if err != nil {
		err = c.check(g, err)
		done(g)
		return Created{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	g.pending--
	if c.closed {
		return Created{}, ErrClosed
	}
	name := c.seqName(n)
	c.addSeqLocked(name, &seq{g: g, id: id})
	g.seqs++
	return Created{ID: name, Nodes: append([]string(nil), g.nodes...), View: g.ref.View}, nil
}

// gridFor returns the grid the current view places a new sequence on,
// opening it when no live grid has that placement. The opening runs
// outside the coordinator's lock (it waits on other nodes, up to
// OpenTimeout), so other sequences' operations go on meanwhile; one
// placement opens once at a time (the others wait for it, then use its
// grid, or open again when it failed).
func (c *Coordinator) gridFor(ctx context.Context, ec engine.Config) (*grid, error) {
	for {
		v := c.cfg.View()
		cand, refused, err := c.placeable(ctx, v)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		// The pools of this coordinator's live grids of ec's worker
		// config count as free on their nodes: a placement that finds
		// one of them again joins it (its nodes' advertised free pages
		// leave its pools out, and a grid that took a node's last pages
		// would otherwise place no second sequence).
		nodes, err := cluster.PlaceGrid(c.withOwnLocked(cand, ec), ec.CP, ec.TP, c.cfg.Name, ec.CapacityPages)
		if err != nil {
			c.mu.Unlock()
			if refused > 0 {
				// Which members and why is for the operator (Status),
				// not for every caller of Create.
				err = fmt.Errorf("%w (%d member(s) refused for placement: questctl status lists them)", err, refused)
			}
			return nil, err
		}
		members := map[string]uint64{}
		var kb strings.Builder
		// Grids are shared by the sequences of one config and one placement.
		fmt.Fprintf(&kb, "%+v|", ec.WorkerConfig())
		for _, n := range nodes {
			m, _ := v.Member(n)
			members[n] = m.Instance
			fmt.Fprintf(&kb, "%s#%d,", n, m.Instance)
		}
		key := kb.String()
		if g, ok := c.grids[key]; ok && g.lost == nil {
			g.pending++
			c.mu.Unlock()
			return g, nil
		}
		if c.dropParkingLocked(key, nodes) > 0 {
			c.log.Info("closing grids that hold recovered sequences of another placement for their directories", "nodes", nodes)
		}
		if wait := c.closingOnLocked(nodes); len(wait) > 0 {
			c.mu.Unlock()
			for _, ch := range wait {
				select {
				case <-ch:
				case <-ctx.Done():
					return nil, fmt.Errorf("open grid on %v: waiting for a lost grid's close on its nodes: %w", nodes, context.Cause(ctx))
				}
			}
			continue
		}
		if wait, ok := c.opening[key]; ok {
			c.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("open grid on %v: waiting for another opening: %w", nodes, context.Cause(ctx))
			}
		}
		done := make(chan struct{})
		c.opening[key] = done
		c.ngrid++
		g := &grid{
			ec:      ec,
			ref:     remote.GridRef{Grid: fmt.Sprintf("%s/%x/%d", c.cfg.Name, c.cfg.Instance, c.ngrid), View: v.Version},
			key:     key,
			nodes:   nodes,
			members: members,
			adopted: make(chan struct{}),
		}
		g.ctx, g.cancel = context.WithCancelCause(context.Background())
		c.mu.Unlock()
		opened := g
		g, err = c.openGrid(ctx, g, v)
		c.mu.Lock()
		delete(c.opening, key)
		close(done)
		close(opened.adopted)
		if err == nil {
			g.pending++
		}
		c.mu.Unlock()
		return g, err
	}
}

// Placeable returns the nodes that placement may use now, with the
// pages each can still host: those of the current view (cluster.NodesOf)
// less those Config.Vet refuses. ctx bounds the vetting.
func (c *Coordinator) Placeable(ctx context.Context) ([]cluster.NodeInfo, error) {
	nodes, _, err := c.placeable(ctx, c.cfg.View())
	return nodes, err
}

// placeable returns the nodes of v that placement may use
// (cluster.NodesOf) less those Config.Vet refuses, and how many it
// refused. The members are vetted concurrently; ctx ending fails it.
func (c *Coordinator) placeable(ctx context.Context, v cluster.View) ([]cluster.NodeInfo, int, error) {
	nodes := cluster.NodesOf(v)
	if c.cfg.Vet == nil {
		return nodes, 0, nil
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		m, _ := v.Member(n.Name)
		wg.Go(func() { errs[i] = c.cfg.Vet(ctx, m) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, 0, fmt.Errorf("place a grid: vetting the members: %w", context.Cause(ctx))
	}
	kept := nodes[:0]
	for i, n := range nodes {
		if errs[i] == nil {
			kept = append(kept, n)
		}
	}
	return kept, len(nodes) - len(kept), nil
}

// openGrid opens g (named, placed and not yet known to c) on its nodes
// of view v, adopts what they recovered and returns it, or the grid of
// its placement that another opening made meanwhile.
func (c *Coordinator) openGrid(ctx context.Context, g *grid, v cluster.View) (*grid, error) {
	ec, nodes := g.ec, g.nodes

	// The ranks of each node, in first-appearance order.
	at := map[string]int{}
	var names []string // per entry of g.ranks
	for r, n := range nodes {
		rk := worker.Rank{TP: r / ec.CP, CP: r % ec.CP}
		i, ok := at[n]
		if !ok {
			m, _ := v.Member(n)
			conn, err := c.cfg.Conn(m.Meta.GRPCAddr)
			if err != nil {
				return nil, fmt.Errorf("node %s at %q: %w: %w", n, m.Meta.GRPCAddr, remote.ErrUnavailable, err)
			}
			i = len(g.ranks)
			at[n] = i
			g.ranks = append(g.ranks, remote.NodeRanks{Conn: conn, Name: n})
			names = append(names, n)
		}
		g.ranks[i].Ranks = append(g.ranks[i].Ranks, rk)
	}
	octx, cancel := context.WithTimeout(ctx, c.cfg.OpenTimeout)
	defer cancel()
	clients, err := remote.OpenGrid(octx, g.ranks, g.ref, ec.WorkerConfig())
	if err != nil {
		return nil, fmt.Errorf("open grid %s on %v: %w", g.ref.Grid, nodes, openError(ctx, err))
	}
	g.clients, g.workers = clients, names
	hosts := make([]engine.Host, len(clients))
	for i, cl := range clients {
		hosts[i] = engine.Host{Worker: peerWorker{Worker: cl, node: names[i]}, Ranks: g.ranks[i].Ranks}
	}
	if g.eng, err = engine.Open(ec, hosts); err != nil {
		c.mu.Lock()
		c.closeGrid(g)
		c.mu.Unlock()
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.closeGrid(g)
		return nil, ErrClosed
	}
	if old, ok := c.grids[g.key]; ok {
		if old.lost == nil {
			// Another create opened the same placement meanwhile.
			c.closeGrid(g)
			return old, nil
		}
		if old.seqs == 0 {
			c.dropLocked(old)
		}
	}
	c.grids[g.key] = g
	c.log.Info("grid opened", "grid", g.ref.Grid, "view", g.ref.View, "nodes", nodes)
	// The sequences the grid's nodes recovered (none on nodes without a
	// data directory): named and numbered under the lock, adopted outside
	// it (the claims wait on the nodes; the deferred unlock takes it
	// back). A grid that lost the race above left its own parked, on
	// disk again once it closed.
	recs := c.matchRecoveredLocked(g)
	c.mu.Unlock()
	c.adopt(ctx, g, recs)
	c.mu.Lock()
	return g, nil
}

// openError classes an error of remote.OpenGrid for a caller whose
// context is ctx. A node that forgot the grid between its OpenGrid and
// ConnectGrid (swept it while its view still showed this coordinator
// gone), or that gave its connect up on its own side (closed the grid:
// its view had lost this coordinator or a peer meanwhile), both seen in
// TestChaos/partition, lost the grid as a grid that loses a node does:
// ErrGridLost, UNAVAILABLE, so that the caller's retry opens a fresh
// one; not NOT_FOUND, nor CANCELED, which tells a client that it
// cancelled. The caller's own cancellation stays what it is.
func openError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, remote.ErrUnknownGrid):
		return fmt.Errorf("%w: %w", ErrGridLost, err)
	case errors.Is(err, context.Canceled) && ctx.Err() == nil:
		return fmt.Errorf("%w: %w", ErrGridLost, err)
	}
	return err
}

// lookup returns the sequence called id, refusing those of a lost grid.
func (c *Coordinator) lookup(id string) (*seq, error) {
	if _, err := Owner(id); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	s, ok := c.seqs[id]
	if !ok {
		return nil, fmt.Errorf("sequence %q: %w", id, ErrUnknownSequence)
	}
	if err := c.aliveLocked(s.g); err != nil {
		return nil, fmt.Errorf("sequence %q: %w", id, err)
	}
	return s, nil
}

// Append appends tokens' keys and values to one layer of a sequence.
func (c *Coordinator) Append(ctx context.Context, id string, layer int, k, v []float32) error {
	s, err := c.lookup(id)
	if err != nil {
		return err
	}
	return c.damage(s, c.check(s.g, s.g.eng.AppendContext(ctx, s.id, layer, k, v)))
}

// SeqConfig returns the config of the grid sequence id lives on.
func (c *Coordinator) SeqConfig(id string) (engine.Config, error) {
	s, err := c.lookup(id)
	if err != nil {
		return engine.Config{}, err
	}
	return s.g.ec, nil
}

// Len returns a sequence's length.
func (c *Coordinator) Len(id string) (int, error) {
	s, err := c.lookup(id)
	if err != nil {
		return 0, err
	}
	return s.g.eng.Len(s.id)
}

// Fork makes a child sequence sharing the parent's pages.
func (c *Coordinator) Fork(ctx context.Context, id string) (string, error) {
	s, err := c.lookup(id)
	if err != nil {
		return "", err
	}
	n, err := c.number()
	if err != nil {
		return "", err
	}
	child := engine.SeqID(n)
	if err := s.g.eng.ForkIDContext(ctx, s.id, child); err != nil {
		return "", c.damage(s, c.check(s.g, err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	name := c.seqName(n)
	c.addSeqLocked(name, &seq{g: s.g, id: child})
	s.g.seqs++
	return name, nil
}

// Rollback drops the last n tokens of every layer of a sequence.
func (c *Coordinator) Rollback(ctx context.Context, id string, n int) error {
	s, err := c.lookup(id)
	if err != nil {
		return err
	}
	return c.damage(s, c.check(s.g, s.g.eng.RollbackContext(ctx, s.id, n)))
}

// Release frees a sequence; a sequence of a lost grid is forgotten.
func (c *Coordinator) Release(ctx context.Context, id string) error {
	if _, err := Owner(id); err != nil {
		return err
	}
	c.mu.Lock()
	s, ok := c.seqs[id]
	if !ok {
		c.mu.Unlock()
		return fmt.Errorf("sequence %q: %w", id, ErrUnknownSequence)
	}
	delete(c.seqs, id)
	delete(c.handles, s.h)
	delete(c.adopted, id)
	s.g.seqs--
	lost := c.aliveLocked(s.g) != nil
	if s.g.seqs == 0 && lost {
		c.dropLocked(s.g)
	}
	if lost {
		// Its nodes may hold it on disk still: not to adopt again.
		c.rememberReleasedLocked(id)
	}
	c.mu.Unlock()
	if lost {
		return nil
	}
	err := c.check(s.g, s.g.eng.ReleaseContext(context.WithoutCancel(ctx), s.id))
	c.mu.Lock()
	if err != nil {
		c.rememberReleasedLocked(id)
	}
	c.idleLocked(s.g)
	c.mu.Unlock()
	if errors.Is(err, ErrGridLost) {
		// The release found the grid gone: the sequence went with it,
		// as for a grid already known lost above.
		return nil
	}
	return err
}

// idleLocked arms g's idle timer when g holds no sequence and no Create
// is registering one (Config.GridIdle; c.mu held). The timer's callback
// closes g if it is still empty then.
func (c *Coordinator) idleLocked(g *grid) {
	if c.cfg.GridIdle <= 0 || c.closed || g.lost != nil || g.seqs > 0 || g.pending > 0 || c.grids[g.key] != g {
		return
	}
	if g.idle != nil {
		g.idle.Stop()
	}
	g.idle = time.AfterFunc(c.cfg.GridIdle, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed || g.lost != nil || g.seqs > 0 || g.pending > 0 || c.grids[g.key] != g {
			return
		}
		c.log.Info("grid idle: closing it", "grid", g.ref.Grid, "nodes", g.nodes, "idle", c.cfg.GridIdle)
		c.dropLocked(g)
	})
}

// rememberReleasedLocked records id in c.released, forgetting the
// oldest beyond maxReleased (c.mu held).
func (c *Coordinator) rememberReleasedLocked(id string) {
	if c.released[id] {
		return
	}
	c.released[id] = true
	c.releasedOrder = append(c.releasedOrder, id)
	if len(c.releasedOrder) > maxReleased {
		delete(c.released, c.releasedOrder[0])
		c.releasedOrder = slices.Delete(c.releasedOrder, 0, 1)
	}
}

// Close closes every grid and waits for the nodes' answers (bounded).
func (c *Coordinator) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	for _, g := range c.grids {
		if g.idle != nil {
			g.idle.Stop() // a callback already running sees c.closed
		}
		if g.lost == nil {
			c.closeGrid(g)
		}
	}
	c.grids = map[string]*grid{}
	if c.recovering != nil {
		c.recovering.cancel() // an opening in it ends at once
	}
	c.mu.Unlock()
	c.wg.Wait()
	return nil
}
