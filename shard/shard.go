package shard

import (
	"context"
	"errors"
	"fmt"
	"github.com/questrt/questrt/decode"
	"sync"
	"sync/atomic"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// Config describes one shard.
type Config struct {
	// Store is the shard's page pool (its KV heads, all layers). Its
	// Geometry is the shard's: the query heads this shard serves
	// (Store.QHeads, a multiple of Store.KVHeads; default 32), its KV
	// heads, head dim and page size.
	//
	// Store.DeviceBudget > 0 turns offload on (see pagestore.Config): at
	// most that many pages' K/V stay in the pool arrays, the others in
	// Store.Tier, and every step brings the pages it attends in before
	// attention (see [Program]). New pins each sequence's sink and
	// local pages (Store.PinFirst and PinLast raised to the policy's
	// SinkPages and LocalPages). Steps then run phased, never fused.
	// With DeviceResident the backend must be a kernels.SlotStore (the
	// CUDA backend): the device keeps every page's summaries and the
	// K/V of the budget, the tier is the backend's pinned host memory
	// (Store.Tier must be nil; DataDir is not available). Default 0: off.
	Store pagestore.Config
	// Policy is the page-selection policy. Default DefaultPolicy(). Its
	// PageSize is ignored: Store.PageSize replaces it (see
	// plan.Policy.WithGeometry; New keeps the replaced policy).
	Policy plan.Policy
	// DeviceResident keeps the pages (K, V and summaries of every layer)
	// only in the backend's device memory, which must implement
	// kernels.DeviceStore: appends, copy-on-write copies, rollback rescans
	// and recycling run on the device, the page tables are followed by a
	// device copy, steps hand the kernels the device pools and tables, and
	// the host keeps only the metadata (page tables, lengths, refcounts). The oracle selector, which reads keys on
	// the host, copies the pages it scores back; diagnostics copy keys
	// back a bounded chunk at a time (see [PageKeys]). Default false: host
	// pools, which diagnostics read in place.
	DeviceResident bool

	// PrefetchPages (K_prefetch) turns prefetch on for an offloading
	// shard (Store.DeviceBudget > 0): after each step's selection the
	// shard ranks, per selection row, the next PrefetchPages pages below
	// the row's selected ones (the best n + PrefetchPages of the plan's
	// candidates, n the row's selected pages on this shard), and starts
	// reading those that are not resident from the tier into device
	// slots for the next step, on a goroutine of the shard's own (started
	// by New, stopped by Close), while the step attends. A prefetch takes
	// free slots and evicts only clean unpinned pages that neither the
	// step in progress nor any layer's step of the previous token
	// attended (so it never displaces a page the model just used: with a
	// device budget that the recent working sets fill, it fetches
	// nothing), never writes to the tier, and never changes what a step
	// selects or computes: outputs are bit-identical to prefetch off. A step that needs a page whose read is in flight
	// waits for it; one whose read has not started it reads itself (see
	// pagestore.Store.ReservePrefetch). Steps that attend in several
	// passes, dense steps and selectors without scores (recent) do not
	// prefetch. The counters are in [OffloadStats]. A shard alone ranks
	// the step's K plus PrefetchPages pages per row in one ranking call
	// and splits them; a rank of a CP group ranks its prefetch from the
	// step's scores on the host (see [Program]). In [0, Store.Capacity];
	// 0 (the default): off.
	PrefetchPages int
	// PrefetchCrossLayer ranks the prefetch of a step of layer l < Layers-1
	// by layer l+1's summaries scored with layer l's queries (one more
	// score and top-K per step): a prediction of the pages the next
	// layer's step will select, fetched while this layer attends. The
	// last layer ranks its own scores. Needs PrefetchPages > 0. Default
	// false: each layer's own scores predict its next step.
	PrefetchCrossLayer bool
}

// DefaultConfig returns a Llama-3.1-8B shaped shard (32 query heads, 8 KV
// heads, D = 128, S = 16) with the default store and policy.
func DefaultConfig() Config {
	return Config{Store: pagestore.DefaultConfig(), Policy: plan.DefaultPolicy()}
}

// Validate reports whether the config is usable.
func (c Config) Validate() error {
	if err := c.Store.Validate(); err != nil {
		return fmt.Errorf("shard config: %w", err)
	}
	if err := c.policy().Validate(); err != nil {
		return fmt.Errorf("shard config: %w", err)
	}
	if err := c.shape().Validate(); err != nil {
		return fmt.Errorf("shard config: %w", err)
	}
	switch {
	case c.PrefetchPages < 0 || c.PrefetchPages > c.Store.Capacity:
		return fmt.Errorf("shard config: %w: PrefetchPages = %d, want 0 (off) .. Capacity = %d", pagestore.ErrInvalidConfig, c.PrefetchPages, c.Store.Capacity)
	case c.PrefetchPages > 0 && !c.Store.Offload():
		return fmt.Errorf("shard config: %w: PrefetchPages = %d without a device budget: prefetch needs offload (Store.DeviceBudget > 0)", pagestore.ErrInvalidConfig, c.PrefetchPages)
	case c.PrefetchCrossLayer && c.PrefetchPages == 0:
		return fmt.Errorf("shard config: %w: PrefetchCrossLayer without PrefetchPages (prefetch is off)", pagestore.ErrInvalidConfig)
	}
	return nil
}

// policy is c.Policy with the store's page size.
func (c Config) policy() plan.Policy { return c.Policy.WithGeometry(c.Store.Geometry) }

func (c Config) shape() kernels.Shape {
	g := c.Store.Geometry
	return kernels.Shape{QHeads: g.QHeads, KVHeads: g.KVHeads, HeadDim: g.HeadDim, PageSize: g.PageSize}
}

// Shard is one device's slice of the KV: its page store and the local part
// of a decode step. Steps and appends on one shard serialize on a mutex;
// the kernels parallelize inside a step.
type Shard struct {
	cfg   Config
	shape kernels.Shape
	store *pagestore.Store
	be    kernels.Backend

	mu sync.Mutex
	ws workspace

	ds       kernels.DeviceStore // nil unless DeviceResident
	dev      []any               // device pool per layer (DeviceResident; slot pools with offload)
	tables   any                 // device page tables (DeviceResident)
	hostTier kernels.HostTier    // the backend's host tier (DeviceResident with offload)
	slots    *slotData           // the store's slot data (DeviceResident with offload)
	slotTab  any                 // the device page -> slot table (offload on a kernels.SlotTables)
	slotTabs kernels.SlotTables

	readBack atomic.Int64 // bytes of page data copied out for host readers (ReadBackBytes)

	off    *offload      // nil unless Store.DeviceBudget > 0
	pf     *prefetcher   // nil unless PrefetchPages > 0
	pfPlan *prefetchPlan // with pf

	hier *hierState // box trees (Policy.HierGroup), made at the first search

	toppStats TopPStats // Policy.TopP's counts (toppCut with count)
}

// New builds a shard over backend be (which the caller keeps and closes).
func New(cfg Config, be kernels.Backend) (*Shard, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Policy = cfg.policy()
	if _, cpu := be.(*kernels.CPU); cfg.Policy.TopPOn() && (!cpu || cfg.DeviceResident || cfg.Store.Offload()) {
		return nil, fmt.Errorf("shard: top-p %v: %w (backend %s, device resident %v, offload %v)",
			cfg.Policy.TopP, kernels.ErrTopPUnsupported, be.Name(), cfg.DeviceResident, cfg.Store.Offload())
	}
	if cfg.Policy.SubBoxesOn() {
		if _, cpu := be.(*kernels.CPU); !cpu || cfg.DeviceResident {
			return nil, fmt.Errorf("shard: %d sub-boxes: %w (backend %s, device resident %v)", cfg.Policy.SubBoxes, kernels.ErrSubBoxes, be.Name(), cfg.DeviceResident)
		}
		cfg.Store.SubBoxes = cfg.Policy.SubBoxes // the store refuses offload, persistence and fp8
	}
	if cfg.Store.Offload() {
		cfg.Store.PinFirst = max(cfg.Store.PinFirst, cfg.Policy.SinkPages)
		cfg.Store.PinLast = max(cfg.Store.PinLast, cfg.Policy.LocalPages)
	}
	s := &Shard{cfg: cfg, shape: cfg.shape(), be: be}
	if !cfg.DeviceResident {
		st, err := pagestore.New(cfg.Store)
		if err != nil {
			return nil, fmt.Errorf("shard: %w", err)
		}
		s.store = st
		if cfg.Store.Offload() {
			s.off = newOffload(cfg.Store)
			if cfg.PrefetchPages > 0 {
				s.pfPlan = newPrefetchPlan(cfg)
				s.pf = newPrefetcher(st)
			}
		}
		return s, nil
	}
	if cfg.Store.Offload() {
		if err := s.newDeviceOffload(cfg); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	}
	ds, ok := be.(kernels.DeviceStore)
	if !ok {
		return nil, fmt.Errorf("shard: backend %s keeps no device memory (DeviceResident needs a kernels.DeviceStore)", be.Name())
	}
	s.ds = ds
	c := cfg.Store
	for l := range c.Layers {
		pool, err := ds.NewPool(context.Background(), c.Capacity, c.KVHeads, c.HeadDim, c.PageSize)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("shard: device pool for layer %d: %w", l, err)
		}
		s.dev = append(s.dev, pool)
	}
	tables, err := ds.NewTables(context.Background())
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("shard: device page tables: %w", err)
	}
	s.tables = tables
	st, err := pagestore.NewWithData(c, &deviceData{ds: ds, pools: s.dev, tables: tables, pages: c.Capacity})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("shard: %w", err)
	}
	s.store = st
	return s, nil
}

