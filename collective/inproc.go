package collective

import (
	"context"
	"fmt"
	"sync"
)

// NewInprocGroup returns the n members of an in-process group, member i
// having rank i. Messages are copied into mutex-protected per-(sender, tag)
// mailboxes of the receiver; Send never blocks. Closing a member drops its
// mailboxes and makes the peers' pending and future Recv from it fail with
// ErrPeerClosed once the messages it sent before closing are consumed.
// It panics if n < 1.
func NewInprocGroup(n int) []Transport {
	if n < 1 {
		panic(fmt.Sprintf("collective: NewInprocGroup(%d)", n))
	}
	g := &inprocGroup{members: make([]*inproc, n)}
	out := make([]Transport, n)
	for i := range n {
		m := &inproc{g: g, rank: i, done: make(chan struct{}), slots: map[slotKey]*slot{}}
		g.members[i] = m
		out[i] = m
	}
	return out
}

type inprocGroup struct {
	members []*inproc
}

type slotKey struct {
	from int
	tag  uint64
}

// slot is one mailbox: messages from one sender under one tag.
type slot struct {
	msgs    [][]byte
	head    int
	wake    chan struct{} // closed (and cleared) when a message arrives
	waiters int
}

type inproc struct {
	g    *inprocGroup
	rank int
	done chan struct{} // closed by Close

	mu        sync.Mutex
	closed    bool
	slots     map[slotKey]*slot
	forgotten map[uint64]bool
}

var _ Transport = (*inproc)(nil)

func (m *inproc) Rank() int { return m.rank }
func (m *inproc) Size() int { return len(m.g.members) }

func (m *inproc) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.slots = nil
	close(m.done)
	return nil
}

// Forget implements Transport. Tags stay forgotten for the life of the
// member (one map entry per forgotten tag).
func (m *inproc) Forget(tag uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	if m.forgotten == nil {
		m.forgotten = map[uint64]bool{}
	}
	m.forgotten[tag] = true
	for k, s := range m.slots {
		if k.tag == tag && s.waiters == 0 {
			delete(m.slots, k)
		}
	}
}

// Pending returns the number of messages buffered for this member and not
// yet received (diagnostics and tests).
func (m *inproc) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range m.slots {
		n += len(s.msgs) - s.head
	}
	return n
}

func isDone(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (m *inproc) Send(ctx context.Context, to int, tag uint64, msg []byte) error {
	if err := checkRank(to, len(m.g.members)); err != nil {
		return fmt.Errorf("send to %d tag %#x: %w", to, tag, err)
	}
	if isDone(m.done) {
		return fmt.Errorf("send to %d tag %#x: %w", to, tag, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("send to %d tag %#x: %w", to, tag, err)
	}
	buf := make([]byte, len(msg))
	copy(buf, msg)
	p := m.g.members[to]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		if p == m {
			return fmt.Errorf("send to %d tag %#x: %w", to, tag, ErrClosed)
		}
		return fmt.Errorf("send to %d tag %#x: %w", to, tag, ErrPeerClosed)
	}
	if p.forgotten[tag] {
		return nil
	}
	k := slotKey{m.rank, tag}
	s := p.slots[k]
	if s == nil {
		s = &slot{}
		p.slots[k] = s
	}
	s.msgs = append(s.msgs, buf)
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
	return nil
}

func (m *inproc) Recv(ctx context.Context, from int, tag uint64) ([]byte, error) {
	if err := checkRank(from, len(m.g.members)); err != nil {
		return nil, fmt.Errorf("recv from %d tag %#x: %w", from, tag, err)
	}
	peer := m.g.members[from]
	k := slotKey{from, tag}
	m.mu.Lock()
	for {
		if m.closed {
			m.mu.Unlock()
			return nil, fmt.Errorf("recv from %d tag %#x: %w", from, tag, ErrClosed)
		}
		s := m.slots[k]
		if s != nil && s.head < len(s.msgs) {
			msg := s.msgs[s.head]
			s.msgs[s.head] = nil
			s.head++
			if s.head == len(s.msgs) {
				s.msgs, s.head = s.msgs[:0], 0
				if s.waiters == 0 {
					delete(m.slots, k)
				}
			}
			m.mu.Unlock()
			return msg, nil
		}
		if isDone(peer.done) {
			if s != nil && s.waiters == 0 {
				delete(m.slots, k)
			}
			m.mu.Unlock()
			return nil, fmt.Errorf("recv from %d tag %#x: %w", from, tag, ErrPeerClosed)
		}
		if err := ctx.Err(); err != nil {
			if s != nil && s.waiters == 0 {
				delete(m.slots, k)
			}
			m.mu.Unlock()
			return nil, fmt.Errorf("recv from %d tag %#x: %w", from, tag, err)
		}
		if s == nil {
			s = &slot{}
			m.slots[k] = s
		}
		if s.wake == nil {
			s.wake = make(chan struct{})
		}
		w := s.wake
		s.waiters++
		m.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
		case <-peer.done:
		case <-m.done:
		}
		m.mu.Lock()
		if !m.closed {
			s.waiters--
		}
	}
}
