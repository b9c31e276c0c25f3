package worker

import (
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// RankSpec is one rank a Local hosts: its place in the grid, the backend
// that runs its kernels and its member of the TP group's CP transports
// (Rank().CP == Rank.CP, Size() == Config.CP). The caller keeps the
// backend and the transport and closes them after the Local.
type RankSpec struct {
	Rank      Rank
	Backend   kernels.Backend
	Transport collective.Transport
}

// Local is the in-process Worker: it hosts its ranks' shards in this
// process and runs their step programs on goroutines it owns for the
// length of a Layer call. Its methods serialize on one mutex (see the
// Worker threading contract).
type Local struct {
	cfg Config

	mu     sync.Mutex
	closed bool
	ranks  []*rank // in spec order
	byRank map[Rank]int
	seqs   map[uint64]*seqState
	step   *stepState // the open step (&state), nil if none
	state  stepState
	last   uint64 // id of the last step begun
	began  bool   // a step was ever begun (last is valid)

	// Persistence (Config.DataDir; see persist.go): the sequence table,
	// the recovered sequences not claimed yet (by key) and what
	// NewLocal recovered.
	db      metastore.SeqTable
	parked  map[uint64]*seqState
	nparked atomic.Int64 // len(parked), read without mu
	report  RecoveryReport
	// marked are the entry keys whose step marker is committed
	// (stepmark.go): deleted at EndStep.
	marked map[uint64]bool

	// Damage found after the open (damage.go): the stores' releases
	// not handled yet, the live sequences (by id) and parked ones (by
	// key) dropped for it, and all of them in the order found.
	damagePending []damageEvent
	lost          map[uint64]lostSeq
	lostKeys      map[uint64]lostSeq
	damagedSince  []DamagedSeq
	storesClosed  bool // Close closed the ranks' shards
}

var _ Worker = (*Local)(nil)

// rank is one hosted shard and what its step program keeps.
type rank struct {
	id     Rank
	sh     *shard.Shard
	tr     collective.Transport
	g      *collective.Group
	mirror *shard.Mirror // Replicated only
	w      rankWork
	// damagedSeen is how many of its store's damaged sequences
	// (pagestore.Store.DamagedFrom) the worker has handled.
	damagedSeen int
}

// seqState is a sequence of the worker: its layout and its store ids on
// the hosted ranks (indexed like Local.ranks).
type seqState struct {
	layout plan.Layout
	local  []pagestore.SeqID
	key    uint64 // its sequence table entry (Config.DataDir), 0 if none
	// grid is the grid its table entry names (RecoveredSeq.Grid): the
	// Config.GridID of the worker that created or forked it, kept by
	// Claim; "" until the entry is written.
	grid string
	// nodes is the placement its table entry names
	// (RecoveredSeq.Placement): Config.Placement when the entry was
	// first written.
	nodes []string
	// recovered is what its entry named at recovery (nil for a sequence
	// created or forked since): what Park restores.
	recovered *recoveredAs
	// reuse is the kept selection per hosted rank and layer (reuse.go,
	// plan.Policy.ReuseSteps); nil until a reusing policy keeps one.
	reuse [][]reuseSel
	// layerSel is the last layer selection per hosted rank (reuse.go,
	// plan.Policy.ReuseLayers); nil until a policy reusing layers keeps
	// one.
	layerSel []layerSel
}

// recoveredAs is a recovered sequence's id and grid at recovery.
type recoveredAs struct {
	seq  uint64
	grid string
}

// NewLocal builds the shards (and, for replicated selection, the summary
// mirrors) of the given ranks.
func NewLocal(cfg Config, ranks []RankSpec) (*Local, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(ranks) == 0 {
		return nil, errors.New("worker: no ranks to host")
	}
	need, err := cfg.HostBytes(len(ranks))
	if err != nil {
		return nil, fmt.Errorf("worker config: %w", err)
	}
	what := fmt.Sprintf("worker: %d shards of %d pages each", len(ranks), cfg.Capacity)
	if err := memlimit.Check(what, need, cfg.MemoryLimit); err != nil {
		return nil, err
	}
	cfg.Policy = cfg.policy()
	l := &Local{cfg: cfg, byRank: map[Rank]int{}, seqs: map[uint64]*seqState{}, parked: map[uint64]*seqState{},
		lost: map[uint64]lostSeq{}, lostKeys: map[uint64]lostSeq{}}
	if cfg.DataDir != "" {
		ids := make([]Rank, len(ranks))
		for i, sp := range ranks {
			ids[i] = sp.Rank
		}
		if err := l.openTable(ids); err != nil {
			return nil, err
		}
	}
	for i, sp := range ranks {
		r := sp.Rank
		switch {
		case r.TP < 0 || r.TP >= cfg.TP || r.CP < 0 || r.CP >= cfg.CP:
			l.Close()
			return nil, fmt.Errorf("worker: rank %v outside the %d x %d grid", r, cfg.TP, cfg.CP)
		case sp.Backend == nil || sp.Transport == nil:
			l.Close()
			return nil, fmt.Errorf("worker: rank %v needs a backend and a transport", r)
		case sp.Transport.Size() != cfg.CP || sp.Transport.Rank() != r.CP:
			l.Close()
			return nil, fmt.Errorf("worker: rank %v: transport is rank %d of %d, want %d of %d", r, sp.Transport.Rank(), sp.Transport.Size(), r.CP, cfg.CP)
		}
		if _, dup := l.byRank[r]; dup {
			l.Close()
			return nil, fmt.Errorf("worker: rank %v listed twice", r)
		}
		sh, err := shard.New(cfg.shardConfig(r), sp.Backend)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("worker: shard %v: %w", r, err)
		}
		rk := &rank{id: r, sh: sh, tr: sp.Transport, g: collective.NewGroup(sp.Transport)}
		if cfg.Mode == Replicated {
			rk.mirror = shard.NewMirror(cfg.Layers, cfg.KVHeadsPerRank(), cfg.HeadDim, cfg.PageSize)
		}
		l.ranks = append(l.ranks, rk)
		l.byRank[r] = i
	}
	if l.db != nil {
		if err := l.recoverTable(); err != nil {
			l.Close()
			return nil, err
		}
		// Damage a scrub found during the recovery: recoverTable
		// reported it (or the sequence is dropped now).
		l.mu.Lock()
		l.sweepDamaged(false)
		l.mu.Unlock()
	}
	return l, nil
}

