package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/plan"
)

// Persistence of a worker (Config.DataDir). Layout of the directory:
//
//	DIR/worker.db              the sequence table (metastore.SeqTable in
//	                           bbolt): the format record (the grid, the
//	                           hosted ranks and the geometry), one entry
//	                           per sequence (its coordinator id, layout
//	                           and store id on every hosted rank) under a
//	                           key the table gives, and the step markers
//	DIR/rank-tp<T>-cp<C>/      each hosted rank's page store
//	                           (pagestore.Config.DataDir)
//
// Order of writes, so that a crash at any point leaves a state recovery
// understands: Create and Fork make the store sequences first (each
// store commits its own manifest) and then commit the entry; Release
// deletes the entry first and then releases the store sequences. Store
// sequences that no entry names (a crash between the two) are released
// at recovery; an entry whose store sequence did not come back (a
// damaged page, or a periodic store that had not committed it) is
// reported damaged and deleted.
//
// The table's writes take context.Background(): each is one step of an
// operation that checked its caller's context at its start, and one
// abandoned half-way would leave the state the order of writes above
// guards against.

// tableName is the worker's sequence table in a data directory.
const tableName = "worker.db"

// tableTimeout bounds the wait for another opener's lock on the table.
const tableTimeout = 100 * time.Millisecond

// RankDir is the page store directory of rank r in a worker's data
// directory dir.
func RankDir(dir string, r Rank) string {
	return filepath.Join(dir, "rank-tp"+strconv.Itoa(r.TP)+"-cp"+strconv.Itoa(r.CP))
}

// RecoveryReport says what NewLocal found in Config.DataDir.
type RecoveryReport struct {
	// Dir is the data directory; empty when the worker does not persist.
	Dir string
	// Sequences are the recovered sequences, by increasing key. They are
	// parked: no message reaches them until [Local.Claim] makes one live
	// again (or [Local.DropRecovered] frees it; [Local.Park] parks a
	// claimed one again). Their pages count against the ranks' pools
	// meanwhile, and Close persists them.
	Sequences []RecoveredSeq
	// Damaged are the sequences found in the table but not recovered;
	// their entries were deleted.
	Damaged []DamagedSeq
	// OrphanSeqs counts store sequences no table entry named (created or
	// released around a crash); they were released.
	OrphanSeqs int
	// Ranks are the hosted ranks' page store reports, in spec order.
	Ranks []pagestore.RecoveryReport
}

// LostTokens is the sum of the recovered sequences' lost tokens.
func (r RecoveryReport) LostTokens() int {
	n := 0
	for _, s := range r.Sequences {
		n += s.LostTokens()
	}
	return n
}

// RolledBackTokens is the sum over the recovered sequences of the
// tokens recovery cut per layer (RecoveredSeq.RolledBack): appends of
// an interrupted step, never acknowledged.
func (r RecoveryReport) RolledBackTokens() int {
	n := 0
	for _, s := range r.Sequences {
		for _, k := range s.RolledBack {
			n += k
		}
	}
	return n
}

// CorruptSlots is the number of slab slots, over the hosted ranks, whose
// payload or record failed its check.
func (r RecoveryReport) CorruptSlots() int {
	n := 0
	for _, rr := range r.Ranks {
		n += len(rr.CorruptSlots)
	}
	return n
}

