package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/internal/offload"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// Mode is the CP selection mode (plan.SelectMode: exact, union or
// replicated).
type Mode = plan.SelectMode

// The selection modes (see plan.Exact, plan.Union, plan.Replicated).
const (
	Exact      = plan.Exact
	Union      = plan.Union
	Replicated = plan.Replicated
)

// MinSequences is the least [Config.MaxSequences] allows.
const MinSequences = 1024

// MaxSequences is the most sequences a worker of c holds, live and
// parked together: CP x Capacity, the pages of one layer of one TP
// group (a sequence that holds a token holds at least one of them; more
// sequences than that are empty or share their pages as forks), and at
// least MinSequences. Every sequence costs a page table on every hosted
// rank, so this bounds that memory by the pools'. Create and Fork past
// it fail with ErrTooManySequences (RESOURCE_EXHAUSTED at the gRPC
// edge) and change nothing.
func (c Config) MaxSequences() int { return max(MinSequences, c.CP*c.Capacity) }

// Config describes the ranks a worker hosts: the model geometry, the CP x
// TP grid every sequence is laid out on, each rank's page pool, the
// policy that turns lengths and budgets into page plans, and the
// selection mode. Every worker of a cluster and its coordinator use the
// same Config (the coordinator derives the same plans from it).
// DefaultConfig documents the defaults.
type Config struct {
	Layers int // transformer layers (4)
	// Geometry is the model's attention geometry: query heads (32), KV
	// heads (8; divisible by TP), head dim D (128), page size S (16) and
	// the page stores' storage type (plan.Float32, the zero value and the
	// only type of the CPU page store). Each TP rank holds its share (see
	// [Config.RankGeometry]).
	plan.Geometry
	CP int // context-parallel ranks per TP group (1)
	TP int // tensor-parallel ranks (1)
	// Capacity is the page pool of every rank (1024 pages).
	Capacity int
	// Policy is the selection policy (plan.DefaultPolicy()). Its PageSize
	// is ignored: the geometry's page size replaces it (see
	// plan.Policy.WithGeometry; NewLocal keeps the replaced policy).
	Policy plan.Policy
	// Mode is the CP selection mode (Exact).
	Mode Mode
	// DeviceResident keeps every rank's pools in its backend's device
	// memory (see shard.Config.DeviceResident).
	DeviceResident bool
	// MemoryLimit bounds the host bytes of the hosted ranks' page pools
	// and summary mirrors together: a byte count, 0 (the default: the
	// memory available when NewLocal runs) or -1 (no check; an engine
	// that checked its whole grid passes -1).
	MemoryLimit int64
	// Settings turns offload on for every rank (DeviceBudgetPages, in
	// [0, Capacity]; 0, the default, is off) and prefetch with it (see
	// offload.Settings). With DeviceResident the backend must keep slot
	// pools (kernels.SlotStore, the CUDA backend): the tier is then its
	// pinned host memory.
	offload.Settings
	// DataDir, when set, makes the worker persistent: each hosted rank's
	// page store persists under DataDir/rank-tp<T>-cp<C> (see
	// pagestore.Config.DataDir) and the worker keeps its sequence table
	// (each sequence's id, layout and store ids) in DataDir/worker.db,
	// so that a NewLocal on the same directory recovers the sequences
	// (see [Local.Recovery] and [Local.Claim]). One worker per
	// directory: a second open fails with pagestore.ErrInUse. Not
	// available with DeviceResident or Replicated selection (the summary
	// mirrors are not persisted). "" (the default): nothing persists.
	DataDir string
	// Durability and SyncInterval are the page stores' durability mode
	// (pagestore.SyncOnWrite, the default, or pagestore.SyncPeriodic)
	// and flush period (0: pagestore.DefaultSyncInterval); unused
	// without DataDir. The sequence table commits (fsync) at every
	// Create, Fork, Release and Claim in either mode.
	Durability   pagestore.Durability
	SyncInterval time.Duration
	// Verify and ScrubRate are when the hosted ranks' page stores read
	// and check the pages they recover (pagestore.Config.Verify:
	// pagestore.VerifyOnRead, DefaultConfig's, at each page's first use
	// or by the scrub, a sequence whose page fails then being dropped
	// with pagestore.ErrDamaged, see damage.go; pagestore.VerifyAtOpen,
	// the zero value, in NewLocal) and the
	// bytes per second of each store's background scrub with
	// VerifyOnRead (pagestore.Config.ScrubRate: 0 is
	// pagestore.DefaultScrubRate, negative no scrub); unused without
	// DataDir.
	Verify    pagestore.Verify
	ScrubRate int64
	// GridID names the grid the worker is part of (worker/remote sets
	// the coordinator's grid id). A persisting worker records it with
	// each sequence it creates or forks ([RecoveredSeq.Grid]; a claim
	// under the same id keeps it, one under a new id records this one),
	// so that a coordinator matching recovered sequences over several
	// workers tells apart the sequences of different grids that had the
	// same id. Default "".
	GridID string
	// Placement is the name of the node hosting each rank of the grid
	// (by rank tp*CP+cp; worker/remote sets the coordinator's). A
	// persisting worker records it with each sequence
	// ([RecoveredSeq.Placement]), so that a coordinator adopts a
	// recovered sequence only on the nodes that held it. Default none.
	Placement []string
	// OnPersistError, when set with DataDir, is called with every failed
	// operation on a file of the data directory: the hosted ranks' page
	// stores' (pagestore.Config.OnPersistError: the periodic flusher's
	// and a Close's included) and the sequence table's. Its
	// *pagestore.IOError names the file (Path, Err) for the node's log;
	// its message, which the worker's callers get, does not. Called on
	// the goroutine that met the failure, possibly with locks held: it
	// must return quickly and not call the worker. Default nil.
	OnPersistError func(*pagestore.IOError)
	// CrashPoint, when set (crash tests), is called at named points of a
	// persisting worker's step: "step/marked" (BeginStep committed its
	// markers), "step/append" (a new token reached one rank's store in
	// one layer) and "step/end" (EndStep, before it deletes the
	// markers), with the worker's lock held, on the calling goroutine
	// (ranks of one worker call it concurrently). A test copies the data
	// directory there: what a kill -9 at that point leaves.
	CrashPoint func(point string)
}

