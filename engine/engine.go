// Package engine runs sharded Quest decode steps in one process: it lays
// each sequence out over CP x TP shards (pages over CP ranks, KV heads over
// TP ranks), routes appends to the shard that owns each token's page, and
// runs a decode step for a batch of sequences with one collective round per
// layer per batch: local scoring and candidates on every shard, a global
// top-K per (sequence, row) through package collective, sparse attention on
// each shard over its selected and forced pages, and a merge of the partial
// states at CP rank 0 of every TP group.
//
// Selection across CP ranks has three modes: Exact (default; an all-gather
// of each rank's local top candidates gives every rank the same global
// top-K, equal to a single shard's), Union (no exchange: each rank keeps
// its local top ceil(K'/N), K' the page budget minus the forced pages; an
// approximation) and Replicated (every rank
// mirrors all summaries and selects alone; equal to a single shard's).
package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// Selection is how CP ranks agree on the pages of a step.
type Selection int

const (
	// Exact all-gathers each rank's local top candidates; every rank
	// derives the same global top-K. Default.
	Exact Selection = iota
	// Union exchanges nothing: each rank keeps its local top ceil(K'/N),
	// K' the page budget minus the forced pages. An approximation: it
	// misses global top-K pages when one rank holds more than its quota of
	// them, and reads up to N*ceil(K'/N) ranked pages.
	Union
	// Replicated keeps a copy of every summary on every CP rank; each rank
	// computes the global top-K alone (N times the scoring work, no
	// selection exchange). Quest selector only.
	Replicated
)

var selectionNames = []string{"exact", "union", "replicated"}

// String returns the mode's name.
func (s Selection) String() string {
	if s >= 0 && int(s) < len(selectionNames) {
		return selectionNames[s]
	}
	return fmt.Sprintf("Selection(%d)", int(s))
}

// ParseSelection parses exact|union|replicated ("" means exact).
func ParseSelection(s string) (Selection, error) {
	if s == "" {
		return Exact, nil
	}
	if i := slices.Index(selectionNames, s); i >= 0 {
		return Selection(i), nil
	}
	return 0, fmt.Errorf("unknown selection %q (want exact, union or replicated)", s)
}

// Config describes an engine. DefaultConfig documents the defaults.
type Config struct {
	Layers   int // transformer layers (4)
	QHeads   int // query heads of the model (32)
	KVHeads  int // KV heads of the model (8); divisible by TP
	HeadDim  int // D (128)
	PageSize int // S (16)
	CP       int // context-parallel ranks per TP group (1)
	TP       int // tensor-parallel ranks (1)
	// CapacityPages is the page pool of every shard (1024).
	CapacityPages int
	// Policy is the selection policy (plan.DefaultPolicy()); its
	// PageSize must equal PageSize.
	Policy plan.Policy
	// Selection is the CP selection mode (Exact).
	Selection Selection
	// BlockPages is the block of the Contiguous placement (64 pages).
	BlockPages int
	// StepTimeout bounds a step when the caller's context has no earlier
	// deadline (30s).
	StepTimeout time.Duration
	// Backend runs every shard's kernels; nil: a CPU backend owned by the
	// engine. Backends, when set, gives each shard its own (tests use it to
	// inject faults).
	Backend  kernels.Backend
	Backends func(tp, cp int) kernels.Backend
	// Transports returns the CP group transports of TP group tp; nil:
	// in-process transports. Tests wrap them with collective.Faulty.
	Transports func(tp, n int) []collective.Transport
	// DeviceResident keeps every shard's pools in its backend's device
	// memory (see shard.Config.DeviceResident).
	DeviceResident bool
	// MemoryLimit bounds the host bytes of all shards' page pools (and the
	// summary mirrors of replicated selection) together: a byte count, 0
	// (the default: the memory available when New runs) or -1 (no check).
	// New refuses a configuration over it before allocating anything.
	MemoryLimit int64
}

