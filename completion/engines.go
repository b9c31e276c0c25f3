package completion

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// GridSpec describes the attention grid of a server's sequences: an
// in-process engine's (Engines.New) or a cluster's grid (Cluster.Create).
// The engines' other settings (step timeout, placement block, transports)
// are the runtime's defaults.
type GridSpec struct {
	// Layers and Geometry are the model's (model.Geometry.Shape): its
	// page size is Policy's, its storage type Config.KVDType (float32,
	// the zero value, or fp8 on the CPU; a GPU's with a Backend).
	Layers   int
	Geometry plan.Geometry
	// Policy is the selection policy; it attends densely on no layer of
	// its own (the requests' dense layers run as forced-dense steps).
	Policy plan.Policy
	// CapacityPages is the page pool of every rank.
	CapacityPages int
	// CP x TP is the grid (Config.CP, Config.TP); Selection its CP
	// selection mode.
	CP, TP    int
	Selection plan.SelectMode
	// MemoryLimit bounds the host bytes of the grid's pools (Config's).
	MemoryLimit int64
	// Backend runs the kernels (nil: the CPU's); DeviceResident keeps
	// the pages in its device memory (Config's).
	Backend        kernels.Backend
	DeviceResident bool
}

// Engines builds the server's in-process engines (Config.Engines;
// internal/serveengine.Engines is the runtime's).
type Engines interface {
	// New opens an engine of spec.
	New(spec GridSpec) (Engine, error)
	// Validate reports whether an engine or a cluster's grid of spec is
	// usable, without opening one.
	Validate(spec GridSpec) error
	// HostBytes returns the host memory an engine of spec allocates: the
	// pools of all its ranks, their summaries and metadata (with
	// DeviceResident, the host side only). New sizes a pool from memory
	// with it (Config.CapacityPages 0).
	HostBytes(spec GridSpec) (int64, error)
	// DeviceBytes returns the device memory an engine of spec with
	// DeviceResident takes on its Backend's device (the pools of all its
	// ranks, their summaries and page tables, and the backend's scratch
	// kept free beside them; 0 without DeviceResident). New sizes a
	// device's pool with it (Config.CapacityPages 0).
	DeviceBytes(spec GridSpec) (int64, error)
}

// Engine is an in-process attention engine: the server's main engine,
// or one request's of its own selection options. Its methods are safe
// for concurrent use.
type Engine interface {
	// NewAttention creates an empty sequence (striped placement) for a
	// model of geometry g, which must be the engine's; ctx bounds the
	// creation. Its sequences' operations, after Close, fail with
	// errors that wrap ErrEngineClosed.
	NewAttention(ctx context.Context, g model.Geometry) (*model.EngineAttention, error)
	// Usage reports the sequences and pages the engine holds.
	Usage() EngineUsage
	// Close releases the engine; its sequences are gone.
	Close() error
}

// EngineUsage is what an Engine holds (Stats.EngineSequences, UsedPages).
type EngineUsage struct {
	// Sequences are the live sequences (of rank (0, 0), which holds a
	// share of every one).
	Sequences int
	// UsedPages and FreePages are the most pages in use on one rank and
	// the fewest free.
	UsedPages, FreePages int
}

// ErrEngineClosed marks an operation on a sequence of a closed Engine.
var ErrEngineClosed = errors.New("serve: engine closed")

// engineRef is an engine and the holders of its sequences: the server's
// main engine (never closed through it), or the engine of one request
// whose selection options differ from the main engine's (closed when its
// request and the quality monitor's replays on it are done). A nil
// engineRef (a sequence on Config.Cluster) holds nothing.
type engineRef struct {
	eng Engine
	// own: the engine belongs to one request and closes with the last
	// reference.
	own bool
	// closed, for an own engine, runs once it is closed.
	closed func()

	mu   sync.Mutex
	refs int
}

// acquire adds a holder.
func (r *engineRef) acquire() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.refs++
	r.mu.Unlock()
}

// release drops a holder; the last one closes an own engine.
func (r *engineRef) release() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.refs--
	last := r.refs == 0
	r.mu.Unlock()
	if last && r.own {
		r.eng.Close()
		if r.closed != nil {
			r.closed()
		}
	}
}

// gridSpec is the grid of policy pol (its dense layers are the
// request's, run as forced-dense steps, so the grid has none) with a
// pool of capacity pages per rank, on the server's grid: the in-process
// engines' and the cluster's sequences'.
func (s *Server) gridSpec(pol plan.Policy, capacity int) GridSpec {
	pol.DenseLayers = 0
	layers, geo := s.m.Geometry().Shape()
	geo.PageSize = pol.PageSize
	gs := GridSpec{Layers: layers, Geometry: geo, Policy: pol, CapacityPages: capacity,
		CP: s.cfg.CP, TP: s.cfg.TP, Selection: s.cfg.Selection, MemoryLimit: s.cfg.MemoryLimit}
	gs.Geometry.DType = s.cfg.KVDType
	if s.cfg.Backend != nil {
		gs.Backend, gs.DeviceResident = s.cfg.Backend, s.cfg.DeviceResident
	}
	return gs
}

// ownEngine builds the engine of a request whose selector, GQA mode,
// sink or local pages are not the main engine's: the request's policy
// and grid, a pool of the pages its admission reserved (plus the quality
// monitor's slack). The request's reservation in the main pool stands
// for these pages, so with the in-process engine the server's memory
// stays bounded by its admission. Not with Config.Cluster: there a
// request of its own options gets a grid of its policy, sized like the
// main one (CapacityPages plus the slack per rank) and open until the
// coordinator closes, so the nodes reserve up to 1 + Config.PolicyGrids
// pools per rank for the server, whatever admission reserved (see
// createClusterSeq and holdGrid). Its attention runs in the same decode
// batch as every other request's: DecodeBatch steps each sequence's
// attention on its own.
func (s *Server) ownEngine(j *job) (*engineRef, error) {
	pages := j.pages // and its forks', which share the engine
	for _, f := range j.g.jobs {
		if f.leader == j {
			pages += f.pages
		}
	}
	e, err := s.cfg.Engines.New(s.gridSpec(j.p.sel, pages+s.monitorSlack()))
	if err != nil {
		return nil, fmt.Errorf("engine of the request's selection (%s, %s, sink %d, local %d): %w",
			j.p.sel.Selector, j.p.sel.GQA, j.p.sel.SinkPages, j.p.sel.LocalPages, err)
	}
	s.count(func(st *Stats) { st.OwnEngines++; st.OwnEnginesOpen++ })
	return &engineRef{eng: e, own: true, closed: func() { s.count(func(st *Stats) { st.OwnEnginesOpen-- }) }}, nil
}