// Close releases the shard's device pools (the backend stays the
// caller's), stops the prefetcher of a prefetching shard (a read in
// flight is cancelled; queued reservations are given back) and closes
// the store's own memory tier of an offloading shard, and closes a
// persisting store (Store.DataDir), which first persists every sequence
// in full, tail pages included. The host store is
// garbage collected. Close may be called more than once.
func (s *Shard) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pf != nil {
		s.pf.stop()
	}
	var first error
	if s.store != nil && (s.off != nil || s.cfg.Store.DataDir != "") {
		first = s.store.Close() // a persisting store persists its tails
	}
	for _, p := range s.dev {
		if err := s.ds.FreePool(context.Background(), p); err != nil && first == nil {
			first = err
		}
	}
	if s.tables != nil {
		if err := s.ds.FreeTables(context.Background(), s.tables); err != nil && first == nil {
			first = err
		}
	}
	if s.hostTier != nil {
		if err := s.hostTier.Close(); err != nil && first == nil {
			first = err
		}
	}
	if s.slotTab != nil {
		if err := s.slotTabs.FreeSlotTable(context.Background(), s.slotTab); err != nil && first == nil {
			first = err
		}
	}
	s.dev, s.tables, s.hostTier, s.slotTab = nil, nil, nil, nil
	return first
}

