package disktier

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/questrt/questrt/pagestore/tier"
)

// queue records an index update for the next flush (SyncPeriodic,
// SyncNone); fi >= 0 marks that slab file written. The caller holds the
// slot's lock, so updates of one slot queue in their order.
func (t *Tier) queue(slot int, e entry, fi int) {
	t.pendMu.Lock()
	t.pending[slot] = e
	if fi >= 0 {
		t.dirty[fi] = true
	}
	t.pendMu.Unlock()
}

// flush makes every Write and Free that returned before it started
// durable: it takes the queued updates, fdatasyncs the slab files written
// since the last flush, then commits the updates in one bbolt transaction.
// A slab write after the take is synced too, early, but its index entry
// waits for the next flush. On error the taken updates are queued again
// (unless a newer one of the same slot came in) and the error is kept for
// [Tier.Stats].
func (t *Tier) flush() error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.pendMu.Lock()
	batch, files := t.pending, t.dirty
	t.pending, t.dirty = map[int]entry{}, map[int]bool{}
	t.flushing = len(batch) // still pending for Stats until committed
	t.pendMu.Unlock()
	if len(batch) == 0 && len(files) == 0 {
		return nil
	}
	err := t.syncFiles(files)
	if err == nil {
		if cerr := t.db.Commit(context.Background(), batch); cerr != nil {
			err = fmt.Errorf("index %s: %w", t.index, cerr)
		}
	}
	if err != nil {
		t.pendMu.Lock()
		for s, e := range batch {
			if _, newer := t.pending[s]; !newer {
				t.pending[s] = e
			}
		}
		maps.Copy(t.dirty, files)
		t.flushing = 0
		t.pendMu.Unlock()
		err = fmt.Errorf("disktier %s: flush: %w", t.dir, err)
		t.flushErr.Store(&err)
		return err
	}
	t.flushes.Add(1)
	t.flushErr.Store(nil)
	t.pendMu.Lock()
	t.flushing = 0
	t.pendMu.Unlock()
	return nil
}

func (t *Tier) syncFiles(files map[int]bool) error {
	for fi := range files {
		t.filesMu.Lock()
		f := t.files[fi]
		t.filesMu.Unlock()
		if f == nil {
			continue
		}
		if err := datasync(f); err != nil {
			return err
		}
	}
	return nil
}

// flusher flushes every SyncInterval until Close.
func (t *Tier) flusher() {
	defer close(t.done)
	tk := time.NewTicker(t.cfg.SyncInterval)
	defer tk.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tk.C:
			_ = t.flush() // kept for Stats; retried next tick
		}
	}
}

// Sync makes every Write and Free that returned before it durable (a
// flush); with SyncOnWrite they already are, and Sync returns nil.
func (t *Tier) Sync(ctx context.Context) error {
	if err := tier.CheckContext(ctx); err != nil {
		return fmt.Errorf("disktier %s: sync: %w", t.dir, err)
	}
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return fmt.Errorf("disktier %s: sync: %w", t.dir, tier.ErrClosed)
	}
	if t.cfg.Durability == SyncOnWrite {
		return nil
	}
	return t.flush()
}

// Stats is a snapshot of a tier's counters.
type Stats struct {
	// Used is the number of slots holding a payload.
	Used int
	// Reads, Writes and Frees count the calls that passed their argument
	// checks.
	Reads, Writes, Frees int64
	// Corrupt counts Reads that returned tier.ErrCorrupt.
	Corrupt int64
	// Pending is the number of index updates not yet committed: those
	// waiting for a flush and those of a flush in progress (so Pending
	// 0 means every Write and Free that returned is durable), and
	// Flushes the flushes that committed (SyncPeriodic, SyncNone).
	Pending int
	Flushes int64
	// FlushErr is the error of the last flush when it failed (its updates
	// are retried at the next one), else nil.
	FlushErr error
}

// Stats returns the tier's counters.
func (t *Tier) Stats() Stats {
	s := Stats{
		Used:    len(t.Used()),
		Reads:   t.reads.Load(),
		Writes:  t.writes.Load(),
		Frees:   t.frees.Load(),
		Corrupt: t.corrupt.Load(),
		Flushes: t.flushes.Load(),
	}
	if t.cfg.Durability != SyncOnWrite {
		t.pendMu.Lock()
		s.Pending = len(t.pending) + t.flushing
		t.pendMu.Unlock()
	}
	if p := t.flushErr.Load(); p != nil {
		s.FlushErr = *p
	}
	return s
}