// preflight refuses a configuration whose host pools, over all CP x TP
// shards, do not fit cfg.MemoryLimit. Device-resident pools live in device
// memory: only their host metadata counts.
func preflight(cfg Config, st pagestore.Config) error {
	per, err := st.HostBytes()
	if err != nil {
		return fmt.Errorf("engine config: %w", err)
	}
	if cfg.DeviceResident {
		per = memlimit.Mul(int64(st.Capacity), 8)
	}
	need := memlimit.Mul(per, int64(cfg.CP), int64(cfg.TP))
	if cfg.Selection == Replicated {
		// Each rank mirrors the summaries of its whole TP group's sequences.
		mirror := memlimit.Mul(int64(cfg.Layers), int64(st.KVHeads), 2, int64(cfg.HeadDim), 4, int64(st.Capacity), int64(cfg.CP))
		need = memlimit.Add(need, memlimit.Mul(mirror, int64(cfg.CP), int64(cfg.TP)))
	}
	what := fmt.Sprintf("engine: %d x %d shards of %d pages each", cfg.TP, cfg.CP, st.Capacity)
	return memlimit.Check(what, need, cfg.MemoryLimit)
}

// DefaultConfig returns a single-shard engine with the documented defaults.
func DefaultConfig() Config {
	return Config{Layers: 4, QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16, CP: 1, TP: 1,
		CapacityPages: 1024, Policy: plan.DefaultPolicy(), BlockPages: 64, StepTimeout: 30 * time.Second}
}

// Validate reports whether the config is usable.
func (c Config) Validate() error {
	switch {
	case c.Layers < 1 || c.QHeads < 1 || c.KVHeads < 1 || c.HeadDim < 1 || c.PageSize < 1:
		return errors.New("engine config: layers, heads, head dim and page size must be positive")
	case c.CP < 1 || c.TP < 1:
		return fmt.Errorf("engine config: cp %d and tp %d must be positive", c.CP, c.TP)
	case c.KVHeads%c.TP != 0:
		return fmt.Errorf("engine config: %d KV heads do not split over tp %d", c.KVHeads, c.TP)
	case c.QHeads%c.KVHeads != 0:
		return fmt.Errorf("engine config: %d query heads are not a multiple of %d KV heads", c.QHeads, c.KVHeads)
	case c.CapacityPages < 1 || c.BlockPages < 1:
		return fmt.Errorf("engine config: capacity %d and block %d pages must be positive", c.CapacityPages, c.BlockPages)
	case c.Policy.PageSize != c.PageSize:
		return fmt.Errorf("engine config: policy page size %d differs from %d", c.Policy.PageSize, c.PageSize)
	case c.Selection < Exact || c.Selection > Replicated:
		return fmt.Errorf("engine config: unknown selection %d", c.Selection)
	case c.Selection == Replicated && c.Policy.Selector != plan.Quest && c.Policy.Selector != plan.Dense:
		return fmt.Errorf("engine config: replicated selection needs the quest or dense selector, not %v", c.Policy.Selector)
	case c.MemoryLimit < memlimit.NoLimit:
		return fmt.Errorf("engine config: memory limit %d: want bytes, 0 (available memory) or -1 (no check)", c.MemoryLimit)
	}
	return c.Policy.Validate()
}

// SeqID names an engine sequence.
type SeqID uint64

// Errors callers act on.
var (
	ErrUnknownSequence = errors.New("engine: unknown sequence")
	ErrBadInput        = errors.New("engine: bad input")
	ErrPoolExhausted   = pagestore.ErrPoolExhausted
	// ErrBroken: a sequence whose shards may disagree after a failure in
	// the middle of an append or rollback that passed its checks; it can
	// only be released.
	ErrBroken = errors.New("engine: sequence broken by a failed append or rollback")
	ErrClosed = errors.New("engine: closed")
)

// Engine is an in-process CP x TP decode engine. Its methods are safe for
// concurrent use; steps and sequence operations serialize on one mutex
// while the shards of a step run in parallel.
type Engine struct {
	cfg     Config
	kvT, qT int // KV and query heads per TP rank
	ownBe   kernels.Backend

	mu      sync.Mutex
	closed  bool
	shards  [][]*shard.Shard // [tp][cp]
	trs     [][]collective.Transport
	groups  [][]*collective.Group
	mirrors [][]*shard.Mirror // Replicated only
	seqs    map[SeqID]*seqState
	nextID  SeqID
	step    uint64
	work    [][]*rankWork
}

type seqState struct {
	// layout places the sequence's pages over the CP ranks (a pure
	// function: no page map is kept).
	layout plan.Layout
	local  [][]pagestore.SeqID // [tp][cp]
	lens   []int               // tokens per layer
	broken bool
}

