package serve

import (
	"fmt"
	"sync"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// engineRef is an engine and the holders of its sequences: the server's
// main engine (never closed through it), or the engine of one request
// whose selection options differ from the main engine's (closed when its
// request and the quality monitor's replays on it are done). A nil
// engineRef (a sequence on Config.Cluster) holds nothing.
type engineRef struct {
	eng *engine.Engine
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

// engineConfig is the engine configuration of policy pol (its dense
// layers are the request's, run as forced-dense steps, so the engine has
// none) with a pool of capacity pages per shard, on the server's grid:
// the in-process engines' and the cluster's sequences'.
func (s *Server) engineConfig(pol plan.Policy, capacity int) engine.Config {
	pol.DenseLayers = 0
	ec := model.EngineConfig(s.m.Geometry(), pol, capacity)
	ec.CP, ec.TP, ec.Selection, ec.MemoryLimit = s.cfg.CP, s.cfg.TP, s.cfg.Selection, s.cfg.MemoryLimit
	if s.cfg.Backend != nil {
		ec.Backend, ec.DeviceResident = s.cfg.Backend, s.cfg.DeviceResident
		ec.Geometry.DType = s.cfg.KVDType
	}
	return ec
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
	e, err := engine.New(s.engineConfig(j.p.sel, pages+s.monitorSlack()))
	if err != nil {
		return nil, fmt.Errorf("engine of the request's selection (%s, %s, sink %d, local %d): %w",
			j.p.sel.Selector, j.p.sel.GQA, j.p.sel.SinkPages, j.p.sel.LocalPages, err)
	}
	s.count(func(st *Stats) { st.OwnEngines++; st.OwnEnginesOpen++ })
	return &engineRef{eng: e, own: true, closed: func() { s.count(func(st *Stats) { st.OwnEnginesOpen-- }) }}, nil
}
