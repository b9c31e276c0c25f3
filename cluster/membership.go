package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Membership is this node's membership in a questrt cluster: gossip and
// failure detection by hashicorp/memberlist over UDP and TCP, the metadata
// each node advertises, and a versioned view of the members with events
// on every change.
//
// Start one with [NewMembership]; end it with [Membership.Leave] (a
// graceful departure the others see as [StateLeft]) and then
// [Membership.Shutdown], which stops gossip. Shutdown without Leave is
// what a crash looks like to the others: they declare the node
// [StateDead] after their failure detection runs
// ([MemberConfig.DetectionBound]). The package starts no goroutine of its
// own but the timers that ask a restarted member again for its new address
// (member_reclaim.go), which Leave and Shutdown stop (one already asking
// ends by itself within twice [MemberConfig.TCPTimeout]); memberlist's
// are stopped by Shutdown. All methods are safe for concurrent use.
type Membership struct {
	cfg      MemberConfig
	log      *slog.Logger
	instance uint64
	ml       *memberlist.Memberlist
	queue    *memberlist.TransmitLimitedQueue
	// up counts the members alive or suspect, this node included, for the
	// broadcast queue's retransmit limit (read from memberlist's
	// goroutines, which must not call back into memberlist).
	up atomic.Int64

	// life serializes Leave, UpdateMeta and Shutdown: memberlist panics on
	// a Leave after Shutdown.
	life   sync.Mutex
	left   bool // Leave ran
	closed bool // Shutdown ran

	// mu guards what follows. Lock order: memberlist's locks, then mu
	// (memberlist calls the delegate with its node lock held), so nothing
	// may call into memberlist while holding mu.
	mu       sync.Mutex
	wireMeta []byte // encoded local meta, what NodeMeta returns
	members  map[string]*entry
	version  uint64
	subs     map[*Subscription]struct{}
	// joining is set while NewMembership joins; a name conflict about this
	// node seen meanwhile is kept in conflict for the join to wait on.
	joining  bool
	conflict error
	// claims holds the claims of restarted members to their names that
	// memberlist refused, to ask again (member_reclaim.go); noRetries is
	// set by Leave and Shutdown.
	claims    map[string]*claim
	noRetries bool
	// leaveAcks holds the members that acknowledged this node's leave
	// intent; nil until Leave.
	leaveAcks map[string]bool
	// claimPushPulls counts the push/pulls run for claims (read by tests).
	claimPushPulls atomic.Int64
}

// entry is one member and what this node knows beyond memberlist.
type entry struct {
	Member
	// leaving: a leave intent for this instance arrived, so its departure
	// is graceful.
	leaving bool
}

// ErrNameConflict means another live node already uses this node's name.
// A node restarted on a new address before the others declared its
// previous process dead does not get it: [NewMembership] waits until
// they do (twice [MemberConfig.DetectionBound] at most).
var ErrNameConflict = errors.New("node name already in use")

// ErrJoinFailed means none of the join addresses could be joined: no
// answer, another cluster label, or other gossip keys.
var ErrJoinFailed = errors.New("join failed")

// ErrClosed means the Membership was shut down.
var ErrClosed = errors.New("membership shut down")

