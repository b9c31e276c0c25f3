package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/questrt/questrt/api/wire"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/collective/grpctransport"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/worker"
)

// ServerConfig configures a node's worker server. DefaultServerConfig
// gives the defaults; set one of TLS and Plaintext.
type ServerConfig struct {
	// Host is the IP or host name the grids' collective listeners bind
	// to and advertise to their peers (one ephemeral port per hosted
	// rank). Default "127.0.0.1".
	Host string
	// MaxPages bounds the pages this node hosts over all its grids (a
	// grid takes its Capacity pages per hosted rank); an OpenGrid beyond
	// it fails with ErrNodeFull (RESOURCE_EXHAUSTED). 0: no bound but
	// MemoryLimit.
	MaxPages int
	// MemoryLimit bounds the host bytes of all grids' page pools and
	// summary mirrors together, as internal/memlimit counts them: a byte
	// count, 0 (the memory available when a grid opens) or -1 (no check).
	// It is every grid's worker.Config.MemoryLimit too.
	MemoryLimit int64
	// DeviceResident keeps the grids' pools in the backend's device
	// memory (worker.Config.DeviceResident).
	DeviceResident bool
	// TLS secures the collective transports between the grids' ranks
	// (grpctransport.Config.TLS); Plaintext runs them unencrypted, only
	// when asked for. Exactly one must be set. The worker API's own gRPC
	// server is the caller's (grpc.NewServer with its credentials).
	TLS       *tls.Config
	Plaintext bool
	// CollectiveServerOptions and CollectiveDialOptions are added to the
	// options of every hosted rank's collective transport
	// (grpctransport.Config.ServerOptions and DialOptions): a node's
	// authorization interceptors and the token its own streams carry.
	CollectiveServerOptions []grpc.ServerOption
	CollectiveDialOptions   []grpc.DialOption
	// Backend runs every hosted rank's kernels; it must be safe for
	// concurrent use by several ranks. Nil: a CPU backend the server owns
	// and closes.
	Backend kernels.Backend
	// Backends, when not empty, are the node's devices, one backend each
	// (Backend must then be nil): each hosted rank of a grid is placed on
	// the device holding the fewest hosted ranks of the open grids at that
	// moment (ties to the lower index), so that a grid's ranks spread over
	// the devices and several ranks share a device when there are more
	// ranks than devices. The caller keeps and closes them.
	Backends []kernels.Backend
	// Logger receives the server's and the transports' logs. Default:
	// discard.
	Logger *slog.Logger
	// ConnectTimeout bounds ConnectGrid's wait for a grid's peers, and
	// the time from OpenGrid to ConnectGrid: a grid not connected by then
	// is freed by the next call that notices. Default 10 s.
	ConnectTimeout time.Duration
	// DataDir, when set, makes the grids persistent: each grid's worker
	// persists under DataDir/grids/<coordinator>/<shape>.<n>
	// (worker.Config.DataDir; see persist.go for the names), a directory
	// derived from the grid's coordinator name, page geometry, CP x TP,
	// pages per rank and hosted ranks, so that the same coordinator
	// opening a grid of the same shape after a restart (of this node or
	// its own) recovers the grid's sequences (parked, see
	// worker.RecoveryReport; ConnectGrid logs the report and Stats
	// counts it). Closing a grid persists it in full; nothing deletes
	// a grid's directory. The server holds DataDir/LOCK for its life: a
	// second server on the directory, in any process, fails with
	// ErrDataDirInUse. Not with DeviceResident. "" (the default):
	// nothing persists.
	DataDir string
	// Durability and SyncInterval are the grids' page store durability
	// (worker.Config.Durability, SyncInterval); unused without DataDir.
	Durability   pagestore.Durability
	SyncInterval time.Duration
	// OnPersistError, when set with DataDir, gets every failed operation
	// on a file of DataDir (worker.Config.OnPersistError of every grid).
	OnPersistError func(*pagestore.IOError)
	// OnQuarantine, when set with DataDir, gets every grid directory
	// found damaged and moved aside (its path and where it went).
	OnQuarantine func(dir, movedTo string, err error)
}

// DefaultConnectTimeout is ServerConfig.ConnectTimeout's default.
const DefaultConnectTimeout = 10 * time.Second

