package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/collective/grpctransport"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

type gridState int

const (
	opened     gridState = iota // listeners made, waiting for ConnectGrid
	connecting                  // ConnectGrid in progress (it owns the listeners)
	connected                   // hosting: local and transports set
)

// grid is one grid's ranks on this node.
type grid struct {
	id       string
	view     uint64
	cfg      worker.Config
	geo      geometry
	ranks    []worker.Rank
	devs     []int // device (index of Server.bes) of each hosted rank, set by reserve
	pages    int
	bytes    int64
	deadline time.Time // of ConnectGrid
	// ctx ends when the grid closes: the calls in progress end with it.
	ctx    context.Context
	cancel context.CancelFunc

	// Under Server.mu.
	state gridState
	lis   []net.Listener // opened
	trs   []*grpctransport.Transport
	local *worker.Local
	// dir is a connected grid's data directory (ServerConfig.DataDir;
	// "" for none); release gives it back once the worker is closed.
	dir     string
	release func()
	// lost is what the grid's connection could not recover (set by
	// connect before the grid is connected): a quarantined directory
	// and the sequences its table named.
	lost NotRecovered

	// The open step's batch, for the shapes of its layer requests.
	mu          sync.Mutex
	step        uint64
	open        bool
	seqs, fresh int
}

// sweep frees the grids whose ConnectGrid is overdue (s.mu held).
func (s *Server) sweep() {
	now := time.Now()
	for _, g := range s.grids {
		if g.state == opened && now.After(g.deadline) {
			s.log.Warn("worker server: freeing a grid that was not connected in time", "grid", g.id, "timeout", s.cfg.ConnectTimeout)
			s.forget(g).shut() // only listeners to close
		}
	}
}

// forget removes g from the server and gives back its reservation
// (s.mu held); the caller shuts it.
func (s *Server) forget(g *grid) *grid {
	if s.grids[g.id] == g {
		delete(s.grids, g.id)
		s.pages -= g.pages
		s.bytes -= g.bytes
		for _, d := range g.devs {
			s.onDev[d]--
		}
	}
	g.cancel()
	return g
}

// shut frees what a forgotten grid holds: a connected grid's worker, then
// its transports; an opened one's listeners. A connecting grid's
// ConnectGrid frees its own (the cancelled ctx ends its wait).
func (g *grid) shut() error {
	var err error
	if g.local != nil {
		err = g.local.Close()
	}
	closeTransports(g.trs)
	for _, l := range g.lis {
		l.Close()
	}
	if g.release != nil {
		g.release()
	}
	return err
}

// closeTransports closes trs concurrently (each may wait for its peers'
// acknowledgements).
func closeTransports(trs []*grpctransport.Transport) {
	var wg sync.WaitGroup
	for _, t := range trs {
		if t != nil {
			wg.Go(func() { t.Close() })
		}
	}
	wg.Wait()
}

// lookup returns the grid ref names, checking its view (s.mu held).
func (s *Server) lookup(ref *workerv1.GridRef) (*grid, error) {
	if s.closed {
		return nil, fmt.Errorf("worker server: %w", worker.ErrClosed)
	}
	s.sweep()
	g, ok := s.grids[ref.GetGrid()]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownGrid, ref.GetGrid())
	}
	if g.view != ref.GetView() {
		// The caller learns its own view is not the grid's, not which
		// view the grid's coordinator saw (no membership state out).
		return nil, fmt.Errorf("%w: grid %s: the call's view %d is not the one the grid was opened under", ErrWrongView, g.id, ref.GetView())
	}
	return g, nil
}