// NewMembership validates cfg, starts gossip on cfg's address and, when
// cfg.Join is not empty, joins the cluster through those addresses,
// retrying every cfg.JoinRetryInterval until one answers or ctx ends (a
// join attempt can take up to cfg.TCPTimeout). It fails with
// [ErrJoinFailed] when no address could be joined and with
// [ErrNameConflict] when a member still has cfg.Name after twice the
// time the cluster takes to declare a killed member dead (a restart on a
// new address waits until the others declared its old process dead, and
// is taken in then); on failure
// everything it started is stopped.
func NewMembership(ctx context.Context, cfg MemberConfig) (m *Membership, err error) {
	if cfg.Listener != nil {
		// Taken over: closed on failure; past memberlist.Create its
		// Shutdown closes the transport.
		defer func() {
			if err != nil {
				cfg.Listener.Close()
			}
		}()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Join = slices.Clone(cfg.Join)
	cfg.SecretKeys = slices.Clone(cfg.SecretKeys)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("cluster: node %s: instance id: %w", cfg.Name, err)
	}
	m = &Membership{
		cfg:      cfg,
		log:      logger.With("node", cfg.Name),
		instance: binary.LittleEndian.Uint64(id[:]),
		members:  make(map[string]*entry),
		subs:     make(map[*Subscription]struct{}),
		claims:   make(map[string]*claim),
		joining:  len(cfg.Join) > 0,
	}
	wire, err := encodeNodeMeta(m.instance, cfg.Meta)
	if err != nil {
		return nil, fmt.Errorf("cluster: node %s: %w", cfg.Name, err)
	}
	m.wireMeta = wire
	m.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return int(m.up.Load()) },
		RetransmitMult: memberlist.DefaultLANConfig().RetransmitMult,
	}
	d := &delegate{m: m}
	bridge := &logBridge{log: m.log.With("component", "memberlist"), onSuspect: m.markSuspect}
	mc, err := cfg.memberlistConfig(d, log.New(bridge, "", 0))
	if err != nil {
		return nil, fmt.Errorf("cluster: node %s: %w", cfg.Name, err)
	}
	ml, err := memberlist.Create(mc)
	if err == nil && cfg.Listener != nil {
		cfg.Listener.taken()
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: node %s: start gossip on %s:%d: %w", cfg.Name, cfg.BindAddr, cfg.BindPort, err)
	}
	m.ml = ml
	m.log.Info("gossip started", "addr", m.Addr().String(), "instance", m.instance)
	if len(cfg.Join) > 0 {
		n, err := m.join(ctx, cfg.Join)
		m.mu.Lock()
		m.joining = false
		m.mu.Unlock()
		if err != nil {
			_ = m.Shutdown()
			return nil, err
		}
		m.log.Info("joined cluster", "contacted", n)
	}
	return m, nil
}

// join contacts addrs until one answers or ctx ends. A join refused
// because a member still holds this node's name from another address
// (a restart on a new port or address, before the others declared the
// old process dead) is tried again until [Membership.conflictWait] has
// passed since the first refusal: once the others see the old process
// dead, the new one is taken in; a name held by a live process still
// fails, with [ErrNameConflict].
func (m *Membership) join(ctx context.Context, addrs []string) (int, error) {
	var last error
	var firstConflict time.Time
	var lastWhy string
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return 0, m.joinErr(addrs, attempt-1, last, err)
		}
		n, err := m.ml.Join(addrs)
		m.mu.Lock()
		conflict := m.conflict
		m.conflict = nil
		m.mu.Unlock()
		pause := m.cfg.JoinRetryInterval
		switch {
		case conflict != nil:
			wait := m.conflictWait()
			if firstConflict.IsZero() {
				firstConflict = time.Now()
				m.log.Warn("this node's name is held by another process; waiting for the others to declare it dead (a restart before they saw the old process fail)",
					"err", conflict, "wait", wait)
			}
			if time.Since(firstConflict) > wait {
				return 0, fmt.Errorf("cluster: node %s: join: %w (still held after %v)", m.cfg.Name, conflict, wait.Round(time.Millisecond))
			}
			last = conflict
			pause = max(pause, m.cfg.ProbeInterval)
		case n > 0:
			if !firstConflict.IsZero() {
				m.log.Info("took over this node's name from its previous process", "waited", time.Since(firstConflict).Round(time.Millisecond))
			}
			return n, nil
		default:
			last = err
			if m.cfg.JoinRetryInterval == 0 {
				return 0, m.joinErr(addrs, attempt, last, nil)
			}
			// Each new reason once as a warning (a wrong key or label does
			// not heal by retrying: the operator should see it at once),
			// repeats at debug level.
			why := m.joinReason(err)
			if attempt == 1 || why != lastWhy {
				m.log.Warn("join attempt failed; retrying", "attempt", attempt, "via", strings.Join(addrs, ","), "err", why)
			} else {
				m.log.Debug("join attempt failed", "attempt", attempt, "err", err)
			}
			lastWhy = why
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, m.joinErr(addrs, attempt, last, ctx.Err())
		case <-t.C:
		}
	}
}

// conflictWait is how long a join refused for a name conflict is tried
// again: twice the time the cluster takes to declare a killed member
// dead ([MemberConfig.DetectionBound], for the members this node sees
// and at least 3), which covers survivors that stretch their probes
// under load, plus the reclaim time.
func (m *Membership) conflictWait() time.Duration {
	n := max(int(m.ml.NumMembers()), 3)
	return 2*m.cfg.DetectionBound(n) + m.cfg.DeadNodeReclaimTime
}

