package coord

import (
	"context"
	"errors"
	"fmt"
	"github.com/questrt/questrt/pagestore"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/worker/remote"
)

// Adoption of recovered sequences. A node restarted on its data
// directory (questd --data-dir) recovers each grid's sequences when the
// grid connects again (the same coordinator name and grid shape) and
// parks them; the grid's ConnectGrid replies list them
// (remote.Client.Recovered). gridFor then adopts, on the new grid's
// engine (engine.Adopt), every sequence that all the grid's nodes
// recovered: the smallest length over them, the nodes that hold more
// rolled back, the sequence claimed on every node under its old engine
// id. Its name is the one it had: "node/<instance>.<n>" with the
// instance of the coordinator process that created it (the workers'
// tables keep its grid id, hence that instance, through every claim
// under that id) and n its engine id, which is its number (Create and
// Fork give engine ids equal to the numbers). Numbers of new sequences
// come after every adopted one.
//
// A sequence is adopted only on the placement it was written on (the
// node of every rank, worker.RecoveredSeq.Placement; sequences persisted
// without one are adopted on any): on another placement (a node of its
// grid late after a full restart) it stays parked, and a later grid
// with its placement adopts it (after the nodes' next restart, when the
// node that parked it keeps that grid's directory). A sequence that a
// node of its own placement answered without is freed on the others and
// listed as damaged; one whose adoption failed otherwise (a timeout, a
// node unavailable) stays parked and is listed as damaged with Parked
// set. A sequence its client released while its grid was lost
// (Release) is dropped on the nodes that still held it.

// RecoveredSeq is a sequence adopted after a restart.
type RecoveredSeq struct {
	// ID is its id: the one it had before the restart, or a new one when
	// that was taken or not this coordinator's (RenamedFrom is the old
	// one then, or "<grid>#<engine id>" for another coordinator's).
	ID, RenamedFrom string
	// Recovered are its lengths when adopted (engine.Adopted): Lens
	// per layer, Had its length at the stop, LostTokens() the tokens to
	// append again from max(Lens), Lost() those per layer and
	// LostExact() which of those are exact, RolledBack those of them an
	// interrupted decode step had appended, never acknowledged.
	decode.Recovered
	// Nodes host its ranks, by rank tp*CP+cp.
	Nodes []string
}

// DamagedSeq is a recovered sequence that was not adopted: its pages
// were freed (a node of its grid answered without it, or its nodes
// disagree on it), or, with Parked, it stays parked on its nodes (the
// adoption failed for another reason: a timeout, a node unavailable),
// persisted again when its grid closes and recovered at the nodes' next
// restart.
type DamagedSeq struct {
	// ID is the id it had ("" when its grid was not this coordinator's:
	// Grid and Seq then name it).
	ID     string
	Grid   string
	Seq    uint64
	Err    error
	Parked bool
	// Reason, when not empty, is what the nodes of its grid reported of
	// it ("node <name>: ..."; Err includes it): why a node did not
	// recover it (its pages failed their checks there, or the grid's
	// data directory there was damaged and moved aside).
	Reason string
}

// Recovery is what a coordinator adopted since it started.
type Recovery struct {
	// Sequences are the adopted sequences not released yet, by id.
	Sequences []RecoveredSeq
	// Damaged are the sequences found and not adopted.
	Damaged []DamagedSeq
}

// Recovery returns what the coordinator adopted so far, opening no grid.
func (c *Coordinator) Recovery() Recovery {
	c.mu.Lock()
	defer c.mu.Unlock()
	var r Recovery
	for _, s := range c.adopted {
		s.Lens, s.Nodes = slices.Clone(s.Lens), slices.Clone(s.Nodes)
		r.Sequences = append(r.Sequences, s)
	}
	slices.SortFunc(r.Sequences, func(a, b RecoveredSeq) int { return strings.Compare(a.ID, b.ID) })
	r.Damaged = slices.Clone(c.damaged)
	return r
}