// with runs f on the connected grid ref names, on a ctx that also ends
// when the grid closes, and answers f's error as a status.
func (s *Server) with(ctx context.Context, ref *workerv1.GridRef, f func(ctx context.Context, g *grid) error) error {
	if err := authorize(ctx, ref.GetGrid()); err != nil {
		return err
	}
	s.mu.Lock()
	g, err := s.lookup(ref)
	if err == nil && g.state != connected {
		err = fmt.Errorf("%w: grid %s is not connected yet", ErrGridState, g.id)
	}
	s.mu.Unlock()
	if err != nil {
		return statusErr(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(g.ctx, cancel)()
	return statusErr(s.scrubDamage(g, f(ctx, g)))
}

// OpenGrid implements workerv1.WorkerServer: it validates the config and
// the ranks, reserves their pages and memory, and listens for each
// rank's collective streams.
func (s *Server) OpenGrid(ctx context.Context, r *workerv1.OpenGridRequest) (*workerv1.OpenGridReply, error) {
	if err := authorize(ctx, r.GetRef().GetGrid()); err != nil {
		return nil, err
	}
	g, err := s.newGrid(r)
	if err != nil {
		return nil, statusErr(fmt.Errorf("open grid %q: %w", r.GetRef().GetGrid(), err))
	}
	port := func(l net.Listener) string {
		if a, ok := l.Addr().(*net.TCPAddr); ok {
			return strconv.Itoa(a.Port)
		}
		_, p, _ := net.SplitHostPort(l.Addr().String())
		return p
	}
	rep := &workerv1.OpenGridReply{}
	rep.KvDtype, _ = wireDType(g.cfg.DType)
	for range g.ranks {
		l, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Host, "0"))
		if err != nil {
			for _, l := range g.lis {
				l.Close()
			}
			return nil, statusErr(fmt.Errorf("open grid %q: listen: %w", g.id, err))
		}
		g.lis = append(g.lis, l)
		rep.Addrs = append(rep.Addrs, net.JoinHostPort(s.cfg.Host, port(l)))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.reserve(g); err != nil {
		for _, l := range g.lis {
			l.Close()
		}
		return nil, statusErr(fmt.Errorf("open grid %q: %w", g.id, err))
	}
	return rep, nil
}

// newGrid decodes and checks an OpenGrid request.
func (s *Server) newGrid(r *workerv1.OpenGridRequest) (*grid, error) {
	ref := r.GetRef()
	if ref.GetGrid() == "" {
		return nil, fmt.Errorf("%w: no grid id", worker.ErrBadMessage)
	}
	cfg, err := decodeConfig(r.GetConfig())
	if err != nil {
		return nil, err
	}
	cfg.MemoryLimit, cfg.DeviceResident = s.cfg.MemoryLimit, s.cfg.DeviceResident
	if cfg.DType, err = s.pageType(cfg.DType); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", worker.ErrBadMessage, err)
	}
	if len(r.GetRanks()) == 0 {
		return nil, fmt.Errorf("%w: no ranks to host", worker.ErrBadMessage)
	}
	d := &dec{what: "open grid request", sentinel: worker.ErrBadMessage}
	seen := map[worker.Rank]bool{}
	var ranks []worker.Rank
	for i, pr := range r.GetRanks() {
		rk := d.rank(fmt.Sprintf("ranks[%d]", i), pr)
		if d.err != nil {
			return nil, d.err
		}
		switch {
		case rk.TP >= cfg.TP || rk.CP >= cfg.CP:
			return nil, fmt.Errorf("%w: ranks[%d] %v outside the %d x %d grid", worker.ErrBadMessage, i, rk, cfg.TP, cfg.CP)
		case seen[rk]:
			return nil, fmt.Errorf("%w: ranks[%d] %v listed twice", worker.ErrBadMessage, i, rk)
		}
		seen[rk] = true
		ranks = append(ranks, rk)
	}
	need, err := cfg.HostBytes(len(ranks))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", worker.ErrBadMessage, err)
	}
	g := &grid{id: ref.GetGrid(), view: ref.GetView(), cfg: cfg, geo: geometryOf(cfg), ranks: ranks,
		pages: cfg.Capacity * len(ranks), bytes: need, deadline: time.Now().Add(s.cfg.ConnectTimeout)}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g, nil
}

