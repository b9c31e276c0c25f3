package node

import (
	"testing"

	"github.com/questrt/questrt/cluster"
)

// TestSweeperGone: a grid of a coordinator instance the views never
// showed is kept (the coordinator restarted, this node's view is
// behind), whatever the view shows of the name; one whose instance is
// shown down, or was shown and replaced by another, is gone.
func TestSweeperGone(t *testing.T) {
	view := func(inst uint64, st cluster.MemberState) cluster.View {
		return cluster.View{Members: []cluster.Member{{Name: "n0", Instance: inst, State: st}, {Name: "n1", Instance: 9, State: cluster.StateAlive}}}
	}
	const old, cur = 0xa1, 0xb2
	oldGrid, curGrid := "n0/a1/3", "n0/b2/1"
	var s sweeper
	steps := []struct {
		what     string
		v        cluster.View
		old, cur bool // gone
	}{
		{"old instance alive", view(old, cluster.StateAlive), false, false},
		{"old instance suspect", view(old, cluster.StateSuspect), false, false},
		{"old instance dead, the new one not shown yet", view(old, cluster.StateDead), true, false},
		{"the new instance alive", view(cur, cluster.StateAlive), true, false},
		{"the new instance dead", view(cur, cluster.StateDead), true, true},
	}
	for _, st := range steps {
		s.observe(st.v)
		if got := s.gone(st.v, oldGrid); got != st.old {
			t.Errorf("%s: grid %s gone %v, want %v", st.what, oldGrid, got, st.old)
		}
		if got := s.gone(st.v, curGrid); got != st.cur {
			t.Errorf("%s: grid %s gone %v, want %v", st.what, curGrid, got, st.cur)
		}
	}
	// A name missing from the view: gone when its instance was seen.
	empty := cluster.View{}
	if !s.gone(empty, oldGrid) || s.gone(empty, "n0/c3/1") || s.gone(empty, "no-owner") {
		t.Errorf("missing member: gone %v %v %v, want true false false", s.gone(empty, oldGrid), s.gone(empty, "n0/c3/1"), s.gone(empty, "no-owner"))
	}
	// The memory is bounded: the oldest instances are forgotten.
	for i := range maxSeenInstances {
		s.observe(view(uint64(0x100+i), cluster.StateAlive))
	}
	if s.gone(view(0x100, cluster.StateAlive), oldGrid) {
		t.Errorf("grid %s gone after %d newer instances: want it forgotten (kept)", oldGrid, maxSeenInstances)
	}
	if !s.gone(view(0x100+maxSeenInstances-1, cluster.StateAlive), "n0/100/1") {
		t.Errorf("grid n0/100/1: want gone, its instance seen and replaced")
	}
}