// damage moves s, when it is an adopted sequence, from the adopted to
// the damaged ones (Recovery) when err says a node found it damaged at
// its first use (pagestore.ErrDamaged, DATA_LOSS: --recovery-verify
// on-read, a persisted page that failed its check after the nodes'
// open): it stays known, its calls failing so, until released. It
// returns err.
func (c *Coordinator) damage(s *seq, err error) error {
	if err == nil || !errors.Is(err, pagestore.ErrDamaged) {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.adopted[s.name]
	if !ok {
		return err
	}
	delete(c.adopted, s.name)
	c.damaged = append(c.damaged, DamagedSeq{ID: s.name, Grid: s.g.ref.Grid, Seq: uint64(s.id), Err: err,
		Reason: fmt.Sprintf("found damaged at its first use since its adoption: %v", err)})
	c.log.Warn("adopted sequence damaged", "grid", s.g.ref.Grid, "id", s.name, "nodes", r.Nodes, "err", err)
	return err
}

// damageOne is damage for the rows of a failed step on one grid: a
// grid's part of one row only names the sequence that failed (with
// several, each is found at its next call of its own).
func (c *Coordinator) damageOne(g *grid, ids []engine.SeqID, err error) {
	if len(ids) != 1 || !errors.Is(err, pagestore.ErrDamaged) {
		return
	}
	c.mu.Lock()
	var s *seq
	for _, q := range c.seqs {
		if q.g == g && q.id == ids[0] {
			s = q
			break
		}
	}
	c.mu.Unlock()
	if s != nil {
		c.damage(s, err)
	}
}

// DefaultRecoverWait is Config.RecoverWait's default.
const DefaultRecoverWait = 30 * time.Second

// ErrRecovering: Recover's wait ended (Config.RecoverWait or the
// caller's deadline) before the recovery it reports was done; the
// recovery goes on, and a later Recover answers once it is. The Decode
// API answers UNAVAILABLE: retry.
var ErrRecovering = errors.New("recovery not finished")

// Pauses between the attempts of Recover at a recovery that failed on
// an unavailable node: from recoverBackoff, doubling up to
// recoverMaxBackoff.
const (
	recoverBackoff    = 50 * time.Millisecond
	recoverMaxBackoff = time.Second
)

// recoverMargin is the most of the caller's deadline that Recover keeps
// for its answer (a tenth of what is left, at most this): a caller with
// a deadline hears ErrRecovering, not its own deadline.
const recoverMargin = 200 * time.Millisecond

// recoverRun is one run of the recovery Recover waits for; concurrent
// and retried Recover calls wait for the same run.
type recoverRun struct {
	done   chan struct{}      // closed when the run ends
	err    error              // its outcome, set before done closes
	cancel context.CancelFunc // ends it early (Close)
}

// Recover opens the grid of the node's config (Config.Engine) on the
// current view, which makes its nodes recover and this coordinator
// adopt the sequences they persisted, and returns Recovery once that
// grid's adoption is done (an adoption another call started included).
// It waits for that at most Config.RecoverWait and not past ctx's
// deadline (less a margin for the answer), retrying with backoff an
// opening that failed on an unavailable node (a peer restarting, a
// grid lost meanwhile); when the recovery is still not done then, it
// fails with ErrRecovering (and the last failure) while the recovery
// goes on, owned by the coordinator: the next Recover waits for the
// same run. Grids of other configs recover when a Create with their
// config opens them.
func (c *Coordinator) Recover(ctx context.Context) (Recovery, error) {
	wait := c.cfg.RecoverWait
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		wait = min(wait, left-min(left/10, recoverMargin))
	}
	bound := time.NewTimer(max(wait, 0))
	defer bound.Stop()
	notDone := func(last error) error {
		if last == nil {
			return fmt.Errorf("recover: %w after %v: the grid is still opening and adopting; retry", ErrRecovering, wait)
		}
		return fmt.Errorf("recover: %w after %v (last attempt: %v); retry", ErrRecovering, wait, last)
	}
	backoff := recoverBackoff
	var last error
	for {
		run, err := c.startRecover(ctx)
		if err != nil {
			return Recovery{}, fmt.Errorf("recover: %w", err)
		}
		select {
		case <-run.done:
		case <-ctx.Done():
			return Recovery{}, fmt.Errorf("recover: %w", context.Cause(ctx))
		case <-bound.C:
			select {
			case <-run.done: // done as the bound passed: answer it
			default:
				return Recovery{}, notDone(last)
			}
		}
		if run.err == nil {
			return c.Recovery(), nil
		}
		if !retryRecover(run.err) {
			return Recovery{}, fmt.Errorf("recover: %w", run.err)
		}
		last = run.err
		pause := time.NewTimer(backoff)
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return Recovery{}, fmt.Errorf("recover: %w", context.Cause(ctx))
		case <-bound.C:
			pause.Stop()
			return Recovery{}, notDone(last)
		}
		backoff = min(2*backoff, recoverMaxBackoff)
	}
}