// RecoveredSeq is one recovered (parked) sequence.
type RecoveredSeq struct {
	// Key is the worker's handle of the sequence (Claim, DropRecovered).
	Key uint64
	// Seq is the coordinator's id it had when the worker stopped, and
	// Grid the Config.GridID of the worker that created or forked it (a
	// Claim keeps both when it keeps the id: a sequence claimed after
	// each of several restarts keeps the names it was created with):
	// (Grid, Seq) names it on every worker of its grid.
	Seq    uint64
	Grid   string
	Layout plan.Layout
	// Placement is the node names per rank (tp*CP+cp) of the grid that
	// wrote its entry first (Config.Placement there); empty when none
	// was recorded. A coordinator adopts it only on the same placement.
	Placement []string
	// Recovered are its lengths (decode.Recovered). Lens: the position
	// just past the last token the hosted ranks hold in each layer (so
	// never more than were appended; a worker hosting only some CP
	// ranks cannot see the tokens of the others, and reports the end of
	// its own). Layers may differ: after a graceful Close as the layers
	// were, after a crash as their sealed pages hold them, in both
	// cases less the tokens of an interrupted step (RolledBack). Every
	// hosted rank holds exactly its share of them: a rank that had
	// persisted more was rolled back to the longest length all the
	// hosted ranks agree on. Ranks on other workers are not known here:
	// their coordinator reconciles ([MaxLens] gives the longest global
	// lengths these tokens are consistent with).
	//
	// RolledBack: the tokens per layer that recovery cut because the
	// step that appended them had not ended when the worker stopped
	// (its step marker, stepmark.go) and had not reached its last layer
	// on every hosted rank: the step's result never reached its caller,
	// so they were never acknowledged (a step that had is kept). They
	// are counted in Had and LostTokens as well.
	//
	// Had: the length when the worker stopped, as far as the hosted
	// ranks know (from the stores' length records: exact after a
	// process crash, kill -9). A coordinator whose grid spans several
	// workers takes the smallest Lens and the largest Had over them.
	//
	// HadLens: per layer, the global length the layer held before the
	// stop as far as the hosted ranks know; Had is at least their
	// largest. Exact after a graceful Close (with or without a step
	// open) and, for the layers a step marker covers, after a crash
	// (the marker's lengths, plus the interrupted step's token where a
	// sealed page shows it: RolledBack); a layer no marker covers gets
	// the stores' per-layer length record (pagestore's
	// RecoveredSeq.HadLens), exact; where that record is missing or
	// damaged (a directory written before it, a flipped byte), the
	// longest layer's length (exact when the layers were even).
	// HadLens[l] - Lens[l] is the tokens the layer lost, RolledBack[l]
	// of them never acknowledged.
	//
	// HadExact: per layer whether HadLens[l] is exact (else an upper
	// bound): a hosted rank that knows its length exactly (rankHad)
	// reaches it, so the others' upper bounds do not exceed it. Not
	// exact: a crash, a layer no step marker covers and no per-layer
	// length record gives, whose length the record's longest layer
	// gives and its persisted pages do not; a coordinator adds the
	// other workers'.
	//
	// LostTokens() = Had - max(Lens) are the tokens to re-append from
	// position max(Lens); 0 after a graceful Close.
	decode.Recovered
}

// DamagedSeq is a sequence that could not be recovered.
type DamagedSeq struct {
	Key, Seq uint64
	// Grid is the grid that created it (RecoveredSeq.Grid; "" when its
	// table entry was unreadable).
	Grid string
	Err  error
}

// openTable opens (or creates) the sequence table of l's data directory
// and checks its format.
func (l *Local) openTable(ranks []Rank) error {
	c := l.cfg
	dir := c.DataDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("worker: open data dir: %w", l.ioError("create data directory", dir, err))
	}
	path := filepath.Join(dir, tableName)
	db, err := metastore.OpenBolt(path, metastore.Options{Timeout: tableTimeout})
	if errors.Is(err, metastore.ErrInUse) {
		return fmt.Errorf("worker: data dir %s: %s is locked by another worker, in this process or another: %w", dir, path, pagestore.ErrInUse)
	}
	if errors.Is(err, metastore.ErrCorrupt) {
		return fmt.Errorf("worker: data dir %s: %w: %w", dir, tier.ErrCorrupt, err)
	}
	if err != nil {
		return fmt.Errorf("worker: open data dir: %w", l.ioError("open sequence table", path, err))
	}
	f := metastore.Format{Layers: c.Layers, Geometry: c.Geometry, CP: c.CP, TP: c.TP}
	for _, r := range ranks {
		f.Ranks = append(f.Ranks, metastore.Rank(r))
	}
	err = db.Init(context.Background(), f)
	if err != nil {
		db.Close()
		var fe *metastore.FormatError
		if errors.As(err, &fe) {
			return fmt.Errorf("worker: data dir %s: %w: %w: the directory holds the ranks of another grid or geometry (%s; this worker: %s)",
				dir, pagestore.ErrInvalidConfig, pagestore.ErrOtherFormat, fe.Have, fe.Want)
		}
		if errors.Is(err, metastore.ErrCorrupt) {
			// Damage the open's check let through, met by its write.
			return fmt.Errorf("worker: data dir %s: %w: %w", dir, tier.ErrCorrupt, err)
		}
		return fmt.Errorf("worker: open data dir: %w", l.ioError("commit sequence table", path, err))
	}
	l.db = db
	return nil
}