// New builds the shards, groups and (for Replicated) mirrors.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 30 * time.Second
	}
	st := pagestore.Config{Layers: cfg.Layers, KVHeads: cfg.KVHeads / cfg.TP, HeadDim: cfg.HeadDim, PageSize: cfg.PageSize,
		DType: pagestore.Float32, Capacity: cfg.CapacityPages}
	if err := preflight(cfg, st); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, kvT: cfg.KVHeads / cfg.TP, qT: cfg.QHeads / cfg.TP, seqs: map[SeqID]*seqState{}, nextID: 1}
	be := cfg.Backend
	if be == nil && cfg.Backends == nil {
		e.ownBe = kernels.NewCPU(kernels.CPUConfig{})
		be = e.ownBe
	}
	sc := shard.Config{
		Store:          st,
		QHeads:         e.qT,
		Policy:         cfg.Policy,
		DeviceResident: cfg.DeviceResident,
	}
	sc.Store.MemoryLimit = memlimit.NoLimit // checked above for all shards together
	for tp := range cfg.TP {
		var row []*shard.Shard
		var mir []*shard.Mirror
		var work []*rankWork
		for cp := range cfg.CP {
			b := be
			if cfg.Backends != nil {
				b = cfg.Backends(tp, cp)
			}
			s, err := shard.New(sc, b)
			if err != nil {
				e.Close()
				return nil, fmt.Errorf("engine: shard (tp %d, cp %d): %w", tp, cp, err)
			}
			row = append(row, s)
			if cfg.Selection == Replicated {
				mir = append(mir, shard.NewMirror(cfg.Layers, e.kvT, cfg.HeadDim, cfg.PageSize))
			}
			work = append(work, &rankWork{})
		}
		e.shards = append(e.shards, row)
		e.mirrors = append(e.mirrors, mir)
		e.work = append(e.work, work)
		var trs []collective.Transport
		if cfg.Transports != nil {
			trs = cfg.Transports(tp, cfg.CP)
		} else {
			trs = collective.NewInprocGroup(cfg.CP)
		}
		if len(trs) != cfg.CP {
			e.Close()
			return nil, fmt.Errorf("engine: %d transports for cp %d", len(trs), cfg.CP)
		}
		e.trs = append(e.trs, trs)
		var gs []*collective.Group
		for _, tr := range trs {
			gs = append(gs, collective.NewGroup(tr))
		}
		e.groups = append(e.groups, gs)
	}
	return e, nil
}

// Config returns the engine's config.
func (e *Engine) Config() Config { return e.cfg }

// Shard returns the shard of (tp, cp), for statistics.
func (e *Engine) Shard(tp, cp int) *shard.Shard { return e.shards[tp][cp] }

// Close releases the transports and the engine's own backend.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	for _, trs := range e.trs {
		for _, tr := range trs {
			tr.Close()
		}
	}
	for _, row := range e.shards {
		for _, sh := range row {
			sh.Close()
		}
	}
	if e.ownBe != nil {
		e.ownBe.Close()
	}
	return nil
}

// owner is the CP rank of global page g.
func (e *Engine) owner(sq *seqState, g int) int { return sq.layout.Owner(g) }

// Create starts an empty sequence with the given placement.
func (e *Engine) Create(p plan.Placement) (SeqID, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	if p != plan.Striped && p != plan.Contiguous {
		return 0, fmt.Errorf("create: %w: placement %d", ErrBadInput, p)
	}
	id := e.nextID
	e.nextID++
	sq := &seqState{layout: plan.Layout{CP: e.cfg.CP, TP: e.cfg.TP, Placement: p, BlockPages: e.cfg.BlockPages},
		lens: make([]int, e.cfg.Layers)}
	for tp := range e.cfg.TP {
		var ids []pagestore.SeqID
		for cp := range e.cfg.CP {
			ids = append(ids, e.shards[tp][cp].Store().Create())
			if e.cfg.Selection == Replicated {
				e.mirrors[tp][cp].Create(uint64(id))
			}
		}
		sq.local = append(sq.local, ids)
	}
	e.seqs[id] = sq
	return id, nil
}

func (e *Engine) lookup(id SeqID) (*seqState, error) {
	if e.closed {
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

// Len returns a sequence's length (the shortest layer).
func (e *Engine) Len(id SeqID) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return 0, err
	}
	return slices.Min(sq.lens), nil
}

// Append appends n tokens to one layer of a sequence; k and v are
// [n][KVHeads][HeadDim] for the whole model. Each token goes to the CP rank
// that owns its page, split by KV heads over the TP ranks. Bad input and a
// pool too small change nothing.
func (e *Engine) Append(id SeqID, layer int, k, v []float32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	if err := e.checkKV(layer, k, v); err != nil {
		return fmt.Errorf("append seq %d: %w", id, err)
	}
	return e.append(id, sq, layer, k, v)
}

