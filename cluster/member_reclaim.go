package cluster

import (
	"time"
)

// A node restarted under its name on another address (a new port, a new
// pod IP) is refused by memberlist at every member that declared its old
// process dead less than [MemberConfig.DeadNodeReclaimTime] ago, or that
// still suspects it: memberlist reports a name conflict and drops the
// alive message. It does not ask again; only the next periodic push/pull
// (30 s by default) would bring the new address, so a node restarted
// quickly stayed invisible to some members for that long.
//
// A member that sees such a conflict therefore asks again itself: once the
// reclaim time has passed (or, while it still suspects the old process,
// after a probe interval), it runs a push/pull with the claimant's
// address, which brings the claim back for memberlist to accept. This
// stops when the member is seen at the claimant's address, when the
// claimant cannot be reached, or after the detection bound plus the
// reclaim time from the first conflict. A conflict with a member seen
// alive is a real one (two live processes under one name) and is not
// retried.

// reclaimRetry is the pending retry of one name's claim.
type reclaimRetry struct {
	addr  string      // the claimant's gossip address
	timer *time.Timer // nil while the retry runs
	until time.Time   // no retry is scheduled after this
}

// reclaimMargin is added to the end of the reclaim time: memberlist
// accepts a claim only strictly after it.
const reclaimMargin = 20 * time.Millisecond

// retryClaimLocked schedules a push/pull with addr, which claims the name
// of e, a member this node sees dead or suspect. The caller holds mu.
func (m *Membership) retryClaimLocked(e *entry, addr string) {
	if m.noRetries || m.cfg.DeadNodeReclaimTime == 0 {
		// 0: memberlist reclaims a name only once it forgot the member, which
		// a push/pull does not hasten.
		return
	}
	now := time.Now()
	r := m.reclaims[e.Name]
	if r == nil {
		r = &reclaimRetry{until: now.Add(m.cfg.DetectionBound(len(m.members)) + m.cfg.DeadNodeReclaimTime)}
		m.reclaims[e.Name] = r
	}
	r.addr = addr
	if r.timer != nil {
		return // one is pending; it uses the newest address
	}
	if now.After(r.until) {
		delete(m.reclaims, e.Name)
		m.log.Warn("gave up asking a restarted member for its new address", "member", e.Name, "other", addr)
		return
	}
	delay := m.cfg.ProbeInterval
	if e.State == StateDead {
		delay = max(time.Until(e.Since.Add(m.cfg.DeadNodeReclaimTime)), 0) + reclaimMargin
	}
	name := e.Name
	m.retries.Add(1)
	r.timer = time.AfterFunc(delay, func() {
		defer m.retries.Done()
		m.runClaimRetry(name)
	})
}

// runClaimRetry is the timer of name's retry: a push/pull with the
// claimant, during which a conflict seen again schedules the next retry.
func (m *Membership) runClaimRetry(name string) {
	m.mu.Lock()
	r := m.reclaims[name]
	if m.noRetries || r == nil {
		m.mu.Unlock()
		return
	}
	r.timer = nil
	addr := r.addr
	m.mu.Unlock()

	_, err := m.ml.Join([]string{addr})

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reclaims[name] != r || r.timer != nil {
		return // rescheduled by a new conflict, or stopped
	}
	delete(m.reclaims, name)
	e := m.members[name]
	switch {
	case e != nil && e.State.Up() && e.Addr.String() == addr:
		m.log.Info("restarted member reclaimed its name", "member", name, "addr", addr)
	case err != nil:
		m.log.Warn("restarted member did not answer at its new address", "member", name, "other", addr, "err", err)
	}
}

// stopRetriesLocked cancels the pending retries; no new one is scheduled.
// The caller holds mu and then waits for m.retries without it.
func (m *Membership) stopRetriesLocked() {
	m.noRetries = true
	for name, r := range m.reclaims {
		if r.timer != nil && r.timer.Stop() {
			m.retries.Done()
		}
		delete(m.reclaims, name)
	}
}
