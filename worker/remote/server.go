package remote

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/kernels"
)

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
	dirs map[string]*dirHold
	rec  RecoveryStats
	// testHookRelease, when set, runs as a grid gives its directory back
	// (before it does); testHookClaimWait as a ConnectGrid starts
	// waiting for a directory that a closing grid holds. Tests only.
	testHookRelease, testHookClaimWait func(dir string)
	// The collective benchmark's ranks (bench.go): opened or running,
	// by bench id; benchRuns counts the RunBench calls in progress and
	// benchCtx ends them when the server closes.
	benches     map[string]*benchRank
	benchRuns   sync.WaitGroup
	benchCtx    context.Context
	benchCancel context.CancelFunc
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

// NewServer makes a server with no grids.
func NewServer(cfg ServerConfig) (_ *Server, err error) {
	if cfg.DataDirLock != nil {
		defer func() {
			if err != nil {
				cfg.DataDirLock.Close()
			}
		}()
	}
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
	s := &Server{cfg: cfg, bes: slices.Clone(cfg.Backends), log: cfg.Logger, grids: map[string]*grid{}, dirs: map[string]*dirHold{},
		draining: make(chan struct{}), benches: map[string]*benchRank{}}
	s.benchCtx, s.benchCancel = context.WithCancel(context.Background())
	if cfg.Backend != nil {
		s.bes = []kernels.Backend{cfg.Backend}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.DataDirLock != nil:
		if filepath.Clean(cfg.DataDirLock.dir) != filepath.Clean(cfg.DataDir) {
			return nil, fmt.Errorf("worker server: data dir %s: the lock given is of %s", cfg.DataDir, cfg.DataDirLock.dir)
		}
		s.lock = cfg.DataDirLock.l
	case cfg.DataDir != "":
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
	if cfg.DataDirLock != nil {
		cfg.DataDirLock.once.Do(func() {}) // the server's now: Close releases it
	}
	return s, nil
}

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
	for id, b := range s.benches {
		if !b.running {
			b.lis.Close()
			delete(s.benches, id)
		}
	}
	s.benchCancel()
	s.mu.Unlock()
	s.benchRuns.Wait()
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