func (e *Engine) checkKV(layer int, k, v []float32) error {
	tok := e.cfg.KVHeads * e.cfg.HeadDim
	switch {
	case layer < 0 || layer >= e.cfg.Layers:
		return fmt.Errorf("%w: layer %d outside 0..%d", ErrBadInput, layer, e.cfg.Layers-1)
	case len(k) == 0 || len(k)%tok != 0 || len(v) != len(k):
		return fmt.Errorf("%w: k %d and v %d floats are not the same whole number of tokens of %d", ErrBadInput, len(k), len(v), tok)
	case !kernels.Finite(k) || !kernels.Finite(v):
		return fmt.Errorf("%w: non-finite key or value", ErrBadInput)
	}
	return nil
}

func (e *Engine) append(id SeqID, sq *seqState, layer int, k, v []float32) error {
	c := e.cfg
	tok := c.KVHeads * c.HeadDim
	n := len(k) / tok
	start := sq.lens[layer]
	// Capacity first, exactly, on every shard the append touches (new
	// pages and copy-on-write copies): a pool too small changes nothing.
	count := make([]int, c.CP)
	for t := start; t < start+n; t++ {
		count[e.owner(sq, t/c.PageSize)]++
	}
	for tp := range c.TP {
		for cp := range c.CP {
			if count[cp] == 0 {
				continue
			}
			if _, err := e.shards[tp][cp].Store().CheckAppend(sq.local[tp][cp], layer, count[cp]); err != nil {
				return fmt.Errorf("append seq %d layer %d on shard (tp %d, cp %d): %w", id, layer, tp, cp, err)
			}
		}
	}
	// Route runs of tokens that share an owner. With one TP rank a run is
	// a contiguous slice of k and v, passed as is; with more, each rank's
	// heads are gathered into scratch.
	var kt, vt []float32
	if c.TP > 1 {
		kt = make([]float32, 0, n*e.kvT*c.HeadDim)
		vt = make([]float32, 0, n*e.kvT*c.HeadDim)
	}
	for t0 := 0; t0 < n; {
		g := (start + t0) / c.PageSize
		r := e.owner(sq, g)
		t1 := t0 + 1
		for t1 < n && e.owner(sq, (start+t1)/c.PageSize) == r {
			t1++
		}
		for tp := range c.TP {
			if c.TP == 1 {
				kt, vt = k[t0*tok:t1*tok], v[t0*tok:t1*tok]
			} else {
				kt, vt = kt[:0], vt[:0]
				lo, hi := tp*e.kvT*c.HeadDim, (tp+1)*e.kvT*c.HeadDim
				for t := t0; t < t1; t++ {
					kt = append(kt, k[t*tok+lo:t*tok+hi]...)
					vt = append(vt, v[t*tok+lo:t*tok+hi]...)
				}
			}
			if err := e.shards[tp][r].Append(sq.local[tp][r], layer, kt, vt); err != nil {
				if t0 > 0 || tp > 0 {
					sq.broken = true
				}
				return fmt.Errorf("append seq %d layer %d on shard (tp %d, cp %d): %w", id, layer, tp, r, err)
			}
			if c.Selection == Replicated {
				for cp := range c.CP {
					if err := e.mirrors[tp][cp].Append(uint64(id), layer, kt); err != nil {
						sq.broken = true
						return fmt.Errorf("append seq %d: %w", id, err)
					}
				}
			}
		}
		sq.lens[layer] += t1 - t0
		t0 = t1
	}
	return nil
}

// Fork makes a child sharing every page with the parent on every shard
// (copy-on-write tails).
func (e *Engine) Fork(id SeqID) (SeqID, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return 0, fmt.Errorf("fork: %w", err)
	}
	if slices.Min(sq.lens) != slices.Max(sq.lens) {
		return 0, fmt.Errorf("fork seq %d: %w", id, pagestore.ErrUnevenLayers)
	}
	child := &seqState{layout: sq.layout, lens: slices.Clone(sq.lens)}
	cid := e.nextID
	for tp := range e.cfg.TP {
		var ids []pagestore.SeqID
		for cp := range e.cfg.CP {
			lid, err := e.shards[tp][cp].Fork(sq.local[tp][cp])
			if err != nil {
				// Undo the forks made so far.
				for c2, done := range ids {
					e.shards[tp][c2].Release(done)
				}
				for t := range tp {
					for c2, l := range child.local[t] {
						e.shards[t][c2].Release(l)
					}
				}
				return 0, fmt.Errorf("fork seq %d on shard (tp %d, cp %d): %w", id, tp, cp, err)
			}
			ids = append(ids, lid)
		}
		child.local = append(child.local, ids)
	}
	if e.cfg.Selection == Replicated {
		for tp := range e.cfg.TP {
			for cp := range e.cfg.CP {
				if err := e.mirrors[tp][cp].Clone(uint64(id), uint64(cid)); err != nil {
					return 0, fmt.Errorf("fork seq %d: %w", id, err)
				}
			}
		}
	}
	e.nextID++
	e.seqs[cid] = child
	return cid, nil
}

