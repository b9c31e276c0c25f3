package collective

import (
	"context"
	"sync"
)

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

// Mailboxes are one member's per-(sender, tag) mailboxes, the buffering
// that the Transport contract asks of every transport: senders (or a
// network transport's stream readers) Put, Recv Takes, in order per
// (sender, tag), never dropping a message whose tag was not forgotten.
// Every method is safe for concurrent use. The zero value is not usable:
// see NewMailboxes.
type Mailboxes struct {
	mu        sync.Mutex
	closed    bool
	slots     map[slotKey]*slot
	forgotten map[uint64]struct{}
}

// NewMailboxes returns empty, open mailboxes.
func NewMailboxes() *Mailboxes {
	return &Mailboxes{slots: map[slotKey]*slot{}}
}

// Put files msg (kept, not copied) from sender from under tag. A
// forgotten tag's message is dropped silently; after Close, Put drops it
// and returns ErrClosed. It never blocks beyond the mutex.
func (b *Mailboxes) Put(from int, tag uint64, msg []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if _, ok := b.forgotten[tag]; ok {
		return nil
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
	return nil
}

// Take returns the oldest message from sender from under tag, waiting for
// one. It returns ErrClosed once the mailboxes are closed (closed must be
// closed at the same time, to wake waiters), ErrPeerClosed when gone is
// closed and the mailbox is empty, and ctx's error when ctx ends first.
// Every Put of the sender happens before its gone is closed, so
// ErrPeerClosed comes only after everything it sent was taken. gone may
// be nil (a member receiving from itself).
func (b *Mailboxes) Take(ctx context.Context, from int, tag uint64, gone, closed <-chan struct{}) ([]byte, error) {
	k := slotKey{from, tag}
	b.mu.Lock()
	for {
		if b.closed {
			b.mu.Unlock()
			return nil, ErrClosed
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
			err = ErrPeerClosed
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

// Forget drops what is buffered under tag (in slots nobody waits on) and
// everything that arrives under it later. Tags stay forgotten for the life
// of the mailboxes (one map entry per tag).
func (b *Mailboxes) Forget(tag uint64) {
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

// Close drops every mailbox; later Puts and Takes fail with ErrClosed.
func (b *Mailboxes) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.slots = nil
	b.forgotten = nil
}

// Pending returns the number of messages buffered and not yet taken.
func (b *Mailboxes) Pending() int {
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