// DefaultServerConfig returns the defaults; set TLS or Plaintext.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{Host: "127.0.0.1", ConnectTimeout: DefaultConnectTimeout}
}

// Validate reports the first invalid field.
func (c ServerConfig) Validate() error {
	switch {
	case c.Host == "":
		return errors.New("worker server config: empty Host")
	case c.MaxPages < 0:
		return fmt.Errorf("worker server config: MaxPages %d is negative", c.MaxPages)
	case c.MemoryLimit < memlimit.NoLimit:
		return fmt.Errorf("worker server config: memory limit %d: want bytes, 0 (available memory) or -1 (no check)", c.MemoryLimit)
	case (c.TLS != nil) == c.Plaintext:
		return errors.New("worker server config: set exactly one of TLS and Plaintext")
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("worker server config: ConnectTimeout %v must be positive", c.ConnectTimeout)
	case c.DataDir != "" && c.DeviceResident:
		return fmt.Errorf("worker server config: data dir %s with device-resident pools: the device-resident store does not persist", c.DataDir)
	case c.Backend != nil && len(c.Backends) > 0:
		return errors.New("worker server config: set Backend or Backends, not both")
	case slices.Contains(c.Backends, nil):
		return errors.New("worker server config: a nil backend in Backends")
	case c.Durability < pagestore.SyncOnWrite || c.Durability > pagestore.SyncPeriodic:
		return fmt.Errorf("worker server config: unknown durability %d", int(c.Durability))
	case c.SyncInterval < 0:
		return fmt.Errorf("worker server config: sync interval %v must not be negative", c.SyncInterval)
	}
	return nil
}

// Server is a node's side of the worker API: it hosts the ranks of any
// number of grids (each a worker.Local over its ranks, with gRPC
// collective transports to the grid's other ranks) and answers the
// coordinators' calls. Register it on a grpc.Server with
// workerv1.RegisterWorkerServer. Its methods are safe for concurrent use;
// the calls of one grid serialize in its worker.Local.
type Server struct {
	workerv1.UnimplementedWorkerServer

	cfg   ServerConfig
	bes   []kernels.Backend // the devices: cfg.Backends, or the one backend
	ownBe kernels.Backend
	log   *slog.Logger

	mu     sync.Mutex
	closed bool
	grids  map[string]*grid
	onDev  []int // hosted ranks of the reserved grids on each of bes
	pages  int   // reserved by the grids
	bytes  int64 // host bytes of the grids
	// connects counts the ConnectGrid calls in progress: they own what
	// they build until they hand it to their grid; Close waits for them.
	connects sync.WaitGroup
	// Persistence (DataDir): the directory's lock, the grid directories
	// in use and what the grids recovered.
	lock *dataLock
	dirs map[string]bool
	rec  RecoveryStats
	// draining is closed by Drain: Calls streams end between steps.
	draining  chan struct{}
	drainOnce sync.Once
}

var _ workerv1.WorkerServer = (*Server)(nil)

// Drain makes the server's Calls streams end at their next point between
// decode steps (UNAVAILABLE), so that a node's graceful stop does not
// wait for a stream that a coordinator keeps from step to step; a step
// open on a stream runs to its EndStep. Call it before the gRPC server's
// GracefulStop.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

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

	// The open step's batch, for the shapes of its layer requests.
	mu          sync.Mutex
	step        uint64
	open        bool
	seqs, fresh int
}

