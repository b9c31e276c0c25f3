package cluster

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate is what memberlist calls back: the metadata and user messages
// (memberlist.Delegate), joins, updates and deaths
// (memberlist.EventDelegate), name conflicts (memberlist.ConflictDelegate)
// and probe acks (memberlist.PingDelegate).
//
// Threading: memberlist calls these from its own goroutines, often with its
// node lock held, and some calls are concurrent, so each one takes m.mu
// briefly, never blocks and never calls into memberlist.
type delegate struct{ m *Membership }

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
	_ memberlist.PingDelegate     = (*delegate)(nil)
)

// NodeMeta returns the encoded local metadata; it is validated to fit
// memberlist.MetaMaxSize when set.
func (d *delegate) NodeMeta(limit int) []byte {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if len(d.m.wireMeta) > limit {
		return nil // unreachable: encodeNodeMeta enforces MetaMaxSize
	}
	return append([]byte(nil), d.m.wireMeta...)
}

// NotifyMsg receives the user messages of this package: leave intents,
// answered with an acknowledgement to the leaver, and those
// acknowledgements.
func (d *delegate) NotifyMsg(b []byte) {
	m := d.m
	if len(b) > 0 && b[0] == msgLeaveAck {
		leaver, acker, err := decodeLeaveMsg(b, msgLeaveAck)
		if err != nil {
			m.log.Warn("dropping gossip message", "err", err)
			return
		}
		m.leaveAcked(leaver, acker)
		return
	}
	instance, name, err := decodeLeaveMsg(b, msgLeaveIntent)
	if err != nil {
		m.log.Warn("dropping gossip message", "err", err)
		return
	}
	addr, known, news := m.leaveIntent(name, instance)
	if news {
		// Pass it on, as serf does, so it reaches every member of a large
		// cluster before the death it explains.
		m.queue.QueueBroadcast(&intentBroadcast{name: name, msg: append([]byte(nil), b...)})
	}
	if known && addr.IsValid() {
		// Tell the leaver this node will see its departure as one, so it
		// need not guess from how often the broadcast went out. Best
		// effort: the leaver sends the intent again until acknowledged.
		_ = m.ml.SendToAddress(memberlist.Address{Addr: addr.String(), Name: name},
			encodeLeaveMsg(msgLeaveAck, instance, m.cfg.Name))
	}
}

// GetBroadcasts hands memberlist the queued leave intents to piggyback.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.m.queue.GetBroadcasts(overhead, limit)
}

// LocalState sends, in a push/pull, the members this node knows to have
// left, so that a node that missed their intent can still tell departure
// from failure.
func (d *delegate) LocalState(join bool) []byte {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	var left []leftMember
	for _, e := range d.m.members {
		if e.State == StateLeft && len(left) < maxLeftList {
			left = append(left, leftMember{e.Name, e.Instance})
		}
	}
	return encodeLeftList(left)
}

// MergeRemoteState applies a peer's list of departed members. memberlist
// merges the node states first, so a departure it just reported as a death
// is corrected here.
func (d *delegate) MergeRemoteState(b []byte, join bool) {
	left, err := decodeLeftList(b)
	if err != nil {
		d.m.log.Warn("dropping push/pull state", "err", err)
		return
	}
	for _, l := range left {
		d.m.leaveIntent(l.name, l.instance)
	}
}

// NotifyJoin records a member that appeared or came back.
func (d *delegate) NotifyJoin(n *memberlist.Node) {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.members[n.Name]
	if e == nil {
		e = &entry{}
		m.members[n.Name] = e
	}
	m.setNodeLocked(e, n)
	e.State, e.Since, e.leaving = StateAlive, time.Now(), false
	m.changedLocked(EventJoin, e)
}

// NotifyUpdate records a member's new metadata or address.
func (d *delegate) NotifyUpdate(n *memberlist.Node) {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.members[n.Name]
	if e == nil {
		e = &entry{}
		m.members[n.Name] = e
	}
	wasUp, old := e.State.Up(), e.Instance
	restarted := m.setNodeLocked(e, n) != old || !wasUp
	if restarted || e.State != StateAlive {
		e.State, e.Since = StateAlive, time.Now()
	}
	if restarted {
		e.leaving = false
		m.changedLocked(EventJoin, e)
		return
	}
	m.changedLocked(EventUpdate, e)
}

// NotifyLeave records a member that died or, after its leave intent,
// departed. memberlist calls it for both and does not say which.
func (d *delegate) NotifyLeave(n *memberlist.Node) {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.members[n.Name]
	if e == nil {
		e = &entry{}
		m.members[n.Name] = e
		m.setNodeLocked(e, n)
	}
	state, ev := StateDead, EventDead
	if e.leaving {
		state, ev = StateLeft, EventLeft
	}
	if e.State == state {
		return
	}
	e.State, e.Since = state, time.Now()
	m.changedLocked(ev, e)
	m.scheduleClaimLocked(e)
}

// setNodeLocked copies n's address and decoded metadata into e and
// returns the instance id it carries.
func (m *Membership) setNodeLocked(e *entry, n *memberlist.Node) uint64 {
	e.Name = n.Name
	e.Addr = addrPort(n.Addr, n.Port)
	inst, meta, err := decodeNodeMeta(n.Meta)
	if err != nil {
		if e.MetaErr == nil {
			m.log.Warn("member metadata does not decode", "member", n.Name, "err", err)
		}
		inst, meta = 0, NodeMeta{}
	}
	e.Instance, e.Meta, e.MetaErr = inst, meta, err
	return inst
}

