// Package engine is the coordinator of sharded Quest decode steps, in one
// process for now: it lays each sequence out over CP x TP shards (pages
// over CP ranks, KV heads over TP ranks; a plan.Layout per sequence),
// keeps the sequence table (layout, lengths, broken flag), validates every
// request, routes appends to the ranks that own each token's page, and
// runs a decode step for a batch of sequences through the workers that
// host the shards (package worker; one in-process worker.Local per rank).
// The coordinator talks to the workers only through worker.Worker's plain
// messages: one BeginStep per step carrying the plan once, one Layer call
// per layer with the query heads and new tokens, partial states back. The
// workers' ranks do the rest among themselves through package collective:
// local scoring and candidates on every rank, a global top-K per
// (sequence, row), sparse attention over the selected and forced pages,
// and a merge of the partial states at CP rank 0 of every TP group.
//
// Selection across CP ranks has three modes: Exact (default; an all-gather
// of each rank's local top candidates gives every rank the same global
// top-K, equal to a single shard's), Union (no exchange: each rank keeps
// its local top ceil(K'/N), K' the page budget minus the forced pages; an
// approximation) and Replicated (every rank
// mirrors all summaries and selects alone; equal to a single shard's).
package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/offload"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// Selection is how CP ranks agree on the pages of a step: the CP
// selection mode of package plan (exact, union, replicated).
type Selection = plan.SelectMode

// The selection modes (see plan.Exact, plan.Union, plan.Replicated).
const (
	Exact      = plan.Exact
	Union      = plan.Union
	Replicated = plan.Replicated
)

// ParseSelection parses exact|union|replicated ("" means exact).
func ParseSelection(s string) (Selection, error) { return plan.ParseSelectMode(s) }

// Config describes an engine. DefaultConfig documents the defaults.
type Config struct {
	Layers int // transformer layers (4)
	// Geometry is the model's attention geometry: query heads (32), KV
	// heads (8; divisible by TP), head dim D (128), page size S (16) and
	// the page stores' storage type (plan.Float32, the zero value and the
	// only type of the CPU page store). Each shard holds its TP share.
	plan.Geometry
	CP int // context-parallel ranks per TP group (1)
	TP int // tensor-parallel ranks (1)
	// CapacityPages is the page pool of every shard (1024).
	CapacityPages int
	// Policy is the selection policy (plan.DefaultPolicy()). Its PageSize
	// is ignored: the geometry's page size replaces it (see
	// plan.Policy.WithGeometry; New and Open keep the replaced policy).
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
	// Settings turns offload on in every shard (see
	// worker.Config.Settings) and prefetch with it; the zero value, the
	// default, is off.
	offload.Settings
}

// WorkerConfig is the config every rank's worker runs with (the memory
// check is the engine's, over the whole grid: its MemoryLimit is -1).
func (c Config) WorkerConfig() worker.Config { return c.workerConfig() }

// workerConfig is the config every rank's worker runs with (the memory
// check is the engine's, over the whole grid).
func (c Config) workerConfig() worker.Config {
	return worker.Config{Layers: c.Layers, Geometry: c.Geometry,
		CP: c.CP, TP: c.TP, Capacity: c.CapacityPages, Policy: c.Policy.WithGeometry(c.Geometry), Mode: c.Selection,
		DeviceResident: c.DeviceResident, MemoryLimit: memlimit.NoLimit,
		Settings: c.Settings}
}

// preflight refuses a configuration whose host pools, over all CP x TP
// shards (and the summary mirrors of replicated selection), do not fit
// cfg.MemoryLimit. Device-resident pools live in device memory: only their
// host metadata counts.
func preflight(cfg Config) error {
	need, err := cfg.workerConfig().HostBytes(cfg.CP * cfg.TP)
	if err != nil {
		return fmt.Errorf("engine config: %w", err)
	}
	what := fmt.Sprintf("engine: %d x %d shards of %d pages each", cfg.TP, cfg.CP, cfg.CapacityPages)
	return memlimit.Check(what, need, cfg.MemoryLimit)
}

// DefaultConfig returns a single-shard engine with the documented defaults.
func DefaultConfig() Config {
	return Config{Layers: 4, Geometry: plan.Geometry{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}, CP: 1, TP: 1,
		CapacityPages: 1024, Policy: plan.DefaultPolicy(), BlockPages: 64, StepTimeout: 30 * time.Second}
}

// Validate reports whether the config is usable.
func (c Config) Validate() error {
	switch {
	case c.BlockPages < 1:
		return fmt.Errorf("engine config: block %d pages must be positive", c.BlockPages)
	case c.MemoryLimit < memlimit.NoLimit:
		return fmt.Errorf("engine config: memory limit %d: want bytes, 0 (available memory) or -1 (no check)", c.MemoryLimit)
	}
	// The rest is every rank's worker config (geometry, grid, policy, mode).
	if err := c.workerConfig().Validate(); err != nil {
		return fmt.Errorf("engine config: %w", err)
	}
	return nil
}

// SeqID names an engine sequence (decode.SeqID, the one declaration).
type SeqID = decode.SeqID

// Errors callers act on.
var (
	ErrUnknownSequence = errors.New("engine: unknown sequence")
	// ErrBadInput is decode.ErrBadInput: the step seam's callers test
	// for one error whichever runner they drive.
	ErrBadInput      = decode.ErrBadInput
	ErrPoolExhausted = pagestore.ErrPoolExhausted
	// ErrBroken: a sequence whose shards may disagree after a failure in
	// the middle of an append or rollback that passed its checks; it can
	// only be released.
	ErrBroken = errors.New("engine: sequence broken by a failed append or rollback")
	ErrClosed = errors.New("engine: closed")
)