// DefaultConfig returns a single-rank configuration with the documented
// defaults.
func DefaultConfig() Config {
	return Config{Layers: 4, Geometry: plan.Geometry{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}, CP: 1, TP: 1,
		Capacity: 1024, Policy: plan.DefaultPolicy(), Verify: pagestore.VerifyOnRead}
}

// Validate reports whether the config is usable.
func (c Config) Validate() error {
	switch {
	case c.Layers < 1 || c.QHeads < 1 || c.KVHeads < 1 || c.HeadDim < 1 || c.PageSize < 1:
		return errors.New("worker config: layers, heads, head dim and page size must be positive")
	case c.CP < 1 || c.TP < 1:
		return fmt.Errorf("worker config: cp %d and tp %d must be positive", c.CP, c.TP)
	case c.KVHeads%c.TP != 0:
		return fmt.Errorf("worker config: %d KV heads do not split over tp %d", c.KVHeads, c.TP)
	case c.QHeads%c.KVHeads != 0:
		return fmt.Errorf("worker config: %d query heads are not a multiple of %d KV heads", c.QHeads, c.KVHeads)
	case !c.DType.Known():
		return fmt.Errorf("worker config: unknown dtype %v", c.DType)
	case c.Capacity < 1:
		return fmt.Errorf("worker config: capacity %d pages must be positive", c.Capacity)
	case c.Mode < Exact || c.Mode > Replicated:
		return fmt.Errorf("worker config: unknown mode %d", c.Mode)
	case c.Mode == Replicated && c.Policy.Selector != plan.Quest && c.Policy.Selector != plan.Dense:
		return fmt.Errorf("worker config: replicated selection needs the quest or dense selector, not %v", c.Policy.Selector)
	case c.Mode == Replicated && c.Policy.SubBoxesOn():
		return fmt.Errorf("worker config: replicated selection with %d sub-boxes per page: the summary mirrors hold page boxes only", c.Policy.SubBoxes)
	case c.MemoryLimit < memlimit.NoLimit:
		return fmt.Errorf("worker config: memory limit %d: want bytes, 0 (available memory) or -1 (no check)", c.MemoryLimit)
	case c.DeviceBudgetPages < 0 || c.DeviceBudgetPages > c.Capacity:
		return fmt.Errorf("worker config: device budget %d pages: want 0 (offload off) .. capacity %d", c.DeviceBudgetPages, c.Capacity)
	case c.Eviction < pagestore.EvictLRU || c.Eviction > pagestore.EvictScore:
		return fmt.Errorf("worker config: unknown eviction policy %d", c.Eviction)
	case c.PrefetchPages < 0 || c.PrefetchPages > c.Capacity:
		return fmt.Errorf("worker config: prefetch %d pages: want 0 (off) .. capacity %d", c.PrefetchPages, c.Capacity)
	case c.PrefetchPages > 0 && c.DeviceBudgetPages == 0:
		return fmt.Errorf("worker config: prefetch %d pages without a device budget: prefetch needs offload", c.PrefetchPages)
	case c.PrefetchCrossLayer && c.PrefetchPages == 0:
		return errors.New("worker config: cross-layer prefetch without prefetch pages")
	case c.DataDir != "" && c.DeviceResident:
		return fmt.Errorf("worker config: data dir %s with device-resident pools: the device-resident store does not persist", c.DataDir)
	case c.DataDir != "" && c.Mode == Replicated:
		return fmt.Errorf("worker config: data dir %s with replicated selection: the summary mirrors are not persisted", c.DataDir)
	case c.Durability < pagestore.SyncOnWrite || c.Durability > pagestore.SyncPeriodic:
		return fmt.Errorf("worker config: unknown durability %d", int(c.Durability))
	case c.SyncInterval < 0:
		return fmt.Errorf("worker config: sync interval %v must not be negative", c.SyncInterval)
	case c.Verify < pagestore.VerifyAtOpen || c.Verify > pagestore.VerifyOnRead:
		return fmt.Errorf("worker config: unknown verify mode %d", int(c.Verify))
	}
	return c.policy().Validate()
}

