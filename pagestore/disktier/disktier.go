package disktier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/pagestore/tier"
)

// indexName is the index file of a directory (bbolt).
const indexName = "index.db"

// stripes is the number of slot locks: calls on slots equal mod stripes
// serialize.
const stripes = 256

// Tier is a disk tier: see the package documentation. Create it with
// [Open]; it implements tier.Tier.
type Tier struct {
	cfg       Config
	slotBytes int64
	dir       string // absolute
	index     string // path of index.db
	db        metastore.SlotIndex

	closeMu sync.Mutex // serializes Close
	life    sync.RWMutex
	closed  bool // guarded by life

	locks   []sync.RWMutex // by slot % stripes
	entries []entry        // entries[s] guarded by locks[s%stripes]

	filesMu sync.Mutex
	files   []*os.File // by file number; nil until first used
	sized   []bool     // files[i] holds all its slots (extended by a write)

	// SyncPeriodic and SyncNone: index updates and slab files waiting
	// for the next flush.
	pendMu  sync.Mutex
	pending map[int]entry
	dirty   map[int]bool
	// flushing is the number of updates a flush has taken and not yet
	// committed or queued again (Stats counts them pending).
	flushing int
	flushMu  sync.Mutex // serializes flushes
	stop     chan struct{}
	done     chan struct{}

	reads, writes, frees, corrupt, flushes atomic.Int64
	flushErr                               atomic.Pointer[error]
}

var _ tier.Tier = (*Tier)(nil)

