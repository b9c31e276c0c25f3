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
		m := &inproc{g: g, rank: i, done: make(chan struct{}), box: NewMailboxes()}
		g.members[i] = m
		out[i] = m
	}
	return out
}

type inprocGroup struct {
	members []*inproc
}

type inproc struct {
	g    *inprocGroup
	rank int
	done chan struct{} // closed by Close
	box  *Mailboxes

	closeOnce sync.Once
}

var _ Transport = (*inproc)(nil)

func (m *inproc) Rank() int { return m.rank }
func (m *inproc) Size() int { return len(m.g.members) }

func (m *inproc) Close() error {
	m.closeOnce.Do(func() {
		m.box.Close()
		close(m.done)
	})
	return nil
}

// Forget implements Transport.
func (m *inproc) Forget(tag uint64) { m.box.Forget(tag) }

// Pending returns the number of messages buffered for this member and not
// yet received (diagnostics and tests).
func (m *inproc) Pending() int { return m.box.Pending() }

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
	if err := p.box.Put(m.rank, tag, buf); err != nil {
		if p != m {
			err = ErrPeerClosed
		}
		return fmt.Errorf("send to %d tag %#x: %w", to, tag, err)
	}
	return nil
}

func (m *inproc) Recv(ctx context.Context, from int, tag uint64) ([]byte, error) {
	if err := checkRank(from, len(m.g.members)); err != nil {
		return nil, fmt.Errorf("recv from %d tag %#x: %w", from, tag, err)
	}
	msg, err := m.box.Take(ctx, from, tag, m.g.members[from].done, m.done)
	if err != nil {
		return nil, fmt.Errorf("recv from %d tag %#x: %w", from, tag, err)
	}
	return msg, nil
}