// joinErr reports a failed join: memberlist's last error (a multi-line
// list, put on one line) and the context's error, if it ended.
func (m *Membership) joinErr(addrs []string, attempts int, last, ctxErr error) error {
	msg := m.joinReason(last)
	if ctxErr != nil {
		return fmt.Errorf("cluster: node %s: %w: via %s after %d attempts: %s: %w",
			m.cfg.Name, ErrJoinFailed, strings.Join(addrs, ","), attempts, msg, ctxErr)
	}
	return fmt.Errorf("cluster: node %s: %w: via %s after %d attempts: %s",
		m.cfg.Name, ErrJoinFailed, strings.Join(addrs, ","), attempts, msg)
}

// joinReason is memberlist's join error last on one line, with its
// cause when joinCause knows it ("no attempt" for nil).
func (m *Membership) joinReason(last error) string {
	if last == nil {
		return "no attempt"
	}
	msg := strings.Join(strings.Fields(last.Error()), " ")
	if cause := joinCause(msg, m.cfg.Label, len(m.cfg.SecretKeys) > 0); cause != "" {
		msg += " (" + cause + ")"
	}
	return msg
}

// joinCause names, from the text of memberlist's join error msg, what
// differs between this node (its label, whether it has gossip keys) and
// the member it contacted, or "" when the text says nothing known.
// memberlist v0.5 words these refusals so; a member with another label
// closes the stream without a word (EOF).
func joinCause(msg, label string, keyed bool) string {
	switch {
	case strings.Contains(msg, "remote state is encrypted and encryption is not configured"):
		return "the cluster's gossip is encrypted and this node has no gossip key"
	case strings.Contains(msg, "encryption is configured but remote state is not encrypted"):
		if keyed {
			return "this node's gossip key is not the cluster's, or the cluster has none"
		}
	case strings.Contains(msg, "no installed keys could decrypt the message"):
		return "this node's gossip key is not the cluster's"
	case strings.HasSuffix(msg, ": EOF") || strings.Contains(msg, "connection reset by peer"):
		l := fmt.Sprintf("cluster label %q", label)
		if label == "" {
			l = "no cluster label"
		}
		return "the member hung up at once: most likely its cluster label is not this node's (" + l + ")"
	}
	return ""
}