// CheckBatch is BeginStep's first check of a batch of n sequences,
// seqs their ids in order, made before anything is allocated for the
// batch (a node runs it before decoding a BeginStep's entries): a batch
// larger than the worker's live sequences must name one it does not hold
// (ErrUnknownSequence, the first such) or one twice (ErrBadMessage). nil
// when the batch is not larger; BeginStep checks the rest.
func (l *Local) CheckBatch(n int, seqs iter.Seq[uint64]) error {
	l.lock()
	defer l.unlock()
	return l.checkBatch(n, seqs)
}

// checkBatch is CheckBatch with l.mu held.
func (l *Local) checkBatch(n int, seqs iter.Seq[uint64]) error {
	if n <= len(l.seqs) {
		return nil
	}
	for s := range seqs {
		if _, err := l.lookup(s); err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: a batch of %d sequences, the worker holds %d: one appears twice", ErrBadMessage, n, len(l.seqs))
}

// Config returns the worker's config.
func (l *Local) Config() Config { return l.cfg }

// Ranks returns the hosted ranks in the order they were given.
func (l *Local) Ranks() []Rank {
	out := make([]Rank, len(l.ranks))
	for i, rk := range l.ranks {
		out[i] = rk.id
	}
	return out
}

// Shard returns the shard of a hosted rank (nil if not hosted): an
// in-process accessor for statistics and for the diagnostics that read
// keys in place; not part of the Worker boundary.
func (l *Local) Shard(r Rank) *shard.Shard {
	if i, ok := l.byRank[r]; ok {
		return l.ranks[i].sh
	}
	return nil
}

// StoreSeq returns the store id of sequence seq on hosted rank r: an
// in-process accessor for diagnostics (with [Local.Shard]); not part of
// the Worker boundary. The caller keeps the sequence from changing while
// it reads the shard.
func (l *Local) StoreSeq(seq uint64, r Rank) (pagestore.SeqID, error) {
	l.lock()
	defer l.unlock()
	i, ok := l.byRank[r]
	if !ok {
		return 0, fmt.Errorf("%w: %v", ErrNotHosted, r)
	}
	sq, ok := l.seqs[seq]
	if !ok {
		return 0, fmt.Errorf("%w: %d", ErrUnknownSequence, seq)
	}
	return sq.local[i], nil
}

// Close frees the shards' device pools. A persisting worker
// (Config.DataDir) first persists every sequence in full, tail pages and
// recovered sequences not claimed included, and closes its data
// directory. The backends and transports stay the caller's. Calls after
// Close fail with ErrClosed.
func (l *Local) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	var first error
	if st := l.step; st != nil && l.db != nil {
		// The ranks save tail pages below: the open step's tokens
		// reach the disk, so its markers must be there first.
		var idx []int
		for si := range st.sq {
			idx = append(idx, si)
		}
		if err := l.putMarks(st, idx); err != nil {
			first = fmt.Errorf("worker: close: the open step's appends are saved without their marker: %w", err)
		}
	}
	l.sweepDamaged(true)
	l.closed = true
	for _, rk := range l.ranks {
		if err := rk.sh.Close(); err != nil && first == nil {
			first = err
		}
	}
	l.storesClosed = true
	l.sweepDamaged(true) // what the scrub found until it stopped
	if l.db != nil {
		if err := l.db.Close(); err != nil && first == nil {
			first = fmt.Errorf("worker: close: %w", l.ioError("close sequence table", l.tablePath(), err))
		}
	}
	return first
}