// NewServer makes a server with no grids.
func NewServer(cfg ServerConfig) (*Server, error) {
	def := DefaultServerConfig()
	if cfg.Host == "" {
		cfg.Host = def.Host
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = def.ConnectTimeout
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, bes: slices.Clone(cfg.Backends), log: cfg.Logger, grids: map[string]*grid{}, dirs: map[string]bool{},
		draining: make(chan struct{})}
	if cfg.Backend != nil {
		s.bes = []kernels.Backend{cfg.Backend}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.DataDir != "" {
		lk, err := lockDataDir(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		s.lock = lk
	}
	if len(s.bes) == 0 {
		s.ownBe = kernels.NewCPU(kernels.CPUConfig{})
		s.bes = []kernels.Backend{s.ownBe}
	}
	s.onDev = make([]int, len(s.bes))
	return s, nil
}

// Stats is a snapshot of a server's grids.
type Stats struct {
	// Grids and Ranks count the grids held (connected or not) and their
	// hosted ranks.
	Grids, Ranks int
	// PagesUsed is the pages the grids reserve; PagesFree what MaxPages
	// leaves (-1 without MaxPages).
	PagesUsed, PagesFree int
	// HostBytes is the host memory of the grids' pools and mirrors.
	HostBytes int64
	// PagesDevice and PagesHost are the pages in use in the connected
	// grids' hosted shards, summed over them: those whose K/V are in the
	// shard's device pool and those only in its host tier (offload, see
	// worker.Config.DeviceBudgetPages). Without offload every used page
	// is on the device.
	PagesDevice, PagesHost int
	// Offload sums the offload counters of the connected grids' hosted
	// offloading shards (cumulative while their grids stay open: a
	// grid's counters leave the sums when it closes).
	Offload OffloadTotals
	// Recovery counts what the grids recovered from ServerConfig.DataDir.
	Recovery RecoveryStats
	// RanksPerDevice is the number of hosted ranks of the grids held on
	// each device (ServerConfig.Backends; one entry with a single
	// backend).
	RanksPerDevice []int
}

// OffloadTotals are offload counters summed over shards (see
// pagestore.ResidencyStats): pages step recalls found resident (Hits)
// or brought in (Misses), of them brought in by prefetch before a step
// wanted them (PrefetchHits), prefetched pages that left unused
// (PrefetchWasted), payload bytes into device pools (BytesIn, prefetch
// reads included) and out to tiers (BytesOut), pages evicted and those
// written back first, and the time steps spent in recalls.
type OffloadTotals struct {
	Hits, Misses, PrefetchHits, PrefetchWasted int64
	BytesIn, BytesOut                          int64
	Evictions, WriteBacks                      int64
	Stall                                      time.Duration
}

// Stats returns a snapshot (freeing grids whose ConnectGrid is overdue).
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep()
	st := Stats{Grids: len(s.grids), PagesUsed: s.pages, PagesFree: -1, HostBytes: s.bytes, Recovery: s.rec, RanksPerDevice: slices.Clone(s.onDev)}
	for _, g := range s.grids {
		st.Ranks += len(g.ranks)
		if g.local == nil {
			continue // not connected: no shards yet
		}
		st.Recovery.Parked += g.local.ParkedCount()
		for _, r := range g.local.Ranks() {
			sh := g.local.Shard(r)
			if sh == nil {
				continue
			}
			store := sh.Store()
			if store.Config().Offload() {
				rs := store.ResidencyStats()
				st.PagesDevice += rs.Resident
				st.PagesHost += rs.TierOnly
				o := &st.Offload
				o.Hits += rs.Hits
				o.Misses += rs.Misses
				o.PrefetchHits += rs.PrefetchHits
				o.PrefetchWasted += rs.PrefetchWasted
				o.BytesIn += rs.BytesIn + rs.PrefetchBytes
				o.BytesOut += rs.BytesOut
				o.Evictions += rs.Evictions
				o.WriteBacks += rs.WriteBacks
				o.Stall += rs.Stall
			} else {
				st.PagesDevice += store.Stats().UsedPages
			}
		}
	}
	if s.cfg.MaxPages > 0 {
		st.PagesFree = s.cfg.MaxPages - s.pages
	}
	return st
}

// Grids returns the number of grids held.
func (s *Server) Grids() int { return s.Stats().Grids }

// Close closes every grid (ending the calls in progress) and the
// server's own backend; later calls fail with UNAVAILABLE. It waits for
// the ConnectGrid calls in progress to give up.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var gs []*grid
	for _, g := range s.grids {
		gs = append(gs, s.forget(g))
	}
	s.mu.Unlock()
	var first error
	for _, g := range gs {
		if err := g.shut(); err != nil && first == nil {
			first = err
		}
	}
	s.connects.Wait()
	if s.ownBe != nil {
		s.ownBe.Close()
	}
	if err := s.lock.unlock(); err != nil && first == nil {
		first = err
	}
	return first
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
		return nil, fmt.Errorf("%w: grid %s was opened under view %d, call carries %d", ErrWrongView, g.id, g.view, ref.GetView())
	}
	return g, nil
}

