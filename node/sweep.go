package node

import (
	"slices"
	"sync"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/coord"
)

// maxSeenInstances bounds the instances a sweeper remembers per member
// name (the most recent ones).
const maxSeenInstances = 8

// sweeper decides which hosted grids' coordinators are gone (Node.sweep)
// from the membership views it was shown. A grid id carries its
// coordinator's name and instance (coord.GridOwner); a coordinator that
// restarted has a new instance. A grid is gone when the view shows its
// instance down, or when its instance, seen in an earlier view, is no
// longer the one the view shows: the name moved on to another process.
// A grid whose instance this node's view never showed is kept: the
// coordinator restarted and opened it before this node's view caught up
// (the old instance still shown, alive, suspect or dead). Closing it
// there lost the restarted coordinator's new grid and, with it, the
// sequences its nodes had recovered (issue 27: "unknown grid" at the
// adoption, a fault-free step canceled). Such a grid is decided once
// the view shows its instance; a grid of a coordinator that restarts
// again closes when its successor opens the same directory
// (remote.Server's claim of a stale instance's directory).
//
// Its methods are safe for concurrent use.
type sweeper struct {
	mu   sync.Mutex
	seen map[string][]uint64 // per member name, instances shown, oldest first
}

// observe records the instances v shows.
func (s *sweeper) observe(v cluster.View) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string][]uint64{}
	}
	for _, m := range v.Members {
		ins := s.seen[m.Name]
		if slices.Contains(ins, m.Instance) {
			continue
		}
		ins = append(ins, m.Instance)
		if len(ins) > maxSeenInstances {
			ins = slices.Delete(ins, 0, len(ins)-maxSeenInstances)
		}
		s.seen[m.Name] = ins
	}
}

// gone reports whether the coordinator of grid id is gone by view v (as
// observed, with the earlier views).
func (s *sweeper) gone(v cluster.View, id string) bool {
	name, inst, ok := coord.GridOwner(id)
	if !ok {
		return false
	}
	m, found := v.Member(name)
	if found && m.Instance == inst {
		return !m.State.Up()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.seen[name], inst)
}