// retryRecover reports whether a failed recovery may succeed when tried
// again: a node unreachable or not holding the grid, a grid lost while
// it opened, an opening past OpenTimeout.
func retryRecover(err error) bool {
	return !errors.Is(err, ErrClosed) && (errors.Is(err, ErrGridLost) || errors.Is(err, remote.ErrUnavailable) ||
		errors.Is(err, remote.ErrUnknownGrid) || errors.Is(err, remote.ErrWrongView) ||
		errors.Is(err, collective.ErrPeerClosed) || errors.Is(err, collective.ErrAborted) ||
		errors.Is(err, context.DeadlineExceeded))
}

// startRecover returns the recovery run in progress, or starts one: a
// goroutine owned by the coordinator (Close ends it and waits for it;
// each opening and adoption in it is bounded by OpenTimeout) that opens
// the grid of the node's config apart from ctx's cancellation and waits
// for its adoption.
func (c *Coordinator) startRecover(ctx context.Context) (*recoverRun, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if r := c.recovering; r != nil {
		return r, nil
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &recoverRun{done: make(chan struct{}), cancel: cancel}
	c.recovering = r
	c.wg.Go(func() {
		defer cancel()
		err := c.recoverGrid(bg)
		c.mu.Lock()
		r.err = err
		c.recovering = nil
		c.mu.Unlock()
		close(r.done)
	})
	return r, nil
}

// recoverGrid opens (or finds) the grid of the node's config and waits
// until the opening that made it has adopted what its nodes recovered.
func (c *Coordinator) recoverGrid(ctx context.Context) error {
	g, err := c.gridFor(ctx, c.cfg.Engine)
	if err != nil {
		return err
	}
	c.mu.Lock()
	g.pending-- // gridFor counted a Create; none comes
	c.idleLocked(g)
	c.mu.Unlock()
	select {
	case <-g.adopted: // closed when its opening ends, bounded by OpenTimeout per adoption
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the adoption of grid %s: %w", g.ref.Grid, context.Cause(ctx))
	}
}

// number reserves the next sequence number.
func (c *Coordinator) number() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	n := c.next
	c.next++
	return n, nil
}

// adoption is one recovered sequence of a grid, matched over its nodes.
type adoption struct {
	rec  engine.Recovered
	name string // its id here
	old  string // the id it had ("" when its grid is not this coordinator's)
	grid string // the grid that created it (worker.RecoveredSeq.Grid)
	seq  uint64 // its old engine id
	// placement is the nodes per rank it was written on (the first a
	// node recorded; nil for none).
	placement []string
	// released: its client released it while its grid was lost; it is
	// dropped, not adopted.
	released bool
	// why is what the nodes missing it reported ("node <name>: ...";
	// engine.RecoveredPart.Why), "" when they said nothing.
	why string
}

