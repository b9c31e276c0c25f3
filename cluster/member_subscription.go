package cluster

import "sync/atomic"

// Subscription delivers a [Membership]'s events to one subscriber; get one
// with [Membership.Subscribe].
//
// Threading contract: events are sent from memberlist's goroutines (its
// event, probe and packet handlers), which must never block, so the send
// never waits: when the subscriber's buffer is full the event is dropped
// and counted in [Subscription.Dropped]. Events carry consecutive view
// versions, so a subscriber that sees a gap (or Dropped grow) has missed
// changes and should re-read [Membership.View]. The channel is closed by
// [Subscription.Close] and by [Membership.Shutdown]; the subscriber may
// read it from any goroutine.
type Subscription struct {
	m       *Membership
	c       chan Event
	dropped atomic.Uint64
}

// Events returns the channel the events arrive on, in version order.
func (s *Subscription) Events() <-chan Event { return s.c }

// Dropped returns how many events were dropped because the buffer was
// full.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close stops the delivery and closes the channel. It is safe to call more
// than once, and after [Membership.Shutdown].
func (s *Subscription) Close() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if _, ok := s.m.subs[s]; ok {
		delete(s.m.subs, s)
		close(s.c)
	}
}

// deliver sends e without blocking; the caller holds m.mu.
func (s *Subscription) deliver(e Event) {
	select {
	case s.c <- e:
	default:
		s.dropped.Add(1)
	}
}
