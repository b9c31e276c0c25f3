package cluster

import (
	"time"
)

// A node restarted under its name on another address (a new port, a new
// pod IP) is refused by memberlist at every member that declared its old
// process dead less than [MemberConfig.DeadNodeReclaimTime] ago, or that
// has not declared it dead yet: memberlist reports a name conflict and
// drops the alive message. It does not ask again; only the next periodic
// push/pull (30 s by default) would bring the new address, so a node
// restarted quickly stayed invisible to some members for that long.
//
// A member that sees such a conflict therefore keeps the claim and asks
// again itself: once it has seen the old process dead or departed for the
// reclaim time, it runs a push/pull with the claimant's address, which
// brings the claim back for memberlist to accept. The claim is kept for
// twice the detection bound plus the reclaim time from its latest
// conflict; at most [maxClaimTries] push/pulls run for it, and none while
// this node sees the member up (at the claimant's address the claim is
// done; at the old one the old process is back). While the old process
// stays alive (two live processes under one name, a real conflict) no
// push/pull runs: the claim expires unused.

// claim is a restarted member's claim to its name, kept after memberlist
// refused it.
type claim struct {
	addr  string      // the claimant's gossip address, the newest seen
	timer *time.Timer // the scheduled push/pull; nil when none is
	tries int         // push/pulls scheduled so far
	until time.Time   // the claim is dropped after this
}

// maxClaimTries bounds the push/pulls run for one claim: the first one
// normally succeeds; the others cover a claimant that did not answer once.
const maxClaimTries = 3

// reclaimMargin is added to the end of the reclaim time: memberlist
// accepts a claim only strictly after it.
const reclaimMargin = 20 * time.Millisecond

// noteClaimLocked records that addr claims the name of e, another member,
// and memberlist refused it; the push/pull is scheduled when e is (or
// once it becomes) dead or departed. The caller holds mu.
func (m *Membership) noteClaimLocked(e *entry, addr string) {
	if m.noRetries || m.cfg.DeadNodeReclaimTime == 0 {
		// 0: memberlist gives a dead member's name to another address only
		// once it has forgotten the member (a departed one's at once, with
		// no conflict), which a push/pull does not hasten.
		return
	}
	now := time.Now()
	c := m.claims[e.Name]
	if c != nil && now.After(c.until) {
		m.dropClaimLocked(e.Name)
		c = nil
	}
	if c == nil {
		c = &claim{}
		m.claims[e.Name] = c
	}
	c.addr = addr
	c.until = now.Add(2*m.cfg.DetectionBound(len(m.members)) + m.cfg.DeadNodeReclaimTime)
	m.scheduleClaimLocked(e)
}

// scheduleClaimLocked schedules the push/pull of e's claim, if there is
// one, none is scheduled, e is down and tries are left. The caller holds
// mu.
func (m *Membership) scheduleClaimLocked(e *entry) {
	c := m.claims[e.Name]
	if c == nil || c.timer != nil || m.noRetries || e.State.Up() {
		return
	}
	now := time.Now()
	if now.After(c.until) || c.tries >= maxClaimTries {
		return // kept, unused, until it expires: no more push/pulls for it
	}
	at := e.Since.Add(m.cfg.DeadNodeReclaimTime + reclaimMargin)
	if c.tries > 0 {
		// The claimant did not answer, or changed address meanwhile.
		at = later(at, now.Add(m.cfg.ProbeInterval))
	}
	c.tries++
	name := e.Name
	c.timer = time.AfterFunc(max(time.Until(at), 0), func() { m.runClaim(name, c) })
}

// runClaim is c's timer: a push/pull with the claimant, after which the
// member is seen at its address, or the claim is tried again later (the
// claimant did not answer), or memberlist refused it again (the old
// process is back: the claim stays unused until it expires).
func (m *Membership) runClaim(name string, c *claim) {
	m.mu.Lock()
	if m.noRetries || m.claims[name] != c {
		m.mu.Unlock()
		return
	}
	addr := c.addr
	if e := m.members[name]; e == nil || e.State.Up() {
		if e != nil && e.Addr.String() == addr {
			m.dropClaimLocked(name) // accepted meanwhile, by way of another member
		} else {
			c.timer = nil // the old process is back: kept, unused, unless it dies again
		}
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()

	m.claimPushPulls.Add(1)
	_, err := m.ml.Join([]string{addr})

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.claims[name] != c {
		return // dropped meanwhile
	}
	c.timer = nil
	e := m.members[name]
	switch {
	case e != nil && e.State.Up() && e.Addr.String() == addr:
		m.dropClaimLocked(name)
		m.log.Info("restarted member reclaimed its name", "member", name, "addr", addr)
	case err != nil && e != nil:
		m.log.Warn("restarted member did not answer at its new address", "member", name, "other", addr, "err", err)
		m.scheduleClaimLocked(e)
	case c.addr != addr && e != nil:
		m.scheduleClaimLocked(e) // a newer address arrived during the push/pull
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// dropClaimLocked forgets name's claim and stops its timer. A push/pull
// already running ends by itself (within about twice
// [MemberConfig.TCPTimeout]) and changes nothing here. The caller holds
// mu.
func (m *Membership) dropClaimLocked(name string) {
	if c := m.claims[name]; c != nil {
		if c.timer != nil {
			c.timer.Stop()
		}
		delete(m.claims, name)
	}
}

// stopClaimsLocked drops every claim; none is kept after. The caller holds
// mu.
func (m *Membership) stopClaimsLocked() {
	m.noRetries = true
	for name := range m.claims {
		m.dropClaimLocked(name)
	}
}