// matchRecoveredLocked matches the sequences the nodes of g recovered
// (by grid and id), names them and reserves their numbers (c.mu held).
func (c *Coordinator) matchRecoveredLocked(g *grid) []adoption {
	type key struct {
		grid string
		seq  uint64
	}
	by := map[key]int{}
	var out []adoption
	for w, cl := range g.clients {
		for _, r := range cl.Recovered() {
			k := key{r.Grid, r.Seq}
			i, ok := by[k]
			if !ok {
				i = len(out)
				by[k] = i
				a := adoption{grid: r.Grid, seq: r.Seq, rec: engine.Recovered{Seq: engine.SeqID(r.Seq), Layout: r.Layout,
					Parts: make([]engine.RecoveredPart, len(g.clients))}}
				for p := range a.rec.Parts {
					a.rec.Parts[p].Missing = true
				}
				out = append(out, a)
			}
			out[i].rec.Parts[w] = engine.RecoveredPart{Key: r.Key, Recovered: r.Recovered}
			if out[i].placement == nil && len(r.Placement) > 0 {
				out[i].placement = slices.Clone(r.Placement)
			}
		}
	}
	// What the nodes could not recover: the reason of each part a node
	// lacks, and the sequences no node recovered (damaged wherever they
	// were found) reported as damaged here.
	whyNot := make([]map[key]string, len(g.clients))
	var lostOnly []key
	lostWhy := map[key][]string{}
	for w, cl := range g.clients {
		nr := cl.NotRecovered()
		if nr.Quarantined != "" {
			c.log.Warn("recovery: a node of the grid found its data directory damaged and moved it aside; its part of the grid's sequences is lost",
				"grid", g.ref.Grid, "node", g.workers[w], "reason", nr.Quarantined, "sequences", len(nr.Damaged))
		}
		whyNot[w] = map[key]string{}
		for _, d := range nr.Damaged {
			k := key{d.Grid, d.Seq}
			why := "node " + g.workers[w] + ": " + d.Reason
			whyNot[w][k] = why
			if _, ok := by[k]; !ok && d.Grid != "" {
				if lostWhy[k] == nil {
					lostOnly = append(lostOnly, k)
				}
				lostWhy[k] = append(lostWhy[k], why)
			}
		}
		for i := range out {
			a := &out[i]
			if !a.rec.Parts[w].Missing {
				continue
			}
			why, ok := whyNot[w][key{a.grid, a.seq}]
			if !ok && nr.Quarantined != "" {
				why = "node " + g.workers[w] + ": " + nr.Quarantined
			}
			if why != "" {
				a.rec.Parts[w].Why = why
				a.why = joinWhy(a.why, why)
			}
		}
	}
	for _, k := range lostOnly {
		id := c.oldName(k.grid, k.seq)
		if id != "" && c.released[id] && c.seqs[id] == nil {
			continue // released while its grid was lost: nothing to report
		}
		why := strings.Join(lostWhy[k], "; ")
		err := fmt.Errorf("%w: no node of grid %s recovered it: %s", engine.ErrIncomplete, g.ref.Grid, why)
		c.damaged = append(c.damaged, DamagedSeq{ID: id, Grid: k.grid, Seq: k.seq, Err: err, Reason: why})
		c.log.Warn("recovered sequence not adopted", "grid", g.ref.Grid, "from_grid", k.grid, "seq", k.seq, "id", id, "reason", why)
	}
	used := map[engine.SeqID]bool{}
	for i := range out {
		a := &out[i]
		a.old = c.oldName(a.grid, a.seq)
		if a.old != "" && c.released[a.old] && c.seqs[a.old] == nil {
			a.released = true
			continue
		}
		a.name = a.old
		if a.name == "" || c.seqs[a.name] != nil || used[a.rec.Seq] {
			// Not a name of this coordinator's, or taken (sequences of an
			// older layout of the tables): a new name and engine id.
			a.name = c.seqName(c.next)
			a.rec.Seq = engine.SeqID(c.next)
		}
		used[a.rec.Seq] = true
		c.next = max(c.next, uint64(a.rec.Seq)+1)
	}
	return out
}

// oldName is the id the sequence seq of grid had here ("" when grid is
// not this coordinator's).
func (c *Coordinator) oldName(grid string, seq uint64) string {
	if name, inst, ok := GridOwner(grid); ok && name == c.cfg.Name && seq > 0 {
		return name + "/" + strconv.FormatUint(inst, 16) + "." + strconv.FormatUint(seq, 10)
	}
	return ""
}

// joinWhy appends reason why to the reasons so far.
func joinWhy(so, why string) string {
	if so == "" {
		return why
	}
	return so + "; " + why
}