// pageType is the storage type the node's ranks of a grid hold when its
// coordinator asks for want (GridConfig.kv_dtype). A node whose pools
// are in host memory stores want. A device-resident node stores its
// devices' type (kernels.SlotStore.PoolDType, questd's --kv-cache-dtype):
// an f32 grid takes it, as it always has (bf16 or f16 pages on a GPU,
// fp8 on one of fp8 pools); an fp8 grid is refused unless every device
// stores fp8, so that no grid asked for fp8 pages holds another type.
func (s *Server) pageType(want plan.DType) (plan.DType, error) {
	if !s.cfg.DeviceResident {
		return want, nil
	}
	have := plan.Float32
	for i, be := range s.bes {
		ss, ok := be.(kernels.SlotStore)
		dt := plan.Float32
		if ok {
			dt = ss.PoolDType()
		}
		switch {
		case i == 0:
			have = dt
		case dt != have:
			have = plan.Float32 // devices of mixed types: only f32 grids
		}
	}
	switch {
	case want == plan.Float32 && have == plan.FP8:
		return plan.FP8, nil
	case want == plan.Float32:
		return want, nil
	case have != want:
		return 0, fmt.Errorf("%w: grid asks for %v pages; this node's devices store %v (its --kv-cache-dtype)", worker.ErrBadMessage, want, have)
	}
	return want, nil
}

// reserve checks g against the node's bounds and adds it (s.mu held).
func (s *Server) reserve(g *grid) error {
	if s.closed {
		return fmt.Errorf("worker server: %w", worker.ErrClosed)
	}
	s.sweep()
	if _, ok := s.grids[g.id]; ok {
		return fmt.Errorf("%w: grid %s exists", ErrGridState, g.id)
	}
	// The caller learns what it asked for and that the node is full,
	// not what the other grids hold or the node's bounds (the log says).
	if s.cfg.MaxPages > 0 && s.pages+g.pages > s.cfg.MaxPages {
		s.log.Warn("worker server: grid refused: node full", "grid", g.id, "pages", g.pages, "reserved", s.pages, "max_pages", s.cfg.MaxPages)
		return fmt.Errorf("%w: %d ranks of %d pages do not fit", ErrNodeFull, len(g.ranks), g.cfg.Capacity)
	}
	what := fmt.Sprintf("grid %s: %d shards of %d pages each", g.id, len(g.ranks), g.cfg.Capacity)
	if lim := s.cfg.MemoryLimit; lim > 0 && memlimit.Add(s.bytes, g.bytes) > lim {
		s.log.Warn("worker server: grid refused: memory limit", "grid", g.id, "bytes", g.bytes, "reserved_bytes", s.bytes, "memory_limit", lim)
		return fmt.Errorf("%s need %s, more than the node's memory limit leaves: %w", what, memlimit.Bytes(g.bytes), memlimit.ErrTooLarge)
	}
	if err := memlimit.Check(what, g.bytes, s.cfg.MemoryLimit); err != nil {
		// The memory available now, or the most this process could ever
		// hold (with no limit set), is the node's to log, not the caller's.
		s.log.Warn("worker server: grid refused: memory", "grid", g.id, "err", err)
		return fmt.Errorf("%s need %s, more than the node's memory can hold: %w", what, memlimit.Bytes(g.bytes), memlimit.ErrTooLarge)
	}
	s.grids[g.id] = g
	s.pages += g.pages
	s.bytes += g.bytes
	g.devs = make([]int, len(g.ranks))
	for i := range g.ranks {
		d := 0
		for j, n := range s.onDev {
			if n < s.onDev[d] {
				d = j
			}
		}
		g.devs[i] = d
		s.onDev[d]++
	}
	return nil
}

// CloseGrid implements workerv1.WorkerServer: it closes the grid's worker
// (after the calls in progress end) and its transports. Closing a grid
// the node does not hold is OK.
func (s *Server) CloseGrid(ctx context.Context, r *workerv1.CloseGridRequest) (*workerv1.CloseGridReply, error) {
	if err := authorize(ctx, r.GetRef().GetGrid()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	g, err := s.lookup(r.GetRef())
	if errors.Is(err, ErrUnknownGrid) {
		s.mu.Unlock()
		return &workerv1.CloseGridReply{}, nil
	}
	if err != nil {
		s.mu.Unlock()
		return nil, statusErr(fmt.Errorf("close grid: %w", err))
	}
	s.forget(g)
	s.mu.Unlock()
	if err := g.shut(); err != nil {
		return nil, statusErr(fmt.Errorf("close grid %s: %w", g.id, err))
	}
	return &workerv1.CloseGridReply{}, nil
}
