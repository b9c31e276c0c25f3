package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/pagestore"
)

// Damage found after the open (Config.Verify pagestore.VerifyOnRead). A
// hosted rank's store that finds a recovered page failing its check (at
// the first operation reading it, or by its background scrub) releases
// the sequences naming it (pagestore.ErrDamaged) and lists them
// (pagestore.Store.DamagedFrom). The worker learns of them when it next
// takes its lock, and when it gives it back, and drops each such
// sequence (live or parked) at once:
//
//   - its store sequences on the other hosted ranks are released;
//   - its table entry becomes a tombstone (metastore.Entry.Damaged, the
//     reason, naming no store sequence), so that the next open reports
//     it in RecoveryReport.Damaged with that reason, not as a store
//     sequence that "was not persisted";
//   - every later call naming it fails with an error wrapping
//     pagestore.ErrDamaged (DATA_LOSS on the wire), as the store's own
//     operations did, until Release (live) or DropRecovered (parked)
//     forgets it and deletes the tombstone, or Create reuses its id.
//
// A sequence held by the open step is dropped when the step ends (its
// layers fail meanwhile, from the store).

// damageEvent is a store sequence of hosted rank i released as damaged.
type damageEvent struct {
	i   int
	id  pagestore.SeqID
	err error
}

// lostSeq is a sequence dropped as damaged since NewLocal.
type lostSeq struct {
	key uint64 // its table entry (the tombstone), 0 if none
	err error  // wraps pagestore.ErrDamaged
}

// lock takes l.mu and drops the sequences the stores found damaged
// since the last look.
func (l *Local) lock() {
	l.mu.Lock()
	l.sweepDamaged(false)
}

// unlock drops the sequences the stores found damaged (the operation
// may have found some) and gives l.mu back.
func (l *Local) unlock() {
	l.sweepDamaged(false)
	l.mu.Unlock()
}

// sweepDamaged drops the sequences the hosted ranks' stores released as
// damaged since the last sweep (l.mu held); closing (Close), also those
// of the open step. It does nothing after Close. Once Close has closed
// the stores, the other ranks' store sequences of a sequence dropped
// then stay in their manifests: the tombstone names none of them, and
// the next open releases them as orphans.
func (l *Local) sweepDamaged(closing bool) {
	if l.closed && !closing {
		return
	}
	for i, rk := range l.ranks {
		ds := rk.sh.Store().DamagedFrom(rk.damagedSeen)
		rk.damagedSeen += len(ds)
		for _, d := range ds {
			l.damagePending = append(l.damagePending, damageEvent{i: i, id: d.ID, err: d.Err})
		}
	}
	if len(l.damagePending) == 0 {
		return
	}
	keep := l.damagePending[:0]
	for _, ev := range l.damagePending {
		if !l.dropDamaged(ev, closing) {
			keep = append(keep, ev)
		}
	}
	clear(l.damagePending[len(keep):])
	l.damagePending = keep
}

// dropDamaged drops the sequence that names ev's store sequence, and
// reports whether ev is done with: false when the open step holds it
// (and not closing).
func (l *Local) dropDamaged(ev damageEvent, closing bool) bool {
	var (
		seq    uint64
		sq     *seqState
		parked bool
	)
	for s, q := range l.seqs {
		if q.local[ev.i] == ev.id {
			seq, sq = s, q
			break
		}
	}
	if sq == nil {
		for k, q := range l.parked {
			if q.local[ev.i] == ev.id {
				seq, sq, parked = k, q, true
				break
			}
		}
	}
	if sq == nil {
		return true // released since, or dropped by recovery
	}
	if st := l.step; !parked && !closing && st != nil {
		if _, busy := st.index[seq]; busy {
			return false
		}
	}
	rk := l.ranks[ev.i]
	err := fmt.Errorf("rank %v: %w", rk.id, ev.err)
	if !errors.Is(err, pagestore.ErrDamaged) { // not reached: the store's errors wrap it
		err = fmt.Errorf("%w: %w", pagestore.ErrDamaged, err)
	}
	for i, r := range l.ranks {
		if i != ev.i && !l.storesClosed {
			_ = r.sh.Release(sq.local[i])
		}
		if r.mirror != nil && !parked {
			r.mirror.Drop(seq)
		}
	}
	id := seq
	if parked {
		delete(l.parked, seq)
		l.nparked.Store(int64(len(l.parked)))
		id = sq.recovered.seq
		l.lostKeys[seq] = lostSeq{key: sq.key, err: err}
	} else {
		delete(l.seqs, seq)
		l.lost[seq] = lostSeq{key: sq.key, err: err}
	}
	l.damagedSince = append(l.damagedSince, DamagedSeq{Key: sq.key, Seq: id, Grid: sq.grid, Err: err})
	if l.db != nil && sq.key != 0 {
		e := metastore.Entry{Seq: id, Grid: sq.grid, Nodes: sq.nodes, Placement: sq.layout.Placement, BlockPages: sq.layout.BlockPages, Damaged: err.Error()}
		if perr := l.db.Put(context.Background(), sq.key, e); perr != nil {
			// The entry still names the released store sequences: the
			// next open reports them not persisted.
			_ = l.ioError("commit sequence table", l.tablePath(), perr)
		}
	}
	return true
}

// forgetLost forgets the dropped sequence seq (key, when parked) and
// deletes its tombstone; ok is false when it is not one.
func (l *Local) forgetLost(m map[uint64]lostSeq, id uint64) (ok bool, err error) {
	ls, ok := m[id]
	if !ok {
		return false, nil
	}
	delete(m, id)
	if l.db != nil && ls.key != 0 {
		if err := l.db.Delete(context.Background(), ls.key); err != nil {
			return true, l.ioError("commit sequence table", l.tablePath(), err)
		}
	}
	return true, nil
}

// Damaged returns the sequences dropped since NewLocal because a page of
// theirs failed its check after the open (Config.Verify
// pagestore.VerifyOnRead), in the order they were found: Seq is the id
// of a live one, or the id at recovery of a parked one (Key its
// key). Each Err wraps pagestore.ErrDamaged. The next open reports
// them in RecoveryReport.Damaged.
func (l *Local) Damaged() []DamagedSeq {
	l.lock()
	defer l.unlock()
	return append([]DamagedSeq(nil), l.damagedSince...)
}