// Rollback drops the last n tokens of every layer on every shard.
func (e *Engine) Rollback(id SeqID, n int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return fmt.Errorf("rollback: %w", err)
	}
	l := sq.lens[0]
	if slices.Min(sq.lens) != slices.Max(sq.lens) {
		return fmt.Errorf("rollback seq %d: %w", id, pagestore.ErrUnevenLayers)
	}
	if n <= 0 || n > l {
		return fmt.Errorf("rollback seq %d: %w: %d tokens of %d", id, ErrBadInput, n, l)
	}
	c := e.cfg
	newLen := l - n
	// Tokens to drop per CP rank.
	drop := make([]int, c.CP)
	for t := newLen; t < l; t++ {
		drop[e.owner(sq, t/c.PageSize)]++
	}
	// Check every shard first (range, copy-on-write capacity) so that a
	// rollback that cannot complete changes nothing.
	for tp := range c.TP {
		for cp := range c.CP {
			if drop[cp] == 0 {
				continue
			}
			if err := e.shards[tp][cp].Store().CheckRollback(sq.local[tp][cp], drop[cp]); err != nil {
				return fmt.Errorf("rollback seq %d on shard (tp %d, cp %d): %w", id, tp, cp, err)
			}
		}
	}
	changed := false
	for tp := range c.TP {
		for cp := range c.CP {
			if drop[cp] == 0 {
				continue
			}
			if err := e.shards[tp][cp].Rollback(sq.local[tp][cp], drop[cp]); err != nil {
				sq.broken = changed
				return fmt.Errorf("rollback seq %d on shard (tp %d, cp %d): %w", id, tp, cp, err)
			}
			changed = true
		}
	}
	for i := range sq.lens {
		sq.lens[i] = newLen
	}
	if c.Selection == Replicated {
		return e.refreshMirrors(id, sq, newLen)
	}
	return nil
}

// refreshMirrors truncates the mirrors and copies the cut tail page's
// summary from its owner, who rescanned it.
func (e *Engine) refreshMirrors(id SeqID, sq *seqState, newLen int) error {
	c := e.cfg
	tail := -1
	if newLen%c.PageSize != 0 {
		tail = newLen / c.PageSize
	}
	for tp := range c.TP {
		var recs [][]float32
		if tail >= 0 {
			r := e.owner(sq, tail)
			sh := e.shards[tp][r]
			lp := sq.layout.Place(r).Local(tail)
			table, err := sh.Store().AppendPageTable(nil, sq.local[tp][r])
			if err != nil {
				return err
			}
			for layer := range c.Layers {
				pg, err := sh.ReadPages(context.Background(), layer, table[lp:lp+1])
				if err != nil {
					return fmt.Errorf("refresh mirrors: %w", err)
				}
				recs = append(recs, pg.Summary)
			}
		}
		for cp := range c.CP {
			m := e.mirrors[tp][cp]
			if err := m.Truncate(uint64(id), newLen); err != nil {
				return err
			}
			for layer, rec := range recs {
				if err := m.SetPage(uint64(id), layer, tail, rec); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Release frees a sequence on every shard.
func (e *Engine) Release(id SeqID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	sq, ok := e.seqs[id]
	if !ok {
		return fmt.Errorf("release: %w: %d", ErrUnknownSequence, id)
	}
	var first error
	for tp := range e.cfg.TP {
		for cp := range e.cfg.CP {
			if err := e.shards[tp][cp].Release(sq.local[tp][cp]); err != nil && first == nil {
				first = err
			}
			if e.cfg.Selection == Replicated {
				e.mirrors[tp][cp].Drop(uint64(id))
			}
		}
	}
	delete(e.seqs, id)
	return first
}
