package cluster

import (
	"encoding/binary"
	"hash/fnv"
	"net/netip"
	"time"
)

// MemberState is a member's state as this node sees it.
type MemberState uint8

// The states of a member. memberlist v0.7.0 reports joins, updates and
// deaths through its event delegate but not suspicion, nor whether a
// departure was graceful; [Membership] derives those itself (see
// [StateSuspect] and [StateLeft]).
const (
	// StateAlive: the member answers probes, or has not been suspected.
	StateAlive MemberState = iota + 1
	// StateSuspect: this node's own last direct probe of the member got
	// no ack, directly or indirectly, so memberlist suspects it. It turns
	// back to alive at the next ack of a direct probe from this node or
	// any update about the member, and to dead when the suspicion times
	// out. Suspicion this node only hears about through gossip is not
	// shown.
	StateSuspect
	// StateDead: the member was declared failed: it stopped answering and
	// did not refute the suspicion in time.
	StateDead
	// StateLeft: the member left gracefully with [Membership.Leave].
	StateLeft
)

// String returns "alive", "suspect", "dead" or "left".
func (s MemberState) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return "unknown"
}

// Up reports whether the member is alive or suspect: still a member, and
// still a candidate for placement (a suspect often recovers).
func (s MemberState) Up() bool { return s == StateAlive || s == StateSuspect }

// Member is one node of the cluster as this node sees it.
type Member struct {
	// Name is the node's unique name.
	Name string
	// Addr is the node's gossip address.
	Addr netip.AddrPort
	// State is alive, suspect, dead or left.
	State MemberState
	// Meta is what the node advertises. It is the zero NodeMeta when
	// MetaErr is set.
	Meta NodeMeta
	// MetaErr says why the node's metadata did not decode (a node of
	// another program, or of an incompatible version): placement should
	// skip such a node.
	MetaErr error
	// Instance is a random id the node drew when its [Membership]
	// started: a node restarted under the same name has a new one, which
	// tells the new process from the old (whose shards are gone).
	Instance uint64
	// Since is when this node saw State begin.
	Since time.Time
}

// View is a snapshot of the membership as this node sees it.
type View struct {
	// Version increases by one at every change of this node's view: a
	// join, an update, a suspicion or recovery, a death, a departure, a
	// member forgotten. It is local to this node: other nodes count their
	// own changes. Compare views across nodes with [View.Digest].
	Version uint64
	// Members lists every known member, including dead and departed ones
	// until they are forgotten, sorted by name, so that placement computed
	// from it is deterministic.
	Members []Member
}

// Up returns the members that are alive or suspect, sorted by name.
func (v View) Up() []Member {
	out := make([]Member, 0, len(v.Members))
	for _, m := range v.Members {
		if m.State.Up() {
			out = append(out, m)
		}
	}
	return out
}

// Member returns the member called name.
func (v View) Member(name string) (Member, bool) {
	for _, m := range v.Members {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// Digest is a hash of the names and instances of the members that are up
// ([MemberState.Up]): two nodes whose views agree on who is in the
// cluster, and on which process each one is, have equal digests, whatever
// their versions, states (alive or suspect), addresses and metadata.
func (v View) Digest() uint64 {
	h := fnv.New64a()
	var buf [binary.MaxVarintLen64]byte
	for _, m := range v.Members {
		if !m.State.Up() {
			continue
		}
		h.Write(binary.AppendUvarint(buf[:0], uint64(len(m.Name))))
		h.Write([]byte(m.Name))
		h.Write(binary.AppendUvarint(buf[:0], m.Instance))
	}
	return h.Sum64()
}

// EventType says what changed in an [Event].
type EventType uint8

// The kinds of membership events.
const (
	// EventJoin: a member appeared, came back after being dead or
	// departed, or restarted under the same name (a new Instance).
	EventJoin EventType = iota + 1
	// EventUpdate: a member's metadata or address changed.
	EventUpdate
	// EventSuspect: a member became suspect.
	EventSuspect
	// EventAlive: a suspect member answered again.
	EventAlive
	// EventDead: a member was declared dead.
	EventDead
	// EventLeft: a member left gracefully (also when this is learnt after
	// an EventDead for it).
	EventLeft
	// EventRemoved: a dead or departed member was forgotten after
	// [MemberConfig.DeadRetention].
	EventRemoved
)

// String returns the event type in lower case ("join", "dead", ...).
func (t EventType) String() string {
	switch t {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventSuspect:
		return "suspect"
	case EventAlive:
		return "alive"
	case EventDead:
		return "dead"
	case EventLeft:
		return "left"
	case EventRemoved:
		return "removed"
	}
	return "unknown"
}

// Event is one change of this node's view.
type Event struct {
	Type EventType
	// Member is the member after the change (for EventRemoved, as it was
	// last seen).
	Member Member
	// Version is the view's version right after the change: the events a
	// subscriber receives have consecutive versions unless some were
	// dropped.
	Version uint64
}
