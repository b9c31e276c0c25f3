package worker

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/internal/metastore"
)

// Step markers: what makes a decode step atomic across a crash or a
// stop (Config.DataDir). A step's new token is acknowledged when the
// step ends (EndStep): until then its appends on this worker's ranks
// are provisional. Before the first of them can reach the disk, the
// worker commits a marker per sequence of the step: the store lengths
// of every hosted rank and layer when the step began. EndStep deletes
// the markers. Recovery keeps the token of a sequence whose marker's
// layers all hold it on every hosted rank (stepDone: the step ran its
// last layer here, and its answer may have reached the client before
// EndStep), and otherwise cuts every layer of a sequence that has a
// marker back to the marker's lengths ([pagestore.Store.Truncate]) and
// reports what it cut ([RecoveredSeq.RolledBack]); layers the step did
// not reach, and lengths left uneven by acknowledged appends of single
// layers, stay as persisted.
//
// A step's token can reach the disk in two ways only: an append that
// completes a page in every layer of its store (a sealed page is
// written, synchronously or by the periodic flusher; tail pages never
// are), and a Close while the step is open (which saves tail pages).
// BeginStep commits the markers of the first case, Close those of the
// second; the other steps cost no disk write. A marker
// (metastore.StepMark) is kept in the sequence table under its
// sequence's entry key; its Lens are in Local.ranks order.

// takeMarks records, at BeginStep (l.mu held, persisting workers only),
// the store lengths of the layers the step may append to on the ranks
// that store a new token: layers from the step's first on, -1 for the
// others (untouched by the step).
func (l *Local) takeMarks(st *stepState) error {
	st.marks = st.marks[:0]
	for range st.sq {
		st.marks = append(st.marks, nil)
	}
	for r, rk := range l.ranks {
		for _, si := range st.own[r] {
			m := st.marks[si]
			if m == nil {
				m = make([][]int, len(l.ranks))
				st.marks[si] = m
			}
			m[r] = make([]int, l.cfg.Layers)
			for layer := range l.cfg.Layers {
				m[r][layer] = -1
				if layer < st.first {
					continue
				}
				n, err := rk.sh.Store().LayerLen(st.sq[si].local[r], layer)
				if err != nil {
					return fmt.Errorf("rank %v: %w", rk.id, err)
				}
				m[r][layer] = n
			}
		}
	}
	return nil
}

// sealsPage reports whether the step's new token of batch entry si can
// complete a page in every layer of a hosted rank's store, so that an
// append of the step may write it to disk (l.mu held, after takeMarks).
func (l *Local) sealsPage(st *stepState, si int) bool {
	S := l.cfg.PageSize
	for _, lens := range st.marks[si] {
		for _, n := range lens {
			if n >= 0 && (n+1)%S == 0 {
				return true
			}
		}
	}
	return false
}

// putMarks commits the markers of the batch entries idx of the open
// step in one commit (l.mu held) and remembers them.
func (l *Local) putMarks(st *stepState, idx []int) error {
	if l.db == nil || len(idx) == 0 {
		return nil
	}
	put := map[uint64]metastore.StepMark{}
	for _, si := range idx {
		sq := st.sq[si]
		if sq.key == 0 || st.marks[si] == nil {
			continue
		}
		put[sq.key] = metastore.StepMark{Step: st.id, Lens: st.marks[si]}
	}
	if err := l.db.PutMarks(context.Background(), put); err != nil {
		return l.ioError("commit step marker", l.tablePath(), err)
	}
	if l.marked == nil {
		l.marked = map[uint64]bool{}
	}
	for k := range put {
		l.marked[k] = true
	}
	return nil
}

// clearMarks deletes every marker the worker committed (l.mu held).
func (l *Local) clearMarks() error {
	if l.db == nil || l.closed || len(l.marked) == 0 {
		return nil
	}
	keys := make([]uint64, 0, len(l.marked))
	for k := range l.marked {
		keys = append(keys, k)
	}
	if err := l.db.DeleteMarks(context.Background(), keys...); err != nil {
		return l.ioError("delete step marker", l.tablePath(), err)
	}
	clear(l.marked)
	return nil
}

// stepDone reports whether the step of marker m had appended its token
// to every layer the marker covers on every hosted rank that stores it
// (recovery, before undoStep): a step done here, which recovery keeps.
// A client is told a step is done only after its last layer's answer,
// which needs every rank's last layer, which appends first; so a step
// whose answer went out is done on every worker (nothing acknowledged
// is rolled back), and a step done on every worker may have lost only
// its answer (kept, as a step that completed). A step done here and not
// on another worker is rolled back there, and the coordinator cuts it
// here ([MaxLens], engine.Adopt). A marker covers every layer from the
// step's first to the model's last: a step that ends before the last
// layer is never done here, and an interrupted one is rolled back
// (a crash after its answer and before EndStep included).
func (l *Local) stepDone(sq *seqState, m metastore.StepMark) (bool, error) {
	if len(m.Lens) != len(l.ranks) {
		return false, nil // undoStep refuses it
	}
	covered := false
	for i, rk := range l.ranks {
		lens := m.Lens[i]
		if lens == nil {
			continue
		}
		if len(lens) != l.cfg.Layers {
			return false, nil // undoStep refuses it
		}
		for layer, mark := range lens {
			if mark < 0 {
				continue
			}
			n, err := rk.sh.Store().LayerLen(sq.local[i], layer)
			if err != nil {
				return false, fmt.Errorf("rank %v: %w", rk.id, err)
			}
			if n <= mark {
				return false, nil
			}
			covered = true
		}
	}
	return covered, nil
}

// undoStep cuts the hosted ranks' layers of recovered sequence sq back
// to its step marker m (recovery): a layer holding more than the marker
// records took the interrupted step's token, never acknowledged. It
// returns, per layer, the global tokens cut (the largest over the
// hosted ranks: TP ranks hold shares of the same tokens).
func (l *Local) undoStep(sq *seqState, m metastore.StepMark) ([]int, error) {
	c := l.cfg
	cut := make([]int, c.Layers)
	if len(m.Lens) != len(l.ranks) {
		return cut, fmt.Errorf("step marker of step %d names %d ranks, the worker hosts %d", m.Step, len(m.Lens), len(l.ranks))
	}
	for i, rk := range l.ranks {
		lens := m.Lens[i]
		if lens == nil {
			continue
		}
		if len(lens) != c.Layers {
			return cut, fmt.Errorf("step marker of step %d: rank %v has %d lengths for %d layers", m.Step, rk.id, len(lens), c.Layers)
		}
		st := rk.sh.Store()
		have := make([]int, c.Layers)
		to := make([]int, c.Layers)
		any := false
		for layer := range c.Layers {
			n, err := st.LayerLen(sq.local[i], layer)
			if err != nil {
				return cut, fmt.Errorf("rank %v: %w", rk.id, err)
			}
			have[layer], to[layer] = n, n
			if lens[layer] >= 0 && n > lens[layer] {
				to[layer], any = lens[layer], true
			}
		}
		if !any {
			continue
		}
		if err := st.Truncate(sq.local[i], to); err != nil {
			return cut, fmt.Errorf("rank %v: undo step %d: %w", rk.id, m.Step, err)
		}
		for layer := range c.Layers {
			cut[layer] = max(cut[layer], have[layer]-to[layer])
		}
	}
	return cut, nil
}

// crashPoint calls Config.CrashPoint (crash tests).
func (l *Local) crashPoint(name string) {
	if f := l.cfg.CrashPoint; f != nil && l.db != nil {
		f(name)
	}
}
