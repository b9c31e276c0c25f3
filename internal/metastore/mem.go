package metastore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
)

// Mem is the in-memory twin of a bbolt table file: what its tables
// commit stays in it across Close, for the next Open, as a file's
// contents do. Its lock is the file's: a writable open excludes every
// other open, read-only opens share it; an open that finds it taken
// fails with ErrInUse at once (Options.Timeout is not waited). A Mem is
// safe for concurrent use.
type Mem struct {
	mu      sync.Mutex
	lock    memLock
	format  []byte
	next    uint64
	entries map[uint64]Entry
	marks   map[uint64]StepMark
}

// NewMem returns an empty Mem.
func NewMem() *Mem {
	return &Mem{entries: map[uint64]Entry{}, marks: map[uint64]StepMark{}}
}

// Open opens the Mem's sequence table.
func (m *Mem) Open(opt Options) (SeqTable, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, err := openMem(&m.mu, &m.lock, opt.ReadOnly)
	if err != nil {
		return nil, fmt.Errorf("metastore: memory table: %w", err)
	}
	return &memTable{memHandle: h, m: m}, nil
}

// memLock is the lock of a memory file (under its owner's mutex): a
// writer excludes every other open, readers share it.
type memLock struct {
	readers int  // open read-only
	writer  bool // open writable
}

func (l *memLock) take(readOnly bool) error {
	if l.writer || (!readOnly && l.readers > 0) {
		return ErrInUse
	}
	if readOnly {
		l.readers++
	} else {
		l.writer = true
	}
	return nil
}

func (l *memLock) release(readOnly bool) {
	if readOnly {
		l.readers--
	} else {
		l.writer = false
	}
}

// memHandle is one open of a memory file: the file's mutex and lock.
type memHandle struct {
	mu       *sync.Mutex
	lock     *memLock
	readOnly bool
	closed   bool // under *mu
}

// openMem takes lock (under mu) for a new handle.
func openMem(mu *sync.Mutex, lock *memLock, readOnly bool) (memHandle, error) {
	if err := lock.take(readOnly); err != nil {
		return memHandle{}, err
	}
	return memHandle{mu: mu, lock: lock, readOnly: readOnly}, nil
}

// enter takes the file's mutex for a call of ctx, failing as a closed or
// read-only handle does (write: the call writes); on nil the caller
// unlocks it.
func (h *memHandle) enter(ctx context.Context, write bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h.mu.Lock()
	switch {
	case h.closed:
		h.mu.Unlock()
		return ErrClosed
	case write && h.readOnly:
		h.mu.Unlock()
		return ErrReadOnly
	}
	return nil
}

// Close releases the handle's lock; idempotent.
func (h *memHandle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		h.lock.release(h.readOnly)
	}
	return nil
}

// memTable is one open of a Mem.
type memTable struct {
	memHandle
	m *Mem
}

func (t *memTable) Init(ctx context.Context, f Format) error {
	want, err := encodeFormat(f)
	if err != nil {
		return err
	}
	if err := t.enter(ctx, true); err != nil {
		return err
	}
	defer t.m.mu.Unlock()
	if t.m.format != nil && string(t.m.format) != string(want) {
		return &FormatError{Have: slices.Clone(t.m.format), Want: want}
	}
	t.m.format = want
	return nil
}

func (t *memTable) Format(ctx context.Context) (Format, bool, error) {
	if err := t.enter(ctx, false); err != nil {
		return Format{}, false, err
	}
	raw := t.m.format
	t.m.mu.Unlock()
	if raw == nil {
		return Format{}, false, nil
	}
	f, err := decodeFormat(raw) // a copy: nothing shared with the Mem
	return f, err == nil, err
}

func (t *memTable) put(ctx context.Context, key uint64, e Entry) (uint64, error) {
	if err := t.enter(ctx, true); err != nil {
		return 0, err
	}
	defer t.m.mu.Unlock()
	next := max(t.m.next, 1)
	if key == 0 {
		key = next
	}
	t.m.entries[key] = cloneEntry(e)
	t.m.next = max(next, key+1)
	return key, nil
}

func (t *memTable) Add(ctx context.Context, e Entry) (uint64, error) { return t.put(ctx, 0, e) }

func (t *memTable) Put(ctx context.Context, key uint64, e Entry) error {
	if key == 0 {
		return fmt.Errorf("metastore: put: key 0 is never given")
	}
	_, err := t.put(ctx, key, e)
	return err
}

func (t *memTable) Delete(ctx context.Context, keys ...uint64) error {
	if err := t.enter(ctx, true); err != nil {
		return err
	}
	defer t.m.mu.Unlock()
	for _, k := range keys {
		delete(t.m.entries, k)
	}
	return nil
}

func (t *memTable) Entries(ctx context.Context) ([]Record, error) {
	if err := t.enter(ctx, false); err != nil {
		return nil, err
	}
	defer t.m.mu.Unlock()
	var out []Record
	for k, e := range t.m.entries {
		out = append(out, Record{Key: k, Entry: cloneEntry(e)})
	}
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

func (t *memTable) PutMarks(ctx context.Context, marks map[uint64]StepMark) error {
	if err := t.enter(ctx, true); err != nil {
		return err
	}
	defer t.m.mu.Unlock()
	for k, m := range marks {
		t.m.marks[k] = cloneMark(m)
	}
	return nil
}

func (t *memTable) DeleteMarks(ctx context.Context, keys ...uint64) error {
	if err := t.enter(ctx, true); err != nil {
		return err
	}
	defer t.m.mu.Unlock()
	for _, k := range keys {
		delete(t.m.marks, k)
	}
	return nil
}

func (t *memTable) Marks(ctx context.Context) (map[uint64]StepMark, error) {
	if err := t.enter(ctx, false); err != nil {
		return nil, err
	}
	defer t.m.mu.Unlock()
	out := make(map[uint64]StepMark, len(t.m.marks))
	for k, m := range t.m.marks {
		out[k] = cloneMark(m)
	}
	return out, nil
}

func (t *memTable) ClearMarks(ctx context.Context) error {
	if err := t.enter(ctx, true); err != nil {
		return err
	}
	defer t.m.mu.Unlock()
	clear(t.m.marks)
	return nil
}

func cloneEntry(e Entry) Entry {
	e.Nodes = slices.Clone(e.Nodes)
	e.Ranks = slices.Clone(e.Ranks)
	return e
}

func cloneMark(m StepMark) StepMark {
	m.Lens = slices.Clone(m.Lens)
	for i, l := range m.Lens {
		m.Lens[i] = slices.Clone(l)
	}
	return m
}
