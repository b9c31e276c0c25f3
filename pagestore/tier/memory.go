package tier

import (
	"context"
	"fmt"
	"sync"
)

// stripes is the number of slot locks of a [Memory]: calls on slots with
// the same slot mod stripes serialize (the lock is held for one copy).
const stripes = 256

// Memory is the in-memory twin of every tier: payloads in Go heap slices,
// one per written slot (a freed slot's slice is dropped). It checks its
// arguments exactly as the other tiers do, so layers above can be tested in
// one process. Create it with [NewMemory].
type Memory struct {
	slots, size int

	life   sync.RWMutex // held for reading by every call, for writing by Close
	closed bool

	locks []sync.RWMutex // by slot % len(locks)
	data  [][]byte       // nil: empty
}

var _ Tier = (*Memory)(nil)

// NewMemory returns an empty Memory of slots slots of payloadBytes bytes.
// Memory is allocated per slot on its first Write, not up front.
func NewMemory(slots, payloadBytes int) (*Memory, error) {
	if slots < 1 {
		return nil, fmt.Errorf("tier: new memory: %d slots: %w", slots, ErrSlot)
	}
	if payloadBytes < 1 {
		return nil, fmt.Errorf("tier: new memory: %d-byte payload: %w", payloadBytes, ErrSize)
	}
	return &Memory{
		slots: slots,
		size:  payloadBytes,
		locks: make([]sync.RWMutex, min(slots, stripes)),
		data:  make([][]byte, slots),
	}, nil
}

// Slots implements Tier.
func (m *Memory) Slots() int { return m.slots }

// PayloadBytes implements Tier.
func (m *Memory) PayloadBytes() int { return m.size }

// begin checks the common arguments and holds m.life for reading; the
// caller releases it when err is nil.
func (m *Memory) begin(ctx context.Context, op string, slot, n int) error {
	if err := CheckContext(ctx); err != nil {
		return fmt.Errorf("tier: memory %s slot %d: %w", op, slot, err)
	}
	if err := CheckSlot(slot, m.slots); err != nil {
		return fmt.Errorf("tier: memory %s: %w", op, err)
	}
	if n >= 0 {
		if err := CheckSize(n, m.size); err != nil {
			return fmt.Errorf("tier: memory %s slot %d: %w", op, slot, err)
		}
	}
	m.life.RLock()
	if m.closed {
		m.life.RUnlock()
		return fmt.Errorf("tier: memory %s slot %d: %w", op, slot, ErrClosed)
	}
	return nil
}

// Write implements Tier.
func (m *Memory) Write(ctx context.Context, slot int, payload []byte) error {
	if err := m.begin(ctx, "write", slot, len(payload)); err != nil {
		return err
	}
	defer m.life.RUnlock()
	l := &m.locks[slot%len(m.locks)]
	l.Lock()
	defer l.Unlock()
	if m.data[slot] == nil {
		m.data[slot] = make([]byte, m.size)
	}
	copy(m.data[slot], payload)
	return nil
}

// Read implements Tier.
func (m *Memory) Read(ctx context.Context, slot int, dst []byte) error {
	if err := m.begin(ctx, "read", slot, len(dst)); err != nil {
		return err
	}
	defer m.life.RUnlock()
	l := &m.locks[slot%len(m.locks)]
	l.RLock()
	defer l.RUnlock()
	if m.data[slot] == nil {
		return fmt.Errorf("tier: memory read slot %d: %w", slot, ErrEmpty)
	}
	copy(dst, m.data[slot])
	return nil
}

// Free implements Tier.
func (m *Memory) Free(ctx context.Context, slot int) error {
	if err := m.begin(ctx, "free", slot, -1); err != nil {
		return err
	}
	defer m.life.RUnlock()
	l := &m.locks[slot%len(m.locks)]
	l.Lock()
	defer l.Unlock()
	if m.data[slot] == nil {
		return fmt.Errorf("tier: memory free slot %d: %w", slot, ErrEmpty)
	}
	m.data[slot] = nil
	return nil
}

// Used returns the slots that hold a payload, in increasing order (nil
// after Close).
func (m *Memory) Used() []int {
	m.life.RLock()
	defer m.life.RUnlock()
	if m.closed {
		return nil
	}
	var used []int
	for s := range m.data {
		l := &m.locks[s%len(m.locks)]
		l.RLock()
		if m.data[s] != nil {
			used = append(used, s)
		}
		l.RUnlock()
	}
	return used
}

// Close implements Tier: it drops every payload.
func (m *Memory) Close() error {
	m.life.Lock()
	defer m.life.Unlock()
	m.closed = true
	m.data = nil
	return nil
}