// layer returns the kernels' view of one layer: the host pools, or the
// device pool of a DeviceResident shard.
func (s *Shard) layer(l int) kernels.Layer {
	if s.dev != nil {
		return kernels.Layer{Device: s.dev[l]}
	}
	h := s.store.Layer(l)
	return kernels.Layer{K: h.K, V: h.V, Summary: h.Summary, K8: h.K8, V8: h.V8, KScale: h.KScale, VScale: h.VScale,
		SubBoxes: s.cfg.Store.SubBoxes, Sub: h.Sub}
}

// Fork forks a sequence of the shard's store (no page changes).
func (s *Shard) Fork(id pagestore.SeqID) (pagestore.SeqID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store.Fork(id)
}

// Rollback rolls a sequence back by n tokens (the tail page is rescanned
// where its pages live).
func (s *Shard) Rollback(id pagestore.SeqID, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store.Rollback(id, n)
}

// Truncate cuts each layer of a sequence of the shard's store to its own
// length (pagestore.Store.Truncate).
func (s *Shard) Truncate(id pagestore.SeqID, lens []int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store.Truncate(id, lens)
}

// Release releases a sequence of the shard's store.
func (s *Shard) Release(id pagestore.SeqID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropHier(id)
	return s.store.Release(id)
}

// Config returns the shard's config.
func (s *Shard) Config() Config { return s.cfg }

// Shape returns the head geometry of the shard.
func (s *Shard) Shape() kernels.Shape { return s.shape }

// Store exposes the shard's page store for statistics, creation and
// read-only queries. Changes go through the shard (Append, Fork, Rollback,
// Release), which serializes them with steps. The store's host arrays
// (Layer, PageKV, PageSummary) exist only when the shard is not
// DeviceResident; ReadPages works either way.
func (s *Shard) Store() *pagestore.Store { return s.store }

// Append appends tokens to one layer of a sequence (k, v: [n][KVHeads][D]),
// serialized with steps.
func (s *Shard) Append(id pagestore.SeqID, layer int, k, v []float32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store.Append(id, layer, k, v)
}