// with runs f on the connected grid ref names, on a ctx that also ends
// when the grid closes, and answers f's error as a status.
func (s *Server) with(ctx context.Context, ref *workerv1.GridRef, f func(ctx context.Context, g *grid) error) error {
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
	return statusErr(f(ctx, g))
}

// OpenGrid implements workerv1.WorkerServer: it validates the config and
// the ranks, reserves their pages and memory, and listens for each
// rank's collective streams.
func (s *Server) OpenGrid(ctx context.Context, r *workerv1.OpenGridRequest) (*workerv1.OpenGridReply, error) {
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

// reserve checks g against the node's bounds and adds it (s.mu held).
func (s *Server) reserve(g *grid) error {
	if s.closed {
		return fmt.Errorf("worker server: %w", worker.ErrClosed)
	}
	s.sweep()
	if _, ok := s.grids[g.id]; ok {
		return fmt.Errorf("%w: grid %s exists", ErrGridState, g.id)
	}
	if s.cfg.MaxPages > 0 && s.pages+g.pages > s.cfg.MaxPages {
		return fmt.Errorf("%w: %d ranks of %d pages on top of %d reserved exceed %d pages", ErrNodeFull, len(g.ranks), g.cfg.Capacity, s.pages, s.cfg.MaxPages)
	}
	what := fmt.Sprintf("grid %s: %d shards of %d pages each", g.id, len(g.ranks), g.cfg.Capacity)
	if lim := s.cfg.MemoryLimit; lim > 0 && memlimit.Add(s.bytes, g.bytes) > lim {
		return fmt.Errorf("%s need %s on top of the %s of the node's other grids, more than the %s memory limit: %w",
			what, memlimit.Bytes(g.bytes), memlimit.Bytes(s.bytes), memlimit.Bytes(lim), memlimit.ErrTooLarge)
	}
	if err := memlimit.Check(what, g.bytes, s.cfg.MemoryLimit); err != nil {
		return err
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

// ConnectGrid implements workerv1.WorkerServer: it connects every hosted
// rank's transport to the ranks of its TP group (all at once: each waits
// for its peers, bounded by ConnectTimeout), then builds the grid's
// worker. On failure the grid is freed.
func (s *Server) ConnectGrid(ctx context.Context, r *workerv1.ConnectGridRequest) (*workerv1.ConnectGridReply, error) {
	s.mu.Lock()
	g, err := s.lookup(r.GetRef())
	if err == nil && g.state != opened {
		err = fmt.Errorf("%w: grid %s is already connecting or connected", ErrGridState, g.id)
	}
	if err != nil {
		s.mu.Unlock()
		return nil, statusErr(fmt.Errorf("connect grid: %w", err))
	}
	g.state = connecting
	lis := g.lis
	g.lis = nil
	if s.cfg.DataDir != "" && g.cfg.Mode == worker.Replicated {
		s.log.Warn("worker server: grid not persisted: replicated selection's summary mirrors are not persisted", "grid", g.id)
	}
	// The grid's data directory is this call's until the grid is
	// connected, then the grid's (shut gives it back).
	var dir string
	release := func() {}
	if s.cfg.DataDir != "" && g.cfg.Mode != worker.Replicated {
		dir = s.claimDir(gridDirBase(s.cfg.DataDir, g.id, g.cfg, g.ranks))
		release = func() {
			s.mu.Lock()
			delete(s.dirs, dir)
			s.mu.Unlock()
		}
	}
	s.connects.Add(1)
	s.mu.Unlock()
	defer s.connects.Done()

	local, trs, err := s.connect(ctx, g, dir, lis, r.GetPeers(), r.GetPlacement())
	s.mu.Lock()
	if err == nil && s.grids[g.id] != g {
		err = fmt.Errorf("%w: grid %s closed while connecting", ErrGridState, g.id)
	}
	if err != nil {
		s.forget(g)
		s.mu.Unlock()
		if local != nil {
			local.Close()
		}
		closeTransports(trs)
		release() // no worker holds the directory now
		return nil, statusErr(fmt.Errorf("connect grid %s: %w", g.id, err))
	}
	g.state, g.local, g.trs, g.dir, g.release = connected, local, trs, dir, release
	rep := &workerv1.ConnectGridReply{}
	if g.dir != "" {
		rec := local.Recovery()
		s.noteRecovery(g, rec)
		e := &enc{what: "connect grid reply"}
		for _, r := range rec.Sequences {
			rep.Recovered = append(rep.Recovered, encodeRecovered(e, r))
		}
		if e.err != nil { // not reached: the lengths fit the pool
			s.log.Warn("worker server: recovered sequences not reported", "grid", g.id, "err", e.err)
			rep.Recovered = nil
		}
	}
	s.mu.Unlock()
	return rep, nil
}

// noteRecovery logs what grid g recovered from its data directory and
// counts it (s.mu held).
func (s *Server) noteRecovery(g *grid, rep worker.RecoveryReport) {
	corrupt := rep.CorruptSlots()
	if len(rep.Sequences) == 0 && len(rep.Damaged) == 0 && corrupt == 0 {
		s.log.Info("worker server: grid persists", "grid", g.id, "dir", rep.Dir)
		return
	}
	s.rec.Grids++
	s.rec.Sequences += len(rep.Sequences)
	s.rec.LostTokens += rep.LostTokens()
	s.rec.Damaged += len(rep.Damaged)
	s.rec.CorruptSlots += corrupt
	s.rec.RolledBack += rep.RolledBackTokens()
	s.log.Info("worker server: grid recovered", "grid", g.id, "dir", rep.Dir, "sequences", len(rep.Sequences),
		"lost_tokens", rep.LostTokens(), "rolled_back_tokens", rep.RolledBackTokens(), "damaged", len(rep.Damaged), "corrupt_slots", corrupt, "orphans", rep.OrphanSeqs)
	for _, r := range rep.Sequences {
		s.log.Info("worker server: recovered sequence", "grid", g.id, "from_grid", r.Grid, "key", r.Key, "seq", r.Seq, "lens", r.Lens, "lost_tokens", r.LostTokens, "rolled_back", r.RolledBack)
	}
	for _, d := range rep.Damaged {
		s.log.Warn("worker server: sequence not recovered", "grid", g.id, "key", d.Key, "seq", d.Seq, "err", d.Err)
	}
}

// connect builds g's transports on lis (which it takes over) and its
// worker, persisting in dir ("" for none); on failure it returns what
// it built for the caller to close.
func (s *Server) connect(ctx context.Context, g *grid, dir string, lis []net.Listener, peers, placement []string) (*worker.Local, []*grpctransport.Transport, error) {
	c := g.cfg
	if len(peers) != c.TP*c.CP {
		for _, l := range lis {
			l.Close()
		}
		return nil, nil, fmt.Errorf("%w: %d peer addresses for a %d x %d grid", worker.ErrBadMessage, len(peers), c.TP, c.CP)
	}
	for i, p := range peers {
		if p == "" {
			for _, l := range lis {
				l.Close()
			}
			return nil, nil, fmt.Errorf("%w: peers[%d] is empty", worker.ErrBadMessage, i)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	defer context.AfterFunc(g.ctx, cancel)()
	trs := make([]*grpctransport.Transport, len(g.ranks))
	errs := make([]error, len(g.ranks))
	var wg sync.WaitGroup
	for i, rk := range g.ranks {
		tc := grpctransport.DefaultConfig()
		tc.Group = g.id + "/tp" + strconv.Itoa(rk.TP)
		tc.Rank = rk.CP
		tc.Peers = peers[rk.TP*c.CP : (rk.TP+1)*c.CP]
		tc.Listener = lis[i]
		tc.TLS, tc.Plaintext, tc.Logger = s.cfg.TLS, s.cfg.Plaintext, s.log
		// Fixed windows, no BDP pings: a layer's exchanges are small
		// messages answered at once (wire.FlowWindow).
		tc.ServerOptions = append(append(tc.ServerOptions, wire.ServerFlowOptions()...), s.cfg.CollectiveServerOptions...)
		tc.DialOptions = append(append(tc.DialOptions, wire.DialFlowOptions()...), s.cfg.CollectiveDialOptions...)
		wg.Go(func() {
			var err error
			if trs[i], err = grpctransport.New(ctx, tc); err != nil {
				errs[i] = fmt.Errorf("rank %v: %w", rk, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, trs, err
	}
	if dir != "" {
		c.DataDir, c.Durability, c.SyncInterval, c.GridID = dir, s.cfg.Durability, s.cfg.SyncInterval, g.id
		c.OnPersistError = s.cfg.OnPersistError
		if len(placement) == c.TP*c.CP {
			c.Placement = slices.Clone(placement)
		}
	}
	specs := make([]worker.RankSpec, len(g.ranks))
	for i, rk := range g.ranks {
		specs[i] = worker.RankSpec{Rank: rk, Backend: s.bes[g.devs[i]], Transport: trs[i]}
	}
	local, err := worker.NewLocal(c, specs)
	if err != nil && dir != "" && errors.Is(err, tier.ErrCorrupt) {
		// A damaged metadata file: nothing of it was read. Move the
		// directory aside for its owner to inspect and open the grid on
		// a fresh one: this node's part of the grid's sequences is lost
		// (the coordinator reports them as not recovered here), the node
		// and its other grids go on.
		moved := fmt.Sprintf("%s.corrupt-%s", dir, time.Now().UTC().Format("20060102T150405.000Z"))
		if rerr := os.Rename(dir, moved); rerr != nil {
			return nil, trs, fmt.Errorf("%w (moving it aside failed: %v)", err, rerr)
		}
		s.log.Error("data dir damaged: moved aside, the grid starts on a fresh one (this node's part of its sequences is lost)",
			"grid", g.id, "dir", dir, "moved_to", moved, "err", err)
		if s.cfg.OnQuarantine != nil {
			s.cfg.OnQuarantine(dir, moved, err)
		}
		local, err = worker.NewLocal(c, specs)
	}
	if err != nil {
		return nil, trs, err
	}
	return local, trs, nil
}

// CloseGrid implements workerv1.WorkerServer: it closes the grid's worker
// (after the calls in progress end) and its transports. Closing a grid
// the node does not hold is OK.
func (s *Server) CloseGrid(ctx context.Context, r *workerv1.CloseGridRequest) (*workerv1.CloseGridReply, error) {
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

// Create implements workerv1.WorkerServer.
func (s *Server) Create(ctx context.Context, r *workerv1.CreateRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		d := &dec{what: "create request", sentinel: worker.ErrBadMessage}
		m := worker.CreateRequest{Seq: r.Seq, Layout: decodeLayout(d, r.Layout)}
		if d.err != nil {
			return d.err
		}
		return g.local.Create(ctx, m)
	}))
}

// Fork implements workerv1.WorkerServer.
func (s *Server) Fork(ctx context.Context, r *workerv1.ForkRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		return g.local.Fork(ctx, worker.ForkRequest{Parent: r.Parent, Child: r.Child})
	}))
}

// Release implements workerv1.WorkerServer.
func (s *Server) Release(ctx context.Context, r *workerv1.ReleaseRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		return g.local.Release(ctx, worker.ReleaseRequest{Seq: r.Seq})
	}))
}

// Check implements workerv1.WorkerServer.
func (s *Server) Check(ctx context.Context, r *workerv1.CheckRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m, err := decodeCheck(r)
		if err != nil {
			return err
		}
		return g.local.Check(ctx, m)
	}))
}