// Join contacts more members, for example to merge with a cluster
// started apart; it tries each address once and returns how many
// answered. It fails with [ErrJoinFailed] when none did.
func (m *Membership) Join(ctx context.Context, addrs ...string) (int, error) {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed || m.left {
		return 0, fmt.Errorf("cluster: node %s: join: %w", m.cfg.Name, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("cluster: node %s: join: %w", m.cfg.Name, err)
	}
	n, err := m.ml.Join(addrs)
	if n == 0 {
		return 0, m.joinErr(addrs, 1, err, nil)
	}
	return n, nil
}

// Name returns this node's name.
func (m *Membership) Name() string { return m.cfg.Name }

// Instance returns this process's random instance id ([Member.Instance]).
func (m *Membership) Instance() uint64 { return m.instance }

// Addr returns the gossip address this node advertises: with port 0 in
// the config, the port that was picked.
func (m *Membership) Addr() netip.AddrPort {
	n := m.ml.LocalNode()
	return addrPort(n.Addr, n.Port)
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// Members returns every known member, this node included, sorted by name.
func (m *Membership) Members() []Member {
	return m.View().Members
}

// View returns a snapshot of the membership and its version.
func (m *Membership) View() View {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.viewLocked()
}

func (m *Membership) viewLocked() View {
	v := View{Version: m.version, Members: make([]Member, 0, len(m.members))}
	for _, e := range m.members {
		v.Members = append(v.Members, e.Member)
	}
	slices.SortFunc(v.Members, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return v
}

// Subscribe returns the current view and a subscription to the events
// that follow it, taken together: the first event has version
// view.Version+1. buffer is the channel's capacity (at least 1); see
// [Subscription] for the threading contract. After Shutdown the
// subscription's channel is already closed.
func (m *Membership) Subscribe(buffer int) (View, *Subscription) {
	s := &Subscription{m: m, c: make(chan Event, max(buffer, 1))}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		close(s.c)
	} else {
		m.subs[s] = struct{}{}
	}
	return m.viewLocked(), s
}

// UpdateMeta replaces the metadata this node advertises and waits until
// the update has been gossiped, until ctx's deadline (or
// [MemberConfig.BroadcastTimeout]). Invalid or oversized metadata is
// refused with [ErrInvalidMeta] or [ErrMetaTooLarge] and changes nothing;
// when the wait times out the update stays applied and keeps spreading.
func (m *Membership) UpdateMeta(ctx context.Context, meta NodeMeta) error {
	wire, err := encodeNodeMeta(m.instance, meta)
	if err != nil {
		return fmt.Errorf("cluster: node %s: update meta: %w", m.cfg.Name, err)
	}
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed || m.left {
		return fmt.Errorf("cluster: node %s: update meta: %w", m.cfg.Name, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cluster: node %s: update meta: %w", m.cfg.Name, err)
	}
	m.mu.Lock()
	m.wireMeta = wire
	m.mu.Unlock()
	if err := m.ml.UpdateNode(m.waitFor(ctx)); err != nil {
		return fmt.Errorf("cluster: node %s: update meta: %w", m.cfg.Name, errors.Join(err, ctx.Err()))
	}
	return nil
}

// waitFor is how long to wait for a broadcast: until ctx's deadline, or
// BroadcastTimeout without one; never 0, which memberlist reads as
// forever.
func (m *Membership) waitFor(ctx context.Context) time.Duration {
	d := m.cfg.BroadcastTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	return max(d, time.Millisecond)
}

// leavePoll is how often [Membership.Leave] sends its leave intent again
// to the members that have not acknowledged it.
const leavePoll = 20 * time.Millisecond

// Leave departs the cluster gracefully: it tells the others this is a
// departure, not a failure (they see [StateLeft]), waits until every
// member up acknowledged that, then broadcasts the leave, each wait
// bounded by ctx's deadline (or [MemberConfig.BroadcastTimeout]). It
// returns an error naming the members that did not acknowledge in time;
// the departure is still under way and those may see the node as dead
// instead. A node whose peers all went meanwhile (a whole cluster stopped
// at once) has nobody left to tell: no error, though memberlist may still
// wait out the timeout for its own leave broadcast (it waits when it saw
// a peer alive as it began; that peer's departure does not end the
// wait). Gossip keeps running until [Membership.Shutdown], which should
// follow. Leave is idempotent; after Shutdown it returns [ErrClosed].
func (m *Membership) Leave(ctx context.Context) error {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed {
		return fmt.Errorf("cluster: node %s: leave: %w", m.cfg.Name, ErrClosed)
	}
	if m.left {
		return nil
	}
	m.left = true
	start := time.Now()
	var errs []error
	m.mu.Lock()
	if e := m.members[m.cfg.Name]; e != nil {
		e.leaving = true // memberlist reports its own departure too
	}
	m.stopClaimsLocked()
	m.mu.Unlock()

	// First the intent, so the others classify the death that follows as
	// a departure. It goes out as a broadcast and, until acknowledged,
	// straight to every member up: memberlist handles a death before a
	// user message that arrived with it, so only an acknowledgement says
	// a member will see the departure as one. With nobody left to tell (a
	// whole cluster stopped at once) there is nothing to wait for and no
	// error.
	if m.othersUp() {
		intent := encodeLeaveMsg(msgLeaveIntent, m.instance, m.cfg.Name)
		m.mu.Lock()
		m.leaveAcks = map[string]bool{}
		m.mu.Unlock()
		m.queue.QueueBroadcast(&intentBroadcast{name: m.cfg.Name, msg: intent})
		t := time.NewTimer(m.waitFor(ctx))
		poll := time.NewTicker(leavePoll)
	wait:
		for {
			pending := m.unacked()
			if len(pending) == 0 {
				break
			}
			for _, a := range pending {
				_ = m.ml.SendToAddress(a, intent) // best effort; sent again next poll
			}
			select {
			case <-poll.C:
			case <-t.C:
				names := make([]string, len(pending))
				for i, a := range pending {
					names[i] = a.Name
				}
				errs = append(errs, fmt.Errorf("no acknowledgement of the leave intent from %s", strings.Join(names, ", ")))
				break wait
			case <-ctx.Done():
				errs = append(errs, ctx.Err())
				break wait
			}
		}
		poll.Stop()
		t.Stop()
	}
	// memberlist waits for its own leave broadcast when it sees another
	// member alive as it starts, and times out when they all went during
	// the wait: not an error either.
	if err := m.ml.Leave(m.waitFor(ctx)); err != nil && m.othersUp() {
		errs = append(errs, err)
	}
	m.mu.Lock()
	if e := m.members[m.cfg.Name]; e != nil && e.State != StateLeft {
		e.State, e.Since = StateLeft, time.Now()
		m.changedLocked(EventLeft, e)
	}
	m.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster: node %s: leave: %w", m.cfg.Name, err)
	}
	m.log.Info("left cluster", "took", time.Since(start))
	return nil
}

// othersUp reports whether a member other than this node is up in the
// view (m.up counts this node too until memberlist reports its own
// departure).
func (m *Membership) othersUp() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, e := range m.members {
		if name != m.cfg.Name && e.State.Up() {
			return true
		}
	}
	return false
}

// unacked returns the gossip addresses of the members up (alive or
// suspect) that have not acknowledged this node's leave intent. A suspect
// member is waited for too: a loaded node is suspected while it still
// gossips, and one that is failing leaves the list once declared dead.
func (m *Membership) unacked() []memberlist.Address {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []memberlist.Address
	for name, e := range m.members {
		if name != m.cfg.Name && e.State.Up() && !m.leaveAcks[name] && e.Addr.IsValid() {
			out = append(out, memberlist.Address{Addr: e.Addr.String(), Name: name})
		}
	}
	slices.SortFunc(out, func(a, b memberlist.Address) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Shutdown stops gossip and closes the subscriptions; it first waits for
// a Leave or UpdateMeta in progress (each bounded by its timeout). The
// listeners are closed when it returns; memberlist's remaining goroutines
// exit by themselves shortly after, the last within a probe interval (a
// probe in flight waits out its timeout), and so does a push/pull asking a
// restarted member for its address, within twice [MemberConfig.TCPTimeout].
// Without a [Membership.Leave] before, the others see this node fail.
// Members and View keep answering with the last view (which such a
// push/pull, or one memberlist was serving, may still update; the
// subscriptions are closed and get nothing). Shutdown is idempotent.
func (m *Membership) Shutdown() error {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.mu.Lock()
	m.stopClaimsLocked()
	m.mu.Unlock()
	err := m.ml.Shutdown()
	m.mu.Lock()
	for s := range m.subs {
		delete(m.subs, s)
		close(s.c)
	}
	m.mu.Unlock()
	m.log.Info("gossip stopped")
	if err != nil {
		return fmt.Errorf("cluster: node %s: shutdown: %w", m.cfg.Name, err)
	}
	return nil
}

// changedLocked records a change of e: a new version, the count of up
// members, forgetting long-gone members, and an event to each
// subscriber. The caller holds mu.
func (m *Membership) changedLocked(t EventType, e *entry) {
	m.emitLocked(t, e.Member)
	now := time.Now()
	for name, old := range m.members {
		if name != m.cfg.Name && !old.State.Up() && now.Sub(old.Since) > m.cfg.DeadRetention {
			delete(m.members, name)
			m.emitLocked(EventRemoved, old.Member)
		}
	}
	var up int64
	for _, e := range m.members {
		if e.State.Up() {
			up++
		}
	}
	m.up.Store(up)
}

func (m *Membership) emitLocked(t EventType, mem Member) {
	m.version++
	ev := Event{Type: t, Member: mem, Version: m.version}
	for s := range m.subs {
		s.deliver(ev)
	}
	m.log.Debug("membership "+t.String(), "member", mem.Name, "state", mem.State.String(), "version", m.version)
}

// markSuspect records that this node's probe of name failed (memberlist
// logs it; see logBridge).
func (m *Membership) markSuspect(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.members[name]
	if e == nil || e.State != StateAlive || name == m.cfg.Name {
		return
	}
	e.State, e.Since = StateSuspect, time.Now()
	m.changedLocked(EventSuspect, e)
}
