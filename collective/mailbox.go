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

// ForgetHistory is how many forgotten tags Mailboxes remember: the last
// ForgetHistory tags passed to Forget stay forgotten (at most twice as
// many are remembered), older ones are forgotten no more. The memory of
// forgotten tags is thus bounded, about 250 KiB per member at most
// (measured on amd64), however many operations fail over a member's life.
//
// A tag is forgotten once every local call under it returned, after its
// operation failed; what still arrives under it is a peer's data or abort
// sent before the peer learned of the failure, queued or in flight for
// about one network delay. The runtime forgets two tags per layer of a
// failed step (MakeTag's select and reduce), and a worker runs one step at
// a time, each failed one taking at least a round trip of its own (its
// Layer and EndStep calls), so 4096 tags cover the last 2048 failed
// layers: thousands of round trips of the coordinator, several failed
// steps of even a deep model run as one step, far longer than a message
// stays in flight. A message that arrives under a tag evicted from the
// history is buffered as one of a tag never forgotten (until the mailboxes
// close): the price of the bound, paid only by a message later than
// ForgetHistory forgotten tags.
const ForgetHistory = 1 << 12

// Mailboxes are one member's per-(sender, tag) mailboxes, the buffering
// that the Transport contract asks of every transport: senders (or a
// network transport's stream readers) Put, Recv Takes, in order per
// (sender, tag), never dropping a message whose tag was not forgotten.
// Every method is safe for concurrent use. The zero value is not usable:
// see NewMailboxes.
type Mailboxes struct {
	mu     sync.Mutex
	closed bool
	slots  map[slotKey]*slot
	// The forgotten tags, in two generations: Forget adds to cur; when
	// cur holds ForgetHistory tags it becomes prev, and the older prev,
	// cleared whole, becomes the new, empty cur. A tag in either is
	// forgotten, so the last ForgetHistory forgotten tags always are, and
	// at most 2*ForgetHistory are remembered. The maps are only added to
	// and cleared, never deleted from one by one: no tombstones, so no
	// growth under churn, and no allocation once both are grown.
	cur, prev map[uint64]struct{}
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
	if b.isForgotten(tag) {
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
// everything that arrives under it later, while tag is among the last
// ForgetHistory forgotten tags (see ForgetHistory; forgetting a tag again
// makes it the latest). Memory stays bounded: at most 2*ForgetHistory tags
// are remembered.
func (b *Mailboxes) Forget(tag uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if _, ok := b.cur[tag]; !ok {
		if len(b.cur) >= ForgetHistory {
			// The oldest generation goes; its map (cleared, keeping its
			// storage) takes the new tags.
			clear(b.prev)
			b.prev, b.cur = b.cur, b.prev
		}
		if b.cur == nil {
			b.cur = map[uint64]struct{}{}
		}
		b.cur[tag] = struct{}{}
	}
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
	b.cur, b.prev = nil, nil
}

// isForgotten reports whether tag is among the remembered forgotten tags
// (b.mu held).
func (b *Mailboxes) isForgotten(tag uint64) bool {
	if _, ok := b.cur[tag]; ok {
		return true
	}
	_, ok := b.prev[tag]
	return ok
}

// Forgotten returns the number of forgotten tags remembered, at most
// 2*ForgetHistory (diagnostics and tests).
func (b *Mailboxes) Forgotten() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.cur) + len(b.prev)
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