// adopt adopts recs on g's engine (each bounded by its own OpenTimeout,
// apart from the caller's context: an adoption cut short leaves the
// sequence parked until the nodes' next restart) and records the
// outcome. Sequences of another placement stay parked; those released
// while their grid was lost are dropped.
func (c *Coordinator) adopt(ctx context.Context, g *grid, recs []adoption) {
	for _, a := range recs {
		if a.released {
			c.dropReleased(ctx, g, a)
			continue
		}
		k := parkedKey{a.grid, a.seq}
		if a.placement != nil && !slices.Equal(a.placement, g.nodes) {
			c.log.Info("recovered sequence left parked: placed on other nodes", "grid", g.ref.Grid, "from_grid", a.grid,
				"seq", a.seq, "id", a.old, "placement", a.placement, "nodes", g.nodes)
			c.mu.Lock()
			if g.parked == nil {
				g.parked = map[parkedKey]bool{}
			}
			g.parked[k] = true
			c.mu.Unlock()
			continue
		}
		if other := c.parkedElsewhere(g, k); other != "" && incomplete(a.rec) {
			// A node of g lacks it because a live grid that shares the
			// node holds it parked in its directory (that grid holds
			// sequences of its own, so gridFor did not close it): left
			// parked, not freed; it is adopted once that grid closes.
			c.log.Warn("recovered sequence left parked: another grid holds it on a node of this one", "grid", g.ref.Grid, "from_grid", a.grid,
				"seq", a.seq, "id", a.old, "held_by", other)
			continue
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.OpenTimeout)
		ad, err := g.eng.Adopt(actx, a.rec)
		cancel()
		if err != nil {
			var ws []string
			for w, n := range g.workers {
				ws = append(ws, fmt.Sprintf("worker %d: %s", w, n))
			}
			err = fmt.Errorf("%w (grid %s; %s)", err, g.ref.Grid, strings.Join(ws, ", "))
		}
		c.mu.Lock()
		if err == nil && c.closed {
			err = ErrClosed
		}
		if err != nil {
			c.damaged = append(c.damaged, DamagedSeq{ID: a.old, Grid: a.grid, Seq: a.seq, Err: err, Parked: !errors.Is(err, engine.ErrIncomplete), Reason: a.why})
			c.mu.Unlock()
			c.check(g, err)
			c.log.Warn("recovered sequence not adopted", "grid", g.ref.Grid, "from_grid", a.grid, "seq", a.seq, "id", a.old, "err", err, "reason", a.why)
			continue
		}
		c.addSeqLocked(a.name, &seq{g: g, id: a.rec.Seq})
		g.seqs++
		from := ""
		if a.old != a.name {
			from = a.old
			if from == "" {
				from = a.grid + "#" + strconv.FormatUint(a.seq, 10)
			}
		}
		r := RecoveredSeq{ID: a.name, RenamedFrom: from, Recovered: ad, Nodes: slices.Clone(g.nodes)}
		c.adopted[a.name] = r
		c.mu.Unlock()
		c.log.Info("recovered sequence adopted", "grid", g.ref.Grid, "seq", a.name, "renamed_from", from,
			"lens", ad.Lens, "had", ad.Had, "lost_tokens", ad.LostTokens(), "lost", ad.Lost(), "lost_exact", ad.LostExact(), "rolled_back", ad.RolledBack)
	}
}

// parkedElsewhere returns the grid other than g, live and sharing a
// node with g, that left recovered sequence k parked, or "".
func (c *Coordinator) parkedElsewhere(g *grid, k parkedKey) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.grids {
		if o != g && o.lost == nil && o.parked[k] && slices.ContainsFunc(o.nodes, func(n string) bool { return slices.Contains(g.nodes, n) }) {
			return o.ref.Grid
		}
	}
	return ""
}

// incomplete reports whether a node of the grid lacks r.
func incomplete(r engine.Recovered) bool {
	return slices.ContainsFunc(r.Parts, func(p engine.RecoveredPart) bool { return p.Missing })
}

// dropReleased frees, on the nodes of g that recovered it, a sequence
// its client released while its grid was lost (best effort: a node
// that fails keeps it parked, on disk again when g closes).
func (c *Coordinator) dropReleased(ctx context.Context, g *grid, a adoption) {
	for w, p := range a.rec.Parts {
		if p.Missing {
			continue
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.OpenTimeout)
		err := g.eng.DropRecovered(dctx, w, p.Key)
		cancel()
		if err != nil {
			c.log.Warn("released sequence not dropped", "grid", g.ref.Grid, "id", a.old, "node", g.workers[w], "err", err)
		}
	}
	c.log.Info("recovered sequence dropped: released while its grid was lost", "grid", g.ref.Grid, "id", a.old)
}

// Park implements engine.Claimer for the grid's remote workers.
func (w peerWorker) Park(ctx context.Context, seq uint64) error {
	c, ok := w.Worker.(engine.Claimer)
	if !ok {
		return fmt.Errorf("node %s: %w", w.node, errNoClaim)
	}
	return c.Park(ctx, seq)
}

// Claim implements engine.Claimer for the grid's remote workers.
func (w peerWorker) Claim(ctx context.Context, key, seq uint64) error {
	c, ok := w.Worker.(engine.Claimer)
	if !ok {
		return fmt.Errorf("node %s: %w", w.node, errNoClaim)
	}
	return c.Claim(ctx, key, seq)
}

// DropRecovered implements engine.Claimer for the grid's remote workers.
func (w peerWorker) DropRecovered(ctx context.Context, key uint64) error {
	c, ok := w.Worker.(engine.Claimer)
	if !ok {
		return fmt.Errorf("node %s: %w", w.node, errNoClaim)
	}
	return c.DropRecovered(ctx, key)
}

var errNoClaim = errors.New("worker cannot claim recovered sequences")

var _ engine.Claimer = (*remote.Client)(nil)
