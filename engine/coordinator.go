package engine

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
	"github.com/questrt/questrt/worker"
)

// endTimeout bounds the EndStep calls that close a step; they run on a
// context detached from the step's, which may be done.
const endTimeout = time.Second

// Engine is the coordinator of an in-process CP x TP decode grid. Its
// methods are safe for concurrent use; steps and sequence operations
// serialize on one mutex while the workers' ranks of a step run in
// parallel.
type Engine struct {
	cfg     Config
	kvT, qT int // KV and query heads per TP rank
	ownBe   kernels.Backend

	// mu is the engine's lock: one call holds it, or an open step from
	// Begin to End.
	mu turn
	// closed is set once by Close (read under mu, or by a Close that
	// did not get the turn).
	closed atomic.Bool
	// trs are the CP transports of every TP group ([tp][cp]), handed to
	// the workers; the engine made them and closes them.
	trs [][]collective.Transport
	// locals are the in-process workers; workers is the same list as the
	// coordinator drives it (through plain messages only). hosts lists
	// each worker's ranks, at locates rank (tp, cp): worker and position.
	locals  []*worker.Local
	workers []worker.Worker
	hosts   [][]worker.Rank
	at      [][]slot
	seqs    map[SeqID]*seqState
	nextID  SeqID
	step    uint64
	// Per worker: the reusable Layer request, and replies of the step and
	// of the dense reference of diagnostics.
	lreqs        []worker.LayerRequest
	reps, dreps  []worker.LayerReply
	keys         [][]keyReader         // the diagnostics' key readers, [tp][cp]
	stopCols     []shard.StopCollector // the diagnostics' stop-rule pages, per query head
	begin        worker.BeginRequest
	routed, took []int // per request: ranks the new token went to, ranks that took it
	ran          []int // the layer a step ran, for end
	// Reused by each open step (one at a time, under mu): its ran layers
	// and the rows whose new tokens a device layer queued.
	stepRan    []int
	stepQueued []bool
	errs       []error
}

// slot is where a rank lives: worker w, entry k of its ranks.
type slot struct{ w, k int }

// seqState is the coordinator's record of a sequence: no page map, no
// shard ids (the workers keep those).
type seqState struct {
	// layout places the sequence's pages over the CP ranks (a pure
	// function: no page map is kept).
	layout plan.Layout
	lens   []int // tokens per layer
	broken bool
}

// New builds the workers (one in-process worker.Local per rank, each with
// its shard and, for Replicated, its summary mirror) and the CP
// transports between them.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 30 * time.Second
	}
	cfg.Policy = cfg.Policy.WithGeometry(cfg.Geometry)
	if err := preflight(cfg); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, kvT: cfg.KVHeads / cfg.TP, qT: cfg.QHeads / cfg.TP, seqs: map[SeqID]*seqState{}, nextID: 1, mu: make(turn, 1)}
	be := cfg.Backend
	if be == nil && cfg.Backends == nil {
		e.ownBe = kernels.NewCPU(kernels.CPUConfig{SummaryDType: cfg.Policy.SummaryDType})
		be = e.ownBe
	}
	wc := cfg.workerConfig()
	for tp := range cfg.TP {
		var trs []collective.Transport
		if cfg.Transports != nil {
			trs = cfg.Transports(tp, cfg.CP)
		} else {
			trs = collective.NewInprocGroup(cfg.CP)
		}
		e.trs = append(e.trs, trs)
		if len(trs) != cfg.CP {
			e.Close()
			return nil, fmt.Errorf("engine: %d transports for cp %d", len(trs), cfg.CP)
		}
		var row []slot
		for cp := range cfg.CP {
			b := be
			if cfg.Backends != nil {
				b = cfg.Backends(tp, cp)
			}
			r := worker.Rank{TP: tp, CP: cp}
			l, err := worker.NewLocal(wc, []worker.RankSpec{{Rank: r, Backend: b, Transport: trs[cp]}})
			if err != nil {
				e.Close()
				return nil, fmt.Errorf("engine: shard (tp %d, cp %d): %w", tp, cp, err)
			}
			row = append(row, slot{w: len(e.workers)})
			e.locals = append(e.locals, l)
			e.workers = append(e.workers, l)
			e.hosts = append(e.hosts, []worker.Rank{r})
		}
		e.at = append(e.at, row)
	}
	e.lreqs = make([]worker.LayerRequest, len(e.workers))
	e.reps = make([]worker.LayerReply, len(e.workers))
	return e, nil
}

// Host is one worker an engine opened with Open drives, and the grid
// ranks it hosts.
type Host struct {
	Worker worker.Worker
	Ranks  []worker.Rank
}

