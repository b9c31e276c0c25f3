package metastore

import (
	"context"
	"fmt"
	"sync"
)

// MemSlotIndex is the in-memory twin of a bbolt slot index, as Mem is
// of a sequence table: what is committed stays across Close, and its
// lock is a file's. It is safe for concurrent use.
type MemSlotIndex struct {
	mu      sync.Mutex
	lock    memLock
	format  *slotFormatRecord
	entries map[int]SlotEntry // used ones only
}

// NewMemSlotIndex returns an empty MemSlotIndex.
func NewMemSlotIndex() *MemSlotIndex { return &MemSlotIndex{entries: map[int]SlotEntry{}} }

// Open opens the index.
func (m *MemSlotIndex) Open(opt Options) (SlotIndex, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, err := openMem(&m.mu, &m.lock, opt.ReadOnly)
	if err != nil {
		return nil, fmt.Errorf("metastore: memory slot index: %w", err)
	}
	return &memSlotIndex{memHandle: h, m: m}, nil
}

// memSlotIndex is one open of a MemSlotIndex.
type memSlotIndex struct {
	memHandle
	m *MemSlotIndex
}

func (x *memSlotIndex) Init(ctx context.Context, f SlotFormat) ([]SlotEntry, error) {
	want := slotFormatRecord{Version: slotFormatVersion, SlotFormat: f}
	if err := x.enter(ctx, true); err != nil {
		return nil, err
	}
	defer x.m.mu.Unlock()
	if x.m.format != nil {
		if err := checkSlotFormat(*x.m.format, want); err != nil {
			return nil, err
		}
	}
	entries := make([]SlotEntry, f.Slots)
	for s, e := range x.m.entries {
		if s >= f.Slots {
			return nil, &mismatchError{fmt.Sprintf("slot %d holds a payload but config has %d slots", s, f.Slots)}
		}
		entries[s] = e
	}
	x.m.format = &want
	return entries, nil
}

func (x *memSlotIndex) Commit(ctx context.Context, changes map[int]SlotEntry) error {
	if err := x.enter(ctx, true); err != nil {
		return err
	}
	defer x.m.mu.Unlock()
	if x.m.format == nil {
		return fmt.Errorf("metastore: commit a slot index before Init")
	}
	for s, e := range changes {
		if e.Used {
			x.m.entries[s] = e
		} else {
			delete(x.m.entries, s)
		}
	}
	return nil
}