// policy is c.Policy with the geometry's page size.
func (c Config) policy() plan.Policy { return c.Policy.WithGeometry(c.Geometry) }

// RankGeometry is the geometry of one TP rank: its share of the query
// and KV heads. Every per-rank config (page store, shard) takes its
// geometry from here.
func (c Config) RankGeometry() plan.Geometry { return c.Geometry.Split(c.TP) }

// KVHeadsPerRank is the number of KV heads of one TP rank.
func (c Config) KVHeadsPerRank() int { return c.RankGeometry().KVHeads }

// QHeadsPerRank is the number of query heads of one TP rank.
func (c Config) QHeadsPerRank() int { return c.RankGeometry().QHeads }

// Store returns the page store config of one rank.
func (c Config) Store() pagestore.Config {
	return pagestore.Config{Layers: c.Layers, Geometry: c.RankGeometry(), Capacity: c.Capacity,
		DeviceBudget: c.DeviceBudgetPages, Eviction: c.Eviction}
}

// shardConfig returns the shard config of rank r (the memory check is
// the worker's, over all its ranks).
func (c Config) shardConfig(r Rank) shard.Config {
	st := c.Store()
	st.MemoryLimit = memlimit.NoLimit
	if c.DataDir != "" {
		st.DataDir, st.Durability, st.SyncInterval = RankDir(c.DataDir, r), c.Durability, c.SyncInterval
		st.Verify, st.ScrubRate = c.Verify, c.ScrubRate
		st.OnPersistError = c.OnPersistError
	}
	return shard.Config{Store: st, Policy: c.policy(), DeviceResident: c.DeviceResident,
		PrefetchPages: c.PrefetchPages, PrefetchCrossLayer: c.PrefetchCrossLayer}
}

// HostBytes returns the host bytes of ranks ranks of this config: their
// page pools (only the metadata when DeviceResident, plus the pinned host
// tier of every page when such a rank offloads: DeviceBudgetPages > 0)
// and, for replicated selection, their summary mirrors (each mirrors the
// whole TP group's pages of every layer).
func (c Config) HostBytes(ranks int) (int64, error) {
	st := c.Store()
	per, err := st.HostBytes()
	if err != nil {
		return 0, err
	}
	if c.DeviceResident {
		per = memlimit.Mul(int64(st.Capacity), 8)
		if c.DeviceBudgetPages > 0 {
			per = memlimit.Add(per, memlimit.Mul(int64(st.Capacity), int64(st.PayloadBytes())))
		}
	}
	if c.Mode == Replicated {
		mirror := memlimit.Mul(int64(c.Layers), int64(st.KVHeads), 2, int64(c.HeadDim), 4, int64(st.Capacity), int64(c.CP))
		per = memlimit.Add(per, mirror)
	}
	return memlimit.Mul(per, int64(ranks)), nil
}