// Append implements workerv1.WorkerServer.
func (s *Server) Append(ctx context.Context, r *workerv1.AppendRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m, err := decodeAppend(g.geo, r)
		if err != nil {
			return err
		}
		return g.local.Append(ctx, m)
	}))
}

// Rollback implements workerv1.WorkerServer.
func (s *Server) Rollback(ctx context.Context, r *workerv1.RollbackRequest) (*workerv1.RollbackReply, error) {
	var rep *workerv1.RollbackReply
	err := s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m, err := decodeRollback(g.geo, r)
		if err != nil {
			return err
		}
		out, err := g.local.Rollback(ctx, m)
		if err != nil {
			return err
		}
		rep, err = encodeRollbackReply(g.geo, out)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// BeginStep implements workerv1.WorkerServer.
func (s *Server) BeginStep(ctx context.Context, r *workerv1.BeginRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m, err := decodeBegin(r)
		if err != nil {
			return err
		}
		if err := g.local.BeginStep(ctx, m); err != nil {
			return err
		}
		fresh := 0
		for _, sq := range m.Seqs {
			if sq.New {
				fresh++
			}
		}
		g.mu.Lock()
		g.step, g.open, g.seqs, g.fresh = m.Step, true, len(m.Seqs), fresh
		g.mu.Unlock()
		return nil
	}))
}

