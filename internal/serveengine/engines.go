package serveengine

import (
	"context"
	"errors"
	"fmt"

	"github.com/questrt/questrt/completion"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// Engines is the completion.Engines of the in-process engine (package
// engine): completion.Config.Engines for a server of this runtime.
func Engines() completion.Engines { return engines{} }

type engines struct{}

// New opens an in-process engine of spec (engine.New).
func (engines) New(spec completion.GridSpec) (completion.Engine, error) {
	e, err := engine.New(EngineConfig(spec))
	if err != nil {
		return nil, err
	}
	return &inProcess{e}, nil
}

// Validate checks the engine config of spec (engine.Config.Validate).
func (engines) Validate(spec completion.GridSpec) error { return EngineConfig(spec).Validate() }

// HostBytes is the host memory of an engine of spec: the pools of its
// CP x TP ranks (worker.Config.HostBytes, which engine.New checks
// against the memory limit).
func (engines) HostBytes(spec completion.GridSpec) (int64, error) {
	ec := EngineConfig(spec)
	n, err := ec.WorkerConfig().HostBytes(ec.CP * ec.TP)
	if err != nil {
		return 0, fmt.Errorf("engine config: %w", err)
	}
	return n, nil
}

// PageTableBytes is the device memory a page costs in the device's page
// tables (kernels.DeviceStore.WriteTable): an int32 entry in tables that
// grow by doubling, so up to two entries' room.
const PageTableBytes = 8

// DeviceBytes is the device memory an engine of spec (DeviceResident,
// on spec.Backend's device) takes: the K/V and summary pools of its
// CP x TP ranks in the pages' type (engine.Config.DevicePageBytes: K and V of
// every layer as float32, bf16 or f16 elements with summaries of that
// type, or fp8 codes with a float32 scale per (page, KV head) record and
// float32 summaries), PageTableBytes a page for the page tables, and
// gpu.Reserve once (the backend's scratch and staging and the driver's
// own, which gpu.Admit keeps free too). 0 without DeviceResident.
func (engines) DeviceBytes(spec completion.GridSpec) (int64, error) {
	if !spec.DeviceResident {
		return 0, nil
	}
	ec := EngineConfig(spec)
	rank := ec
	rank.CP, rank.TP, rank.Geometry = 1, 1, ec.Geometry.Split(ec.TP)
	pools, err := rank.DevicePageBytes()
	if err != nil {
		return 0, fmt.Errorf("engine config: %w", err)
	}
	per := memlimit.Add(pools, memlimit.Mul(int64(spec.CapacityPages), PageTableBytes))
	return memlimit.Add(memlimit.Mul(per, int64(ec.CP), int64(ec.TP)), gpu.Reserve), nil
}

// EngineConfig is the engine config of a server's grid: the engine's
// defaults (engine.DefaultConfig: step timeout, placement block) with
// the fields spec sets. A cluster's grids (CoordinatorCluster) get it
// too.
func EngineConfig(spec completion.GridSpec) engine.Config {
	ec := engine.DefaultConfig()
	ec.Layers, ec.Geometry = spec.Layers, spec.Geometry
	ec.Policy, ec.CapacityPages = spec.Policy, spec.CapacityPages
	ec.CP, ec.TP, ec.Selection, ec.MemoryLimit = spec.CP, spec.TP, spec.Selection, spec.MemoryLimit
	ec.Backend, ec.DeviceResident = spec.Backend, spec.DeviceResident
	return ec
}

// inProcess is an engine as a completion.Engine. The embedded engine's
// accessors (Shard, Config) stay reachable for tests that look at the
// page stores.
type inProcess struct{ *engine.Engine }

// NewAttention creates an empty sequence (striped placement) driven as
// model attention; its sequences mark engine.ErrClosed with
// completion.ErrEngineClosed.
func (e *inProcess) NewAttention(ctx context.Context, g model.Geometry) (*model.EngineAttention, error) {
	layers, c := e.Shape()
	if layers != g.Layers || c.QHeads != g.Heads || c.KVHeads != g.KVHeads || c.HeadDim != g.HeadDim {
		return nil, fmt.Errorf("engine attention: engine of %d layers, %d/%d heads of %d for a model of %d layers, %d/%d heads of %d",
			layers, c.QHeads, c.KVHeads, c.HeadDim, g.Layers, g.Heads, g.KVHeads, g.HeadDim)
	}
	s, err := e.NewSequence(ctx, plan.Striped)
	if err != nil {
		return nil, fmt.Errorf("engine attention: %w", closedError(err))
	}
	return model.NewAttentionOf(sequence{s}, g), nil
}

// Usage reads the shards' page stores: the sequences of rank (0, 0),
// the most pages used and the fewest free on one shard.
func (e *inProcess) Usage() completion.EngineUsage {
	var u completion.EngineUsage
	cfg := e.Config()
	first := true
	for tp := range cfg.TP {
		for cp := range cfg.CP {
			sh := e.Shard(tp, cp)
			if sh == nil {
				continue
			}
			st := sh.Store().Stats()
			if tp == 0 && cp == 0 {
				u.Sequences = st.Sequences
			}
			u.UsedPages = max(u.UsedPages, st.UsedPages)
			if first || st.FreePages < u.FreePages {
				u.FreePages = st.FreePages
			}
			first = false
		}
	}
	return u
}

// sequence is an engine sequence whose Fork and Release errors after the
// engine closed wrap completion.ErrEngineClosed (the embedded sequence's
// Append, Stepper, SeqID, Rollback and StepLayer are its own).
type sequence struct{ *engine.Sequence }

func (s sequence) Fork(ctx context.Context) (sequence, error) {
	f, err := s.Sequence.Fork(ctx)
	if err != nil {
		return sequence{}, closedError(err)
	}
	return sequence{f}, nil
}

func (s sequence) Release(ctx context.Context) error { return closedError(s.Sequence.Release(ctx)) }

// closedError marks err with completion.ErrEngineClosed when it is the
// engine's engine.ErrClosed (still wrapping it).
func closedError(err error) error {
	if errors.Is(err, engine.ErrClosed) && !errors.Is(err, completion.ErrEngineClosed) {
		return fmt.Errorf("%w: %w", completion.ErrEngineClosed, err)
	}
	return err
}