// Open opens the tier in cfg.Dir, creating the directory and its index if
// absent, and loads the index: every slot written before (and not freed)
// reads back its payload. It fails with an error wrapping ErrInUse when
// the directory is open elsewhere, ErrMismatch when it was created with
// another geometry, ErrInvalidConfig for a bad cfg and tier.ErrCorrupt for
// an unreadable index. Errors name the directory.
func Open(cfg Config) (*Tier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("disktier: open %s: %w", cfg.Dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("disktier: open %s: %w", dir, err)
	}
	index := filepath.Join(dir, indexName)
	_, statErr := os.Stat(index)
	fresh := errors.Is(statErr, fs.ErrNotExist)
	db, err := metastore.OpenBoltSlotIndex(index, metastore.Options{Timeout: cfg.LockTimeout})
	if errors.Is(err, metastore.ErrInUse) {
		return nil, fmt.Errorf("disktier: open %s: its index %s is locked by another open tier, in this process or another (waited %v): %w",
			dir, index, cfg.LockTimeout, ErrInUse)
	}
	if errors.Is(err, metastore.ErrCorrupt) {
		return nil, fmt.Errorf("disktier: open %s: index %s: %w: %w", dir, index, err, tier.ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("disktier: open %s: index %s: %w", dir, index, err)
	}
	if fresh {
		if err := syncDir(dir); err != nil {
			db.Close()
			return nil, fmt.Errorf("disktier: open %s: %w", dir, err)
		}
	}
	entries, err := db.Init(context.Background(), slotFormatOf(cfg))
	if err != nil {
		db.Close()
		if errors.Is(err, metastore.ErrOtherFormat) {
			err = fmt.Errorf("%w: %w", err, ErrMismatch)
		}
		return nil, fmt.Errorf("disktier: open %s: index %s: %w", dir, index, err)
	}
	nfiles := (cfg.Slots + cfg.SlotsPerFile - 1) / cfg.SlotsPerFile
	t := &Tier{
		cfg:       cfg,
		slotBytes: cfg.SlotBytes(),
		dir:       dir,
		index:     index,
		db:        db,
		locks:     make([]sync.RWMutex, min(cfg.Slots, stripes)),
		entries:   entries,
		files:     make([]*os.File, nfiles),
		sized:     make([]bool, nfiles),
	}
	if cfg.Durability != SyncOnWrite {
		t.pending = map[int]entry{}
		t.dirty = map[int]bool{}
	}
	if cfg.Durability == SyncPeriodic {
		t.stop = make(chan struct{})
		t.done = make(chan struct{})
		go t.flusher()
	}
	return t, nil
}

// Slots implements tier.Tier.
func (t *Tier) Slots() int { return t.cfg.Slots }

// PayloadBytes implements tier.Tier.
func (t *Tier) PayloadBytes() int { return t.cfg.PayloadBytes }

// Dir returns the tier's directory (absolute).
func (t *Tier) Dir() string { return t.dir }

// Config returns the configuration the tier was opened with.
func (t *Tier) Config() Config { return t.cfg }

// begin checks the arguments of a call and holds t.life for reading; the
// caller releases it when err is nil. n < 0 skips the size check.
func (t *Tier) begin(ctx context.Context, op string, slot, n int) error {
	if err := tier.CheckContext(ctx); err != nil {
		return fmt.Errorf("disktier %s: %s slot %d: %w", t.dir, op, slot, err)
	}
	if err := tier.CheckSlot(slot, t.cfg.Slots); err != nil {
		return fmt.Errorf("disktier %s: %s: %w", t.dir, op, err)
	}
	if n >= 0 {
		if err := tier.CheckSize(n, t.cfg.PayloadBytes); err != nil {
			return fmt.Errorf("disktier %s: %s slot %d: %w", t.dir, op, slot, err)
		}
	}
	t.life.RLock()
	if t.closed {
		t.life.RUnlock()
		return fmt.Errorf("disktier %s: %s slot %d: %w", t.dir, op, slot, tier.ErrClosed)
	}
	return nil
}

func (t *Tier) lock(slot int) *sync.RWMutex { return &t.locks[slot%len(t.locks)] }

// where returns slot's file number and offset.
func (t *Tier) where(slot int) (file int, off int64) {
	return slot / t.cfg.SlotsPerFile, int64(slot%t.cfg.SlotsPerFile) * t.slotBytes
}

func (t *Tier) slabPath(file int) string {
	return filepath.Join(t.dir, fmt.Sprintf("slab-%06d", file))
}

// file returns slab file number fi, opening it on first use. For a write
// (create) it is created when absent (and the directory synced) and
// extended, once, to hold all its slots when shorter; for a read a missing
// file is an error wrapping tier.ErrCorrupt, and a short one is left as it
// is (its slots past the end read ErrCorrupt).
func (t *Tier) file(fi int, create bool) (*os.File, error) {
	t.filesMu.Lock()
	defer t.filesMu.Unlock()
	f := t.files[fi]
	if f == nil {
		path := t.slabPath(fi)
		flag := os.O_RDWR
		if create {
			flag |= os.O_CREATE | os.O_EXCL
		}
		var err error
		f, err = os.OpenFile(path, flag, 0o600)
		created := err == nil && create
		if create && errors.Is(err, fs.ErrExist) {
			f, err = os.OpenFile(path, os.O_RDWR, 0)
		}
		if errors.Is(err, fs.ErrNotExist) && !create {
			return nil, fmt.Errorf("slab file %s is missing: %w", path, tier.ErrCorrupt)
		}
		if err != nil {
			return nil, err
		}
		if created {
			if err := syncDir(t.dir); err != nil {
				f.Close()
				return nil, fmt.Errorf("slab file %s: %w", path, err)
			}
		}
		t.files[fi] = f
	}
	if create && !t.sized[fi] {
		want := int64(min(t.cfg.SlotsPerFile, t.cfg.Slots-fi*t.cfg.SlotsPerFile)) * t.slotBytes
		st, err := f.Stat()
		if err == nil && st.Size() < want {
			err = reserve(f, want, t.cfg.Preallocate)
			if err == nil && t.cfg.Durability == SyncOnWrite {
				err = f.Sync() // the new size is metadata: make it durable once
			}
		}
		if err != nil {
			return nil, fmt.Errorf("slab file %s: %w", f.Name(), err)
		}
		t.sized[fi] = true
	}
	return f, nil
}

// Write implements tier.Tier.
func (t *Tier) Write(ctx context.Context, slot int, payload []byte) error {
	if err := t.begin(ctx, "write", slot, len(payload)); err != nil {
		return err
	}
	defer t.life.RUnlock()
	t.writes.Add(1)
	l := t.lock(slot)
	l.Lock()
	defer l.Unlock()
	fi, off := t.where(slot)
	f, err := t.file(fi, true)
	if err != nil {
		return fmt.Errorf("disktier %s: write slot %d: %w", t.dir, slot, err)
	}
	e := entry{Used: true, CRC: checksum(slot, payload)}
	if _, err := f.WriteAt(payload, off); err != nil {
		return fmt.Errorf("disktier %s: write slot %d to %s at %d: %w", t.dir, slot, f.Name(), off, err)
	}
	if t.cfg.Durability != SyncOnWrite {
		t.entries[slot] = e
		t.queue(slot, e, fi)
		return nil
	}
	if err := datasync(f); err != nil {
		return fmt.Errorf("disktier %s: write slot %d: %w", t.dir, slot, err)
	}
	// The payload is on disk: its entry commits even if ctx ends now.
	if err := t.db.Commit(context.WithoutCancel(ctx), map[int]entry{slot: e}); err != nil {
		return fmt.Errorf("disktier %s: write slot %d: index %s: %w", t.dir, slot, t.index, err)
	}
	t.entries[slot] = e
	return nil
}

// Read implements tier.Tier. A payload that fails its length or checksum
// check returns an error wrapping tier.ErrCorrupt, naming the slot and the
// slab file, with dst zeroed.
func (t *Tier) Read(ctx context.Context, slot int, dst []byte) error {
	if err := t.begin(ctx, "read", slot, len(dst)); err != nil {
		return err
	}
	defer t.life.RUnlock()
	t.reads.Add(1)
	l := t.lock(slot)
	l.RLock()
	defer l.RUnlock()
	e := t.entries[slot]
	if !e.Used {
		return fmt.Errorf("disktier %s: read slot %d: %w", t.dir, slot, tier.ErrEmpty)
	}
	fi, off := t.where(slot)
	f, err := t.file(fi, false)
	if err != nil {
		t.corrupt.Add(1)
		return fmt.Errorf("disktier %s: read slot %d: %w", t.dir, slot, err)
	}
	n, err := f.ReadAt(dst, off)
	if err != nil {
		clear(dst)
		if errors.Is(err, io.EOF) {
			t.corrupt.Add(1)
			return fmt.Errorf("disktier %s: read slot %d from %s at %d: short slab file (%d of %d bytes): %w",
				t.dir, slot, f.Name(), off, n, len(dst), tier.ErrCorrupt)
		}
		return fmt.Errorf("disktier %s: read slot %d from %s at %d: %w", t.dir, slot, f.Name(), off, err)
	}
	if got := checksum(slot, dst); got != e.CRC {
		clear(dst)
		t.corrupt.Add(1)
		return fmt.Errorf("disktier %s: read slot %d from %s at %d: checksum %08x, index has %08x: %w",
			t.dir, slot, f.Name(), off, got, e.CRC, tier.ErrCorrupt)
	}
	return nil
}

// Free implements tier.Tier: it drops the slot's index entry (the slab
// bytes stay until the slot is written again).
func (t *Tier) Free(ctx context.Context, slot int) error {
	if err := t.begin(ctx, "free", slot, -1); err != nil {
		return err
	}
	defer t.life.RUnlock()
	t.frees.Add(1)
	l := t.lock(slot)
	l.Lock()
	defer l.Unlock()
	if !t.entries[slot].Used {
		return fmt.Errorf("disktier %s: free slot %d: %w", t.dir, slot, tier.ErrEmpty)
	}
	if t.cfg.Durability != SyncOnWrite {
		t.entries[slot] = entry{}
		t.queue(slot, entry{}, -1)
		return nil
	}
	if err := t.db.Commit(context.WithoutCancel(ctx), map[int]entry{slot: {}}); err != nil {
		return fmt.Errorf("disktier %s: free slot %d: index %s: %w", t.dir, slot, t.index, err)
	}
	t.entries[slot] = entry{}
	return nil
}

// Used returns the slots that hold a payload, in increasing order (nil
// after Close): after Open, the slots to mark allocated
// (tier.NewAllocator(t.Slots(), t.Used()...)).
func (t *Tier) Used() []int {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return nil
	}
	for i := range t.locks {
		t.locks[i].RLock()
	}
	var used []int
	for s, e := range t.entries {
		if e.Used {
			used = append(used, s)
		}
	}
	for i := range t.locks {
		t.locks[i].RUnlock()
	}
	return used
}

// Close flushes what is pending (SyncPeriodic, SyncNone), closes the slab
// files and the index, and releases the directory's lock. Calls in flight
// finish first; later calls return tier.ErrClosed. Calls of Close after
// the first return nil.
func (t *Tier) Close() error {
	t.closeMu.Lock()
	defer t.closeMu.Unlock()
	t.life.RLock()
	closed := t.closed
	t.life.RUnlock()
	if closed {
		return nil
	}
	if t.stop != nil {
		close(t.stop)
		<-t.done
	}
	t.life.Lock()
	t.closed = true
	t.life.Unlock()

	var errs []error
	if t.cfg.Durability != SyncOnWrite {
		if err := t.flush(); err != nil {
			errs = append(errs, err)
		}
	}
	t.filesMu.Lock()
	for i, f := range t.files {
		if f == nil {
			continue
		}
		if err := f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("slab file %s: %w", f.Name(), err))
		}
		t.files[i] = nil
	}
	t.filesMu.Unlock()
	if err := t.db.Close(); err != nil {
		errs = append(errs, fmt.Errorf("index %s: %w", t.index, err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("disktier %s: close: %w", t.dir, err)
	}
	return nil
}

// syncDir fsyncs directory dir, making file creations in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