// SeqStep is one sequence's part of a step.
type SeqStep struct {
	Seq pagestore.SeqID
	// Q is [QHeads][HeadDim].
	Q []float32
	// K and V, when set, are the new token's [KVHeads][HeadDim], appended to
	// the layer before attention (so the token attends to itself).
	K, V []float32
	// BudgetTokens overrides the policy's budget for this sequence (0: the
	// policy's).
	BudgetTokens int
}

// StepResult holds a step's outputs. Reuse one across steps to avoid
// allocation.
type StepResult struct {
	// O is [sequences][QHeads][HeadDim]; LSE is [sequences][QHeads].
	O, LSE []float32
	// Plans is the page plan of each sequence.
	Plans []plan.Plan
	// Diag holds one entry per sequence when the step asked for
	// diagnostics.
	Diag []Diagnostics
	// Time is the wall time of the step's phases (whole batch); for a
	// queued step, the time to queue it.
	Time PhaseTimes
	// Queued reports that O and LSE are written by the next Sync (see
	// StepOptions.Queue); the caller must not read or reuse them, nor
	// this result, until Sync returns.
	Queued bool
}

// PhaseTimes is the wall time of each phase of a step. A fused step
// (see fused) reports its whole time as Fused and zero phases. Recall
// is the part of the attention an offloading shard spent bringing pages into the
// device pool (zero without offload).
type PhaseTimes struct {
	Score, TopK, Attend, Fused time.Duration
	Recall                     time.Duration
	// TopP is the top-p pruning's host work (toppLocal and toppCut;
	// Policy.TopP), the attention over the kept tokens being Attend.
	TopP time.Duration
	// Select and Merge are the waits of a program run with a Group (see
	// Run): the selection exchanges (candidates, top-p messages) and the
	// merge of the partial states. Zero for a shard alone.
	Select, Merge time.Duration
}

// Diagnostics describe one sequence's selection in one step (see
// decode.Diagnostics, the one declaration).
type Diagnostics = decode.Diagnostics

// StepOptions tune one step.
type StepOptions struct {
	// Diagnostics computes Diagnostics (costs a dense pass).
	Diagnostics bool
	// TopR is R for Recall. Default 10.
	TopR int
	// StopRule, with Diagnostics, replays the stop rules of notes 3.2 on
	// every sparse sequence (Diagnostics.Stop, see StopCollector). Off by
	// default.
	StopRule bool
	// ForceDense attends every page regardless of the policy (a dense
	// reference step on the same data).
	ForceDense bool
	// Phased runs score, top-K and attention as separate backend calls
	// even when the backend can fuse them (see fused): per-phase
	// times, and a reference for the fused path. Diagnostics imply it.
	Phased bool
	// Queue lets a fused step (see fused) whose backend is a
	// kernels.QueuedStepper return without waiting for the device:
	// StepResult.Queued is then set and O and LSE are written by the
	// next Sync, one host synchronisation for many layers. A step that
	// cannot be queued runs as without Queue (Queued false, outputs
	// ready). Ignored with Phased or Diagnostics.
	Queue bool
}

// ErrBadInput marks a request rejected before any state changed.
var ErrBadInput = errors.New("shard: bad input")

type workspace struct {
	parts []SeqPart
	ls    LocalStep
	sel   Chosen
	prog  Program
}