// tablePath is the file of the sequence table.
func (l *Local) tablePath() string { return filepath.Join(l.cfg.DataDir, tableName) }

// ioError is err of op on the file path of the data directory as a
// *pagestore.IOError (its message names no path), reported to
// Config.OnPersistError.
func (l *Local) ioError(op, path string, err error) error {
	e := &pagestore.IOError{Op: op, Path: path, Err: err, Closing: l.closed}
	if l.cfg.OnPersistError != nil {
		l.cfg.OnPersistError(e)
	}
	return e
}

// putEntry commits sq's table entry, giving it a key when it has none.
func (l *Local) putEntry(seq uint64, sq *seqState) error {
	if l.db == nil {
		return nil
	}
	grid := sq.grid
	if grid == "" {
		grid = l.cfg.GridID
	}
	nodes := sq.nodes
	if len(nodes) == 0 {
		nodes = l.cfg.Placement
	}
	e := metastore.Entry{Seq: seq, Grid: grid, Nodes: nodes, Placement: sq.layout.Placement, BlockPages: sq.layout.BlockPages}
	for i, rk := range l.ranks {
		e.Ranks = append(e.Ranks, metastore.EntryRank{TP: rk.id.TP, CP: rk.id.CP, Store: uint64(sq.local[i])})
	}
	key, err := sq.key, error(nil)
	if key == 0 {
		key, err = l.db.Add(context.Background(), e)
	} else {
		err = l.db.Put(context.Background(), key, e)
	}
	if err != nil {
		return l.ioError("commit sequence table", l.tablePath(), err)
	}
	sq.key = key
	sq.grid, sq.nodes = grid, nodes
	return nil
}

// deleteEntry removes sq's table entry.
func (l *Local) deleteEntry(sq *seqState) error {
	if l.db == nil || sq.key == 0 {
		return nil
	}
	if err := l.db.Delete(context.Background(), sq.key); err != nil {
		return l.ioError("commit sequence table", l.tablePath(), err)
	}
	return nil
}