// NotifyConflict sees another node claim a known name from another
// address. When that name is this node's and it is still joining, the
// join fails with ErrNameConflict; when it is another member's, the claim
// is kept to ask for again once that member is dead or departed for the
// reclaim time: a restart on a new address (noteClaimLocked).
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	m := d.m
	addr := addrPort(other.Addr, other.Port)
	m.mu.Lock()
	defer m.mu.Unlock()
	if existing.Name == m.cfg.Name && m.joining && m.conflict == nil {
		m.conflict = fmt.Errorf("%w: %q is also at %s", ErrNameConflict, other.Name, addr)
	}
	m.log.Warn("node name conflict", "member", existing.Name,
		"known", addrPort(existing.Addr, existing.Port).String(), "other", addr.String())
	if e := m.members[existing.Name]; existing.Name != m.cfg.Name && e != nil {
		m.noteClaimLocked(e, addr.String())
	}
}

// AckPayload adds nothing to probe acks.
func (d *delegate) AckPayload() []byte { return nil }

// NotifyPingComplete sees a direct probe of other acked: a suspect member
// is alive again.
func (d *delegate) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.members[other.Name]; e != nil && e.State == StateSuspect {
		e.State, e.Since = StateAlive, time.Now()
		m.changedLocked(EventAlive, e)
	}
}

// leaveIntent applies a leave intent of name's process instance: a dead
// member becomes departed, a live one will be departed when it goes. It
// returns the leaver's gossip address, whether the intent concerns a
// member this node knows (that instance, alive, suspect or gone), and
// whether it was news.
func (m *Membership) leaveIntent(name string, instance uint64) (addr netip.AddrPort, known, news bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.members[name]
	if e == nil || e.Instance != instance || name == m.cfg.Name {
		return netip.AddrPort{}, false, false
	}
	switch e.State {
	case StateDead:
		e.leaving = true
		e.State = StateLeft
		m.changedLocked(EventLeft, e)
		return e.Addr, true, true
	case StateAlive, StateSuspect:
		news := !e.leaving
		e.leaving = true
		return e.Addr, true, news
	}
	return e.Addr, true, false
}

// leaveAcked records that acker will see this node's departure as one:
// an acknowledgement of this instance's leave intent.
func (m *Membership) leaveAcked(instance uint64, acker string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if instance == m.instance && m.leaveAcks != nil {
		m.leaveAcks[acker] = true
	}
}

// intentBroadcast is a leave intent in memberlist's broadcast queue; a
// newer intent for the same name replaces it.
type intentBroadcast struct {
	name string
	msg  []byte
}

func (b *intentBroadcast) Invalidates(other memberlist.Broadcast) bool {
	o, ok := other.(*intentBroadcast)
	return ok && o.name == b.name
}

func (b *intentBroadcast) Message() []byte { return b.msg }

func (b *intentBroadcast) Finished() {}

// The user messages of this package. A leave intent and its
// acknowledgement are
//
//	msgLeaveIntent, uvarint leaver's instance, uvarint name length, leaver's name
//	msgLeaveAck, uvarint leaver's instance, uvarint name length, acknowledging member's name
//
// and the push/pull state is
//
//	msgLeftList, uvarint count, count x (uvarint instance, uvarint name length, name)
const (
	msgLeaveIntent = 1
	msgLeftList    = 2
	msgLeaveAck    = 3
	maxLeftList    = 1024
)

type leftMember struct {
	name     string
	instance uint64
}

func encodeLeaveMsg(typ byte, instance uint64, name string) []byte {
	b := []byte{typ}
	b = binary.AppendUvarint(b, instance)
	return appendString(b, name)
}

func decodeLeaveMsg(b []byte, typ byte) (instance uint64, name string, err error) {
	what := "leave intent"
	if typ == msgLeaveAck {
		what = "leave acknowledgement"
	}
	if len(b) == 0 || b[0] != typ {
		return 0, "", fmt.Errorf("not a %s (%d bytes)", what, len(b))
	}
	r := reader{b: b[1:]}
	instance = r.uvarint("instance")
	name = r.string("name", maxNameLen)
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return 0, "", fmt.Errorf("%s: %w", what, r.err)
	}
	return instance, name, nil
}

func encodeLeftList(left []leftMember) []byte {
	b := []byte{msgLeftList}
	b = binary.AppendUvarint(b, uint64(len(left)))
	for _, l := range left {
		b = binary.AppendUvarint(b, l.instance)
		b = appendString(b, l.name)
	}
	return b
}

func decodeLeftList(b []byte) ([]leftMember, error) {
	if len(b) == 0 {
		return nil, nil // a peer without a delegate state
	}
	if b[0] != msgLeftList {
		return nil, fmt.Errorf("not a departed-members list (type %d)", b[0])
	}
	r := reader{b: b[1:]}
	n := r.uvarint("count")
	if r.err == nil && n > maxLeftList {
		return nil, fmt.Errorf("departed-members list of %d, limit %d", n, maxLeftList)
	}
	var left []leftMember
	for i := uint64(0); i < n && r.err == nil; i++ {
		inst := r.uvarint("instance")
		name := r.string("name", maxNameLen)
		left = append(left, leftMember{name, inst})
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("departed-members list: %w", r.err)
	}
	return left, nil
}