// Step runs one decode step of one layer for a batch of sequences on this
// shard: append the new tokens (if given), plan pages per sequence, score,
// select top-K, and attend. Sequences may have different lengths and
// budgets; nothing is padded.
func (s *Shard) Step(ctx context.Context, layer int, reqs []SeqStep, opt StepOptions, res *StepResult) error {
	res.Queued = false
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkStep(layer, reqs); err != nil {
		return err
	}
	for i, r := range reqs {
		if r.K == nil && r.V == nil {
			continue
		}
		if err := s.store.Append(r.Seq, layer, r.K, r.V); err != nil {
			// Earlier sequences of this batch keep their appended token;
			// the error names the failing one.
			return fmt.Errorf("step layer %d: sequence %d (batch index %d): %w", layer, r.Seq, i, err)
		}
	}
	ws := &s.ws
	ws.parts = ws.parts[:0]
	res.Plans = res.Plans[:0]
	for _, r := range reqs {
		n, err := s.store.LayerLen(r.Seq, layer)
		if err != nil {
			return fmt.Errorf("step layer %d: %w", layer, err)
		}
		pages := s.cfg.Store.Pages(n)
		pl, err := s.cfg.Policy.Plan(layer, pages, r.BudgetTokens)
		if err != nil {
			return fmt.Errorf("step layer %d sequence %d: %w: %w", layer, r.Seq, ErrBadInput, err)
		}
		if opt.ForceDense {
			pl = pl.AsDense()
		}
		res.Plans = append(res.Plans, pl)
		ws.parts = append(ws.parts, SeqPart{Seq: r.Seq, Plan: pl, Q: r.Q})
	}
	ls := &ws.ls
	if err := s.begin(ls, layer, ws.parts, false); err != nil {
		return err
	}
	p := &ws.prog
	*p = Program{Phased: opt.Phased, Diagnostics: opt.Diagnostics, Fuse: true, Queue: opt.Queue}
	if opt.Queue {
		n := len(reqs)
		res.O = resize(res.O, n*s.shape.QHeads*s.shape.HeadDim)
		res.LSE = resize(res.LSE, n*s.shape.QHeads)
		p.QueueO, p.QueueLSE = res.O, res.LSE
	}
	pr, err := s.run(ctx, ls, &ws.sel, p)
	if err != nil {
		return fmt.Errorf("step layer %d: %w", layer, err)
	}
	res.Time = ls.Time
	res.Diag = res.Diag[:0]
	if pr.Queued {
		res.Queued = true
		return nil
	}
	res.O = append(res.O[:0], ls.O...)
	res.LSE = append(res.LSE[:0], ls.LSE...)
	if opt.Diagnostics {
		for i := range reqs {
			dg, err := s.diagnose(ctx, ls, i, res, opt)
			if err != nil {
				return fmt.Errorf("step layer %d diagnostics: %w", layer, err)
			}
			res.Diag = append(res.Diag, dg)
		}
	}
	return nil
}

// rankQuota is the candidate quota of a shard holding every page: the
// plan's whole ranked budget.
func rankQuota(pl plan.Plan) int { return pl.Rank }

func resize(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// checkStep validates a request before anything changes.
func (s *Shard) checkStep(layer int, reqs []SeqStep) error {
	sh := s.shape
	if layer < 0 || layer >= s.cfg.Store.Layers {
		return fmt.Errorf("step: %w: layer %d outside 0..%d", ErrBadInput, layer, s.cfg.Store.Layers-1)
	}
	if len(reqs) == 0 {
		return fmt.Errorf("step: %w: empty batch", ErrBadInput)
	}
	seen := make(map[pagestore.SeqID]bool, len(reqs))
	for i, r := range reqs {
		if seen[r.Seq] {
			return fmt.Errorf("step: %w: sequence %d appears twice in the batch", ErrBadInput, r.Seq)
		}
		seen[r.Seq] = true
		if len(r.Q) != sh.QHeads*sh.HeadDim {
			return fmt.Errorf("step: %w: batch index %d: query has %d floats, want %d", ErrBadInput, i, len(r.Q), sh.QHeads*sh.HeadDim)
		}
		if !kernels.Finite(r.Q) {
			return fmt.Errorf("step: %w: batch index %d: non-finite query", ErrBadInput, i)
		}
		if (r.K == nil) != (r.V == nil) || (r.K != nil && len(r.K) != sh.KVHeads*sh.HeadDim) {
			return fmt.Errorf("step: %w: batch index %d: new token k/v must both be [%d][%d]", ErrBadInput, i, sh.KVHeads, sh.HeadDim)
		}
		if !kernels.Finite(r.K) || !kernels.Finite(r.V) {
			return fmt.Errorf("step: %w: batch index %d: non-finite new key or value", ErrBadInput, i)
		}
		if r.BudgetTokens < 0 || (r.BudgetTokens > 0 && r.BudgetTokens < s.cfg.Policy.PageSize) {
			return fmt.Errorf("step: %w: batch index %d: budget %d tokens is below one page", ErrBadInput, i, r.BudgetTokens)
		}
		n, err := s.store.LayerLen(r.Seq, layer)
		if err != nil {
			return fmt.Errorf("step: %w", err)
		}
		if n == 0 && r.K == nil {
			return fmt.Errorf("step: %w: sequence %d has no tokens in layer %d", ErrBadInput, r.Seq, layer)
		}
	}
	return nil
}