// recoverTable parks the sequences of the table whose store sequences
// came back on every hosted rank, rolls each back to the longest length
// its hosted ranks agree on, deletes the entries of the others and
// releases the store sequences nobody names.
func (l *Local) recoverTable() error {
	c := l.cfg
	rep := RecoveryReport{Dir: c.DataDir}
	type found struct {
		rec     pagestore.RecoveredSeq
		used    bool // named by an entry
		damaged bool // named by a damaged entry: released, not an orphan
	}
	stores := make([]map[pagestore.SeqID]*found, len(l.ranks))
	damagedStore := make([]map[pagestore.SeqID]error, len(l.ranks))
	for i, rk := range l.ranks {
		rr := rk.sh.Store().Recovery()
		rep.Ranks = append(rep.Ranks, rr)
		stores[i] = map[pagestore.SeqID]*found{}
		damagedStore[i] = map[pagestore.SeqID]error{}
		for _, s := range rr.Sequences {
			stores[i][s.ID] = &found{rec: s}
		}
		for _, d := range rr.Damaged {
			damagedStore[i][d.ID] = d.Err
		}
	}
	ctx := context.Background()
	entries, err := l.db.Entries(ctx)
	if err != nil {
		return fmt.Errorf("worker: open data dir: %w", l.ioError("read sequence table", l.tablePath(), err))
	}
	marks, err := l.db.Marks(ctx)
	if err != nil {
		return fmt.Errorf("worker: open data dir: %w", l.ioError("read step markers", l.tablePath(), err))
	}
	var dead []uint64
	for _, it := range entries {
		e := it.Entry
		lay := plan.Layout{CP: c.CP, TP: c.TP, Placement: e.Placement, BlockPages: e.BlockPages}
		sq := &seqState{layout: lay, key: it.Key, grid: e.Grid, nodes: e.Nodes, local: make([]pagestore.SeqID, len(l.ranks)),
			recovered: &recoveredAs{seq: e.Seq, grid: e.Grid}}
		err := it.Err
		if err == nil && e.Damaged != "" {
			// A tombstone (damage.go): dropped after an open, its
			// store sequences released then.
			err = fmt.Errorf("%w: found after an earlier open: %s", pagestore.ErrDamaged, e.Damaged)
		}
		if err == nil {
			err = lay.Validate(c.KVHeads)
		}
		if err == nil && len(e.Ranks) != len(l.ranks) {
			err = fmt.Errorf("table entry names %d ranks, the worker hosts %d", len(e.Ranks), len(l.ranks))
		}
		var marked []*found // the store sequences this entry took
		for i := 0; err == nil && i < len(l.ranks); i++ {
			er, rk := e.Ranks[i], l.ranks[i]
			if er.TP != rk.id.TP || er.CP != rk.id.CP {
				err = fmt.Errorf("table entry rank %d is (tp %d, cp %d), the worker hosts %v there", i, er.TP, er.CP, rk.id)
				break
			}
			sq.local[i] = pagestore.SeqID(er.Store)
			f := stores[i][sq.local[i]]
			switch {
			case f != nil && f.used:
				err = fmt.Errorf("rank %v: store sequence %d named twice", rk.id, er.Store)
			case f != nil:
				f.used = true
				marked = append(marked, f)
			case damagedStore[i][sq.local[i]] != nil:
				err = fmt.Errorf("rank %v: %w", rk.id, damagedStore[i][sq.local[i]])
			default:
				err = fmt.Errorf("rank %v: store sequence %d was not persisted", rk.id, er.Store)
			}
		}
		var had []int         // per hosted rank: its store length before the stop
		var hadLens [][]int   // per hosted rank and layer: the same
		var hadExact [][]bool // per hosted rank and layer: hadLens exact
		m, hasMark := marks[it.Key]
		for i := 0; err == nil && i < len(l.ranks); i++ {
			var mark []int
			if hasMark && len(m.Lens) == len(l.ranks) {
				mark = m.Lens[i]
			}
			var n int
			var per []int
			var exact []bool
			n, per, exact, err = l.rankHad(i, sq, stores[i][sq.local[i]].rec, mark)
			had, hadLens, hadExact = append(had, n), append(hadLens, per), append(hadExact, exact)
		}
		var cut []int
		if hasMark && err == nil {
			var done bool
			if done, err = l.stepDone(sq, m); err == nil && !done {
				cut, err = l.undoStep(sq, m)
			}
		}
		if err == nil {
			var r RecoveredSeq
			r, err = l.reconcile(sq, e.Seq, had, hadLens, hadExact)
			r.Grid, r.Placement = e.Grid, slices.Clone(e.Nodes)
			if cut != nil && slices.Max(cut) > 0 {
				r.RolledBack = cut
			}
			if err == nil {
				l.parked[it.Key] = sq
				rep.Sequences = append(rep.Sequences, r)
				continue
			}
		}
		// Damaged: what its ranks recovered is given back below.
		for _, f := range marked {
			f.used, f.damaged = false, true
		}
		rep.Damaged = append(rep.Damaged, DamagedSeq{Key: it.Key, Seq: e.Seq, Grid: e.Grid, Err: err})
		dead = append(dead, it.Key)
	}
	for i, rk := range l.ranks {
		for id, f := range stores[i] {
			if !f.used {
				if err := rk.sh.Release(id); err == nil && !f.damaged {
					rep.OrphanSeqs++
				}
			}
		}
	}
	if len(marks) > 0 {
		if err := l.db.ClearMarks(ctx); err != nil {
			return fmt.Errorf("worker: open data dir: %w", l.ioError("delete step markers", l.tablePath(), err))
		}
	}
	if len(dead) > 0 {
		err := l.db.Delete(ctx, dead...)
		if errors.Is(err, metastore.ErrCorrupt) {
			return fmt.Errorf("worker: data dir %s: %w: %w", l.cfg.DataDir, tier.ErrCorrupt, err)
		}
		if err != nil {
			return fmt.Errorf("worker: open data dir: %w", l.ioError("commit sequence table", l.tablePath(), err))
		}
	}
	slices.SortFunc(rep.Sequences, func(a, b RecoveredSeq) int { return compareU64(a.Key, b.Key) })
	l.report = rep
	l.nparked.Store(int64(len(l.parked)))
	return nil
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// rankHad returns hosted rank i's store length of sq before the stop
// (before recovery cuts anything): its longest layer plus the tokens its
// store lost (rec, its report), the same per layer, and per layer
// whether that length is exact (else an upper bound). mark is the
// rank's step marker lengths (nil for none): a layer it covers held its
// persisted length or the marker's, whichever is longer (the step
// appends one token, on disk only where it sealed a page: an
// interrupted step's token that reached no disk is not counted, never
// acknowledged), exact. The others: after a graceful Close (the tail
// persisted) their persisted length, exact; after a crash the layer's
// entry of the store's per-layer length record, exact; where it has
// none (a format-1 directory, a damaged record) the record's longest
// layer: exact where it equals the layer's persisted length (the layer
// held at least that), an upper bound otherwise (a layer an
// interrupted step did not reach held one token less).
func (l *Local) rankHad(i int, sq *seqState, rec pagestore.RecoveredSeq, mark []int) (int, []int, []bool, error) {
	rk := l.ranks[i]
	lost := rec.LostTokens
	lens := make([]int, l.cfg.Layers)
	exact := make([]bool, l.cfg.Layers)
	hi := 0
	for layer := range l.cfg.Layers {
		n, err := rk.sh.Store().LayerLen(sq.local[i], layer)
		if err != nil {
			return 0, nil, nil, fmt.Errorf("rank %v: %w", rk.id, err)
		}
		lens[layer] = n
		hi = max(hi, n)
	}
	for layer, n := range lens {
		switch {
		case len(mark) == len(lens) && mark[layer] >= 0:
			lens[layer], exact[layer] = max(n, mark[layer]), true
		case rec.TailPersisted && lost == 0:
			exact[layer] = true
		case rec.HadLens != nil && rec.HadLens[layer] >= 0:
			lens[layer], exact[layer] = max(n, rec.HadLens[layer]), true
		default:
			lens[layer], exact[layer] = hi+lost, n == hi+lost
		}
	}
	return max(hi+lost, slices.Max(lens)), lens, exact, nil
}

// reconcile computes the global lengths sq's hosted ranks agree on, per
// layer, and cuts back the ranks that hold more; rankHad are the ranks'
// store lengths before the stop, rankLens the same per layer and
// rankExact which of those are exact (rankHad). It returns the
// recovered sequence.
func (l *Local) reconcile(sq *seqState, seq uint64, rankHad []int, rankLens [][]int, rankExact [][]bool) (RecoveredSeq, error) {
	c := l.cfg
	S := c.PageSize
	r := RecoveredSeq{Key: sq.key, Seq: seq, Layout: sq.layout, Recovered: decode.Recovered{Lens: make([]int, c.Layers), HadLens: make([]int, c.Layers)}}
	had := 0 // the global length before the stop: the furthest token a rank held
	for i, rk := range l.ranks {
		p := sq.layout.Place(rk.id.CP)
		had = max(had, globalEnd(p, S, rankHad[i]))
		for layer, n := range rankLens[i] {
			r.HadLens[layer] = max(r.HadLens[layer], globalEnd(p, S, n))
		}
	}
	r.HadExact = make([]bool, c.Layers)
	for i, rk := range l.ranks {
		p := sq.layout.Place(rk.id.CP)
		for layer, n := range rankLens[i] {
			if rankExact[i][layer] && globalEnd(p, S, n) == r.HadLens[layer] {
				r.HadExact[layer] = true
			}
		}
	}
	for layer := range c.Layers {
		n := -1
		for i, rk := range l.ranks {
			k, _ := rk.sh.Store().LayerLen(sq.local[i], layer)
			m := globalMax(sq.layout.Place(rk.id.CP), S, k)
			if n < 0 || m < n {
				n = m
			}
		}
		r.Lens[layer] = n
	}
	// Cut the ranks that hold more than their share, each layer to its
	// own length (layers may hold different surpluses: a crash keeps
	// each layer's sealed pages).
	for i, rk := range l.ranks {
		p := sq.layout.Place(rk.id.CP)
		st := rk.sh.Store()
		to := make([]int, c.Layers)
		cut := false
		for layer := range c.Layers {
			k, _ := st.LayerLen(sq.local[i], layer)
			to[layer] = min(k, owned(p, S, r.Lens[layer]))
			cut = cut || to[layer] < k
		}
		if cut {
			if err := rk.sh.Truncate(sq.local[i], to); err != nil {
				return r, fmt.Errorf("rank %v: cut to the hosted ranks' common lengths %v: %w", rk.id, r.Lens, err)
			}
		}
	}
	// Report what the ranks hold, not the longest length it fits: a
	// rank of several whose next page is another's would otherwise
	// count that page as held (336 reported for 321 appended).
	for layer, n := range r.Lens {
		end := 0
		for _, rk := range l.ranks {
			p := sq.layout.Place(rk.id.CP)
			end = max(end, globalEnd(p, S, owned(p, S, n)))
		}
		r.Lens[layer] = end
	}
	r.Had = had
	return r, nil
}

// MaxLens returns, per layer, the longest global length of which the
// ranks hosts of a sequence laid out by lay, holding exactly their
// share of lens (RecoveredSeq.Lens), hold every token they own: the
// bound a coordinator takes the smallest of over its workers. Where
// hosts are every rank of the layout, it is lens.
func MaxLens(lay plan.Layout, pageSize int, hosts []Rank, lens []int) []int {
	out := make([]int, len(lens))
	for layer, n := range lens {
		m := -1
		for _, rk := range hosts {
			p := lay.Place(rk.CP)
			if g := globalMax(p, pageSize, owned(p, pageSize, n)); m < 0 || g < m {
				m = g
			}
		}
		out[layer] = max(m, n)
	}
	return out
}

// globalEnd returns the global length that ends with the k-th token rank
// place owns (0 for k = 0).
func globalEnd(p plan.Place, S, k int) int {
	if k <= 0 {
		return 0
	}
	lp := (k - 1) / S
	return p.Global(lp)*S + (k-1)%S + 1
}

// globalMax returns the longest global length of which rank place owns
// at most k tokens: the position of its (k+1)-th token.
func globalMax(p plan.Place, S, k int) int {
	return p.Global(k/S)*S + k%S
}

// Recovery returns what NewLocal recovered from Config.DataDir (a zero
// report without one). Sequences lists the recovered sequences at
// NewLocal, claimed ones included.
func (l *Local) Recovery() RecoveryReport {
	l.lock()
	defer l.unlock()
	return l.report
}

// Parked returns the keys of the recovered sequences not claimed or
// dropped yet, in increasing order.
func (l *Local) Parked() []uint64 {
	l.lock()
	defer l.unlock()
	keys := make([]uint64, 0, len(l.parked))
	for k := range l.parked {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ParkedCount is len(Parked()), without waiting for a call in progress.
func (l *Local) ParkedCount() int { return int(l.nparked.Load()) }

// Claim makes the recovered sequence key (see [RecoveryReport]) live
// again as sequence seq (its old id or another one new to the worker):
// later messages reach it as any sequence with its recovered lengths.
// The table records the new id at once. Under its old id the entry
// keeps its grid ([RecoveredSeq.Grid]), so that a coordinator that
// claims it so finds it under the same (Grid, Seq) after the next
// restart; under a new id the entry records this worker's grid
// (Config.GridID), whose workers claimed it under that id. [Local.Park]
// undoes a claim.
func (l *Local) Claim(ctx context.Context, key, seq uint64) error {
	l.lock()
	defer l.unlock()
	if l.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sq, ok := l.parked[key]
	if !ok {
		if ls, lost := l.lostKeys[key]; lost {
			return fmt.Errorf("claim recovered %d: %w", key, ls.err)
		}
		return fmt.Errorf("claim: %w: no recovered sequence %d", ErrUnknownSequence, key)
	}
	if _, ok := l.seqs[seq]; ok {
		return fmt.Errorf("claim recovered %d: %w: sequence %d exists", key, ErrBadMessage, seq)
	}
	grid := sq.grid
	if sq.recovered != nil && seq != sq.recovered.seq {
		sq.grid = l.cfg.GridID
	}
	if err := l.putEntry(seq, sq); err != nil {
		sq.grid = grid
		return fmt.Errorf("claim recovered %d as sequence %d: %w", key, seq, err)
	}
	delete(l.parked, key)
	l.nparked.Store(int64(len(l.parked)))
	l.seqs[seq] = sq
	_, _ = l.forgetLost(l.lost, seq)
	return nil
}

// DropRecovered frees the recovered sequence key that nobody will claim:
// its table entry and its pages on every hosted rank.
func (l *Local) DropRecovered(ctx context.Context, key uint64) error {
	l.lock()
	defer l.unlock()
	if l.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sq, ok := l.parked[key]
	if !ok {
		if ok, err := l.forgetLost(l.lostKeys, key); ok {
			// Dropped as damaged (damage.go): its tombstone goes.
			if err != nil {
				return fmt.Errorf("drop recovered %d: %w", key, err)
			}
			return nil
		}
		return fmt.Errorf("drop recovered: %w: no recovered sequence %d", ErrUnknownSequence, key)
	}
	if err := l.deleteEntry(sq); err != nil {
		return fmt.Errorf("drop recovered %d: %w", key, err)
	}
	delete(l.parked, key)
	l.nparked.Store(int64(len(l.parked)))
	var errs []error
	for i, rk := range l.ranks {
		if err := rk.sh.Release(sq.local[i]); err != nil {
			errs = append(errs, fmt.Errorf("rank %v: %w", rk.id, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("drop recovered %d: %w", key, err)
	}
	return nil
}

// Park undoes the [Local.Claim] that made sequence seq live: the
// sequence is parked again under its key, its table entry names the id
// and grid it had at recovery, and only Claim or DropRecovered reach it
// (a coordinator whose adoption failed part-way gives it back, for a
// later adoption or the next restart). Lengths a rollback since the
// claim dropped stay dropped. It fails with ErrUnknownSequence when seq
// is not live, ErrBadMessage when it was not claimed (created or forked
// since the worker started) and ErrStepOpen when an open step holds it.
func (l *Local) Park(ctx context.Context, seq uint64) error {
	l.lock()
	defer l.unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	sq, err := l.mutable(seq)
	if err != nil {
		return fmt.Errorf("park: %w", err)
	}
	if sq.recovered == nil || sq.key == 0 {
		return fmt.Errorf("park sequence %d: %w: not a claimed recovered sequence", seq, ErrBadMessage)
	}
	if _, ok := l.parked[sq.key]; ok { // not reached: a parked key is not live
		return fmt.Errorf("park sequence %d: %w: key %d is parked", seq, ErrBadMessage, sq.key)
	}
	grid := sq.grid
	sq.grid = sq.recovered.grid
	if err := l.putEntry(sq.recovered.seq, sq); err != nil {
		sq.grid = grid
		return fmt.Errorf("park sequence %d: %w", seq, err)
	}
	delete(l.seqs, seq)
	l.parked[sq.key] = sq
	l.nparked.Store(int64(len(l.parked)))
	return nil
}

// DataDirFormat is what a worker data directory was made for: the
// format record of its sequence table (ReadDataDirFormat). A worker on
// the directory must have this Layers, Geometry, CP and TP and host
// these Ranks, or NewLocal refuses it (pagestore.ErrOtherFormat).
type DataDirFormat struct {
	Layers int
	plan.Geometry
	CP, TP int
	Ranks  []Rank
}

// ReadDataDirFormat reads the format record of the worker data
// directory dir read-only, recovering and changing nothing: bbolt's
// shared lock is taken for the read, waiting at most timeout for a
// worker that holds the file (then the error wraps pagestore.ErrInUse).
// A damaged sequence table, or a format record that does not decode,
// is an error wrapping tier.ErrCorrupt (what NewLocal would refuse);
// ok is false, with no error, for a table without a format record
// (created, never committed: NewLocal writes one).
func ReadDataDirFormat(dir string, timeout time.Duration) (f DataDirFormat, ok bool, err error) {
	path := filepath.Join(dir, tableName)
	db, err := metastore.OpenBolt(path, metastore.Options{ReadOnly: true, Timeout: timeout})
	switch {
	case errors.Is(err, metastore.ErrInUse):
		return f, false, fmt.Errorf("worker: %s is locked by a running worker: %w", path, pagestore.ErrInUse)
	case errors.Is(err, metastore.ErrCorrupt):
		return f, false, fmt.Errorf("worker: %w: %w", tier.ErrCorrupt, err)
	case err != nil:
		return f, false, fmt.Errorf("worker: open %s: %w", path, err)
	}
	defer db.Close()
	tf, ok, err := db.Format(context.Background())
	if err != nil {
		return f, false, fmt.Errorf("worker: read %s: %w: %w", path, tier.ErrCorrupt, err)
	}
	if !ok {
		return f, false, nil
	}
	f = DataDirFormat{Layers: tf.Layers, Geometry: tf.Geometry, CP: tf.CP, TP: tf.TP}
	for _, r := range tf.Ranks {
		f.Ranks = append(f.Ranks, Rank(r))
	}
	return f, true, nil
}

// TableSeq names one sequence of a data directory's sequence table.
type TableSeq struct {
	// Key is the entry's key; Seq and Grid name the sequence as
	// RecoveredSeq's do (Grid "" when the entry is unreadable).
	Key, Seq uint64
	Grid     string
}

// TableSeqs lists, by increasing key, the sequences that the sequence
// table of data directory dir names, opening it read-only and checked
// (internal/metastore): what a worker that could not open dir held (a
// directory moved aside as damaged), for its owner to report. It fails
// when the table is missing, damaged or locked.
func TableSeqs(dir string) ([]TableSeq, error) {
	path := filepath.Join(dir, tableName)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("worker: sequence table: %w", err)
	}
	db, err := metastore.OpenBolt(path, metastore.Options{ReadOnly: true, Timeout: tableTimeout})
	if err != nil {
		return nil, fmt.Errorf("worker: sequence table: %w", err)
	}
	defer db.Close()
	recs, err := db.Entries(context.Background())
	if err != nil {
		return nil, fmt.Errorf("worker: sequence table: %w", err)
	}
	var out []TableSeq
	for _, r := range recs {
		s := TableSeq{Key: r.Key}
		if r.Err == nil {
			s.Seq, s.Grid = r.Entry.Seq, r.Entry.Grid
		}
		out = append(out, s)
	}
	return out, nil
}