// layerTrailer is the trailer key of a Layer call that failed after the
// worker accepted it: the binary google.rpc.Status of the error (its
// ErrorInfo details), beside the reply's error_code and error_message.
const layerTrailer = "questrt-layer-status-bin"

// Layer implements workerv1.WorkerServer. A request the worker refused
// (nothing appended, a refusal sentinel) answers an error status; an error
// after the worker accepted it answers OK with the ranks' outputs (their
// Appended counts) and error_code and error_message set, the error's
// details in the trailer layerTrailer.
func (s *Server) Layer(ctx context.Context, r *workerv1.LayerRequest) (*workerv1.LayerReply, error) {
	var rep *workerv1.LayerReply
	err := s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		seqs, fresh := anyDim, anyDim
		g.mu.Lock()
		if g.open && g.step == r.Step {
			seqs, fresh = g.seqs, g.fresh
		}
		g.mu.Unlock()
		m, err := decodeLayer(g.geo, r, seqs, fresh)
		if err != nil {
			return fmt.Errorf("layer %d of step %d: %w", r.Layer, r.Step, err)
		}
		var out worker.LayerReply
		lerr := g.local.Layer(ctx, m, &out)
		if lerr != nil && refused(lerr, &out) {
			return lerr
		}
		if rep, err = encodeLayerReply(g.geo, &out); err != nil {
			return errors.Join(lerr, err)
		}
		if lerr != nil {
			st := ToStatus(lerr)
			rep.ErrorCode, rep.ErrorMessage = uint32(st.Code()), st.Message()
			if b, err := proto.Marshal(st.Proto()); err == nil {
				// No stream when called directly (tests): nothing to set.
				_ = grpc.SetTrailer(ctx, metadata.Pairs(layerTrailer, string(b)))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// refused reports whether a Layer error is a refusal that changed
// nothing: a refusal sentinel, no ErrChanged, no token taken.
func refused(err error, rep *worker.LayerReply) bool {
	for _, o := range rep.Ranks {
		if o.Appended > 0 {
			return false
		}
	}
	if errors.Is(err, worker.ErrChanged) {
		return false
	}
	for _, s := range []error{worker.ErrBadMessage, worker.ErrUnknownSequence, worker.ErrNotHosted, worker.ErrStep, worker.ErrStepOpen, worker.ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// EndStep implements workerv1.WorkerServer.
func (s *Server) EndStep(ctx context.Context, r *workerv1.EndRequest) (*workerv1.Ack, error) {
	return ack(s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m := decodeEnd(r, g.cfg.Layers)
		g.mu.Lock()
		if g.step == m.Step {
			g.open = false
		}
		g.mu.Unlock()
		return g.local.EndStep(ctx, m)
	}))
}

func ack(err error) (*workerv1.Ack, error) {
	if err != nil {
		return nil, err
	}
	return &workerv1.Ack{}, nil
}

// Keys implements workerv1.WorkerServer.
func (s *Server) Keys(ctx context.Context, r *workerv1.KeysRequest) (*workerv1.KeysReply, error) {
	var rep *workerv1.KeysReply
	err := s.with(ctx, r.GetRef(), func(ctx context.Context, g *grid) error {
		m, err := decodeKeys(r)
		if err != nil {
			return err
		}
		var out worker.KeysReply
		if err := g.local.Keys(ctx, m, &out); err != nil {
			return err
		}
		rep, err = encodeKeysReply(g.geo, &out)
		return err
	})
	if err != nil {
		return nil, err
	}
	return rep, nil
}