// Open returns an engine that coordinates the given workers (remote ones,
// say) instead of building its own: every rank of the CP x TP grid must be
// hosted by exactly one of them, and each must run cfg's worker config
// with its ranks' transports already connected. The caller keeps the
// workers: Close does not close them. cfg's Backend, Backends, Transports,
// DeviceResident and MemoryLimit are the workers' business and are
// ignored; each worker checks its own memory. Diagnostics work as on an
// engine New built: the keys they need come back through Worker.Keys.
func Open(cfg Config, hosts []Host) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 30 * time.Second
	}
	cfg.Policy = cfg.Policy.WithGeometry(cfg.Geometry)
	e := &Engine{cfg: cfg, kvT: cfg.KVHeads / cfg.TP, qT: cfg.QHeads / cfg.TP, seqs: map[SeqID]*seqState{}, nextID: 1, mu: make(turn, 1)}
	e.at = make([][]slot, cfg.TP)
	for tp := range e.at {
		e.at[tp] = make([]slot, cfg.CP)
		for cp := range e.at[tp] {
			e.at[tp][cp] = slot{w: -1}
		}
	}
	for w, h := range hosts {
		if h.Worker == nil || len(h.Ranks) == 0 {
			return nil, fmt.Errorf("engine: host %d: %w: no worker or no ranks", w, ErrBadInput)
		}
		for k, r := range h.Ranks {
			if r.TP < 0 || r.TP >= cfg.TP || r.CP < 0 || r.CP >= cfg.CP {
				return nil, fmt.Errorf("engine: host %d: %w: rank %v outside the %d x %d grid", w, ErrBadInput, r, cfg.TP, cfg.CP)
			}
			if e.at[r.TP][r.CP].w >= 0 {
				return nil, fmt.Errorf("engine: host %d: %w: rank %v hosted twice", w, ErrBadInput, r)
			}
			e.at[r.TP][r.CP] = slot{w: w, k: k}
		}
		e.workers = append(e.workers, h.Worker)
		e.hosts = append(e.hosts, slices.Clone(h.Ranks))
	}
	for tp := range e.at {
		for cp, s := range e.at[tp] {
			if s.w < 0 {
				return nil, fmt.Errorf("engine: %w: rank (tp %d, cp %d) has no host", ErrBadInput, tp, cp)
			}
		}
	}
	e.lreqs = make([]worker.LayerRequest, len(e.workers))
	e.reps = make([]worker.LayerReply, len(e.workers))
	return e, nil
}

// Config returns the engine's config.
func (e *Engine) Config() Config { return e.cfg }

// Shard returns the shard of (tp, cp), for statistics: an in-process
// accessor through the worker that hosts it; nil for an engine made by
// Open.
func (e *Engine) Shard(tp, cp int) *shard.Shard {
	if e.locals == nil {
		return nil
	}
	s := e.at[tp][cp]
	return e.locals[s.w].Shard(worker.Rank{TP: tp, CP: cp})
}

// HierStats returns the hierarchical search's counters
// (Policy.HierGroup) summed over the engine's shards, for statistics;
// zero for an engine made by Open.
func (e *Engine) HierStats() shard.HierStats {
	var sum shard.HierStats
	if e.locals == nil {
		return sum
	}
	for tp := range e.at {
		for cp := range e.at[tp] {
			if s := e.Shard(tp, cp); s != nil {
				sum.Add(s.HierStats())
			}
		}
	}
	return sum
}

// TopPStats returns the top-p pruning's counters (Policy.TopP) summed
// over the engine's shards, for statistics; zero for an engine made by
// Open.
func (e *Engine) TopPStats() shard.TopPStats {
	var sum shard.TopPStats
	if e.locals == nil {
		return sum
	}
	for tp := range e.at {
		for cp := range e.at[tp] {
			if s := e.Shard(tp, cp); s != nil {
				sum.Add(s.TopPStats())
			}
		}
	}
	return sum
}

// Close releases the workers, the transports and the engine's own
// backend. It waits for an open step to end, up to StepTimeout; a step
// still open then (its caller never called End) fails on the closed
// workers.
func (e *Engine) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StepTimeout)
	err := e.mu.lockCtx(ctx)
	cancel()
	if err == nil {
		defer e.mu.Unlock()
	}
	if e.closed.Swap(true) {
		return nil
	}
	for _, trs := range e.trs {
		for _, tr := range trs {
			tr.Close()
		}
	}
	for _, l := range e.locals {
		l.Close()
	}
	if e.ownBe != nil {
		e.ownBe.Close()
	}
	return nil
}

func (e *Engine) lookup(id SeqID) (*seqState, error) {
	if e.closed.Load() {
		return nil, ErrClosed
	}
	sq, ok := e.seqs[id]
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrUnknownSequence, id)
	}
	if sq.broken {
		return nil, fmt.Errorf("sequence %d: %w", id, ErrBroken)
	}
	return sq, nil
}

// worker returns the worker hosting rank (tp, cp).
func (e *Engine) worker(tp, cp int) worker.Worker { return e.workers[e.at[tp][cp].w] }

// output returns rank (tp, cp)'s answer in reply set reps.
func (e *Engine) output(reps []worker.LayerReply, tp, cp int) *worker.RankOutput {
	s := e.at[tp][cp]
	outs := reps[s.w].Ranks
	r := worker.Rank{TP: tp, CP: cp}
	if s.k < len(outs) && outs[s.k].Rank == r {
		return &outs[s.k]
	}
	for i := range outs {
		if outs[i].Rank == r {
			return &outs[i]
		}
	}
	return nil
}

// detached returns a short context for the calls that clean up after an
// operation whatever happened to its own.
func detached() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), endTimeout)
}
