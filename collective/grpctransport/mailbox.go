package grpctransport

import (
	"context"
	"errors"
	"sync"

	"github.com/questrt/questrt/collective"
)

// errGone is what take returns when the sender's link is gone and its
// mailbox empty; the caller replaces it by the link's error.
var errGone = errors.New("grpctransport: peer gone")

type slotKey struct {
	from int
	tag  uint64
}

// slot is one mailbox: messages from one sender under one tag, oldest
// first.
type slot struct {
	msgs    [][]byte
	head    int
	wake    chan struct{} // closed (and cleared) when a message arrives
	waiters int
}

// mailboxes are a member's per-(sender, tag) mailboxes. The readers put
// into them, Recv takes from them; every method is safe for concurrent
// use.
type mailboxes struct {
	mu        sync.Mutex
	closed    bool
	slots     map[slotKey]*slot
	forgotten map[uint64]struct{}
}

func newMailboxes() *mailboxes {
	return &mailboxes{slots: map[slotKey]*slot{}}
}

// put files msg from sender from under tag, unless the mailboxes are
// closed or tag is forgotten. It never blocks beyond the mutex.
func (b *mailboxes) put(from int, tag uint64, msg []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if _, ok := b.forgotten[tag]; ok {
		return
	}
	k := slotKey{from, tag}
	s := b.slots[k]
	if s == nil {
		s = &slot{}
		b.slots[k] = s
	}
	s.msgs = append(s.msgs, msg)
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
}

// take returns the oldest message from sender from under tag, waiting for
// one. It returns collective.ErrClosed once the mailboxes are closed
// (closed is closed at the same time), errGone when gone is closed and the
// mailbox is empty, and ctx's error when ctx ends first. Every put of the
// sender's link happens before its gone is closed, so errGone comes only
// after everything the link received was taken. gone may be nil (a member
// receiving from itself).
func (b *mailboxes) take(ctx context.Context, from int, tag uint64, gone, closed <-chan struct{}) ([]byte, error) {
	k := slotKey{from, tag}
	b.mu.Lock()
	for {
		if b.closed {
			b.mu.Unlock()
			return nil, collective.ErrClosed
		}
		s := b.slots[k]
		if s != nil && s.head < len(s.msgs) {
			msg := s.msgs[s.head]
			s.msgs[s.head] = nil
			s.head++
			if s.head == len(s.msgs) {
				s.msgs, s.head = s.msgs[:0], 0
				if s.waiters == 0 {
					delete(b.slots, k)
				}
			}
			b.mu.Unlock()
			return msg, nil
		}
		err := ctx.Err()
		if isDone(gone) {
			err = errGone
		}
		if err != nil {
			if s != nil && s.waiters == 0 {
				delete(b.slots, k)
			}
			b.mu.Unlock()
			return nil, err
		}
		if s == nil {
			s = &slot{}
			b.slots[k] = s
		}
		if s.wake == nil {
			s.wake = make(chan struct{})
		}
		w := s.wake
		s.waiters++
		b.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
		case <-gone:
		case <-closed:
		}
		b.mu.Lock()
		if !b.closed {
			s.waiters--
		}
	}
}

// forget drops what is buffered under tag (in slots nobody waits on) and
// everything that arrives under it later. Tags stay forgotten for the life
// of the member.
func (b *mailboxes) forget(tag uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if b.forgotten == nil {
		b.forgotten = map[uint64]struct{}{}
	}
	b.forgotten[tag] = struct{}{}
	for k, s := range b.slots {
		if k.tag == tag && s.waiters == 0 {
			delete(b.slots, k)
		}
	}
}

// close drops every mailbox; later puts are dropped and takes fail.
func (b *mailboxes) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.slots = nil
	b.forgotten = nil
}

// pending returns the number of messages buffered and not yet taken.
func (b *mailboxes) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, s := range b.slots {
		n += len(s.msgs) - s.head
	}
	return n
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