// rankOf returns the index of hosted rank r.
func (l *Local) rankOf(r Rank) (int, error) {
	i, ok := l.byRank[r]
	if !ok {
		return 0, fmt.Errorf("%w: %v", ErrNotHosted, r)
	}
	return i, nil
}

// lookup returns a live sequence (l.mu held).
func (l *Local) lookup(seq uint64) (*seqState, error) {
	if l.closed {
		return nil, ErrClosed
	}
	sq, ok := l.seqs[seq]
	if !ok {
		if ls, lost := l.lost[seq]; lost {
			return nil, fmt.Errorf("sequence %d: %w", seq, ls.err)
		}
		return nil, fmt.Errorf("%w: %d", ErrUnknownSequence, seq)
	}
	return sq, nil
}

// mutable returns a live sequence that no open step holds (l.mu held).
func (l *Local) mutable(seq uint64) (*seqState, error) {
	sq, err := l.lookup(seq)
	if err != nil {
		return nil, err
	}
	if st := l.step; st != nil {
		if _, busy := st.index[seq]; busy {
			return nil, fmt.Errorf("%w: sequence %d is in step %d", ErrStepOpen, seq, st.id)
		}
	}
	return sq, nil
}

// checkLen checks that hosted rank i holds, in layer, exactly the tokens
// of [0, n) the layout gives it, and that its mirror (replicated
// selection) holds all n (l.mu held).
func (l *Local) checkLen(i int, seq uint64, sq *seqState, layer, n int) error {
	rk := l.ranks[i]
	want := owned(sq.layout.Place(rk.id.CP), l.cfg.PageSize, n)
	got, err := rk.sh.Store().LayerLen(sq.local[i], layer)
	if err != nil {
		return fmt.Errorf("rank %v: %w", rk.id, err)
	}
	if got != want {
		return fmt.Errorf("%w: sequence %d layer %d: rank %v holds %d tokens, a length of %d gives it %d", ErrBadMessage, seq, layer, rk.id, got, n, want)
	}
	if rk.mirror != nil {
		_, m, err := rk.mirror.Summary(seq, layer)
		if err != nil {
			return fmt.Errorf("rank %v: %w", rk.id, err)
		}
		if m != n {
			return fmt.Errorf("%w: sequence %d layer %d: rank %v mirrors %d tokens, want %d", ErrBadMessage, seq, layer, rk.id, m, n)
		}
	}
	return nil
}

// checkTokens checks a token tensor of n tokens of the rank's KV heads.
func (l *Local) checkTokens(what string, x []float32, n int) error {
	want := n * l.cfg.KVHeadsPerRank() * l.cfg.HeadDim
	if len(x) != want {
		return fmt.Errorf("%w: %s has %d floats, want %d (%d tokens of %d KV heads of %d)", ErrBadMessage, what, len(x), want, n, l.cfg.KVHeadsPerRank(), l.cfg.HeadDim)
	}
	if !kernels.Finite(x) {
		return fmt.Errorf("%w: %s is not finite", ErrBadMessage, what)
	}
	return nil
}

func (l *Local) checkLayer(layer int) error {
	if layer < 0 || layer >= l.cfg.Layers {
		return fmt.Errorf("%w: layer %d outside 0..%d", ErrBadMessage, layer, l.cfg.Layers-1)
	}
	return nil
}
