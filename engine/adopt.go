package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// Claimer is the part of a worker that hands over the sequences it
// recovered from its data directory (worker.Local and
// worker/remote.Client implement it; see worker.RecoveryReport). Its
// methods are safe for concurrent use, as the rest of a worker's.
type Claimer interface {
	// Claim makes recovered sequence key live again as sequence seq.
	Claim(ctx context.Context, key, seq uint64) error
	// DropRecovered frees recovered sequence key.
	DropRecovered(ctx context.Context, key uint64) error
	// Park parks sequence seq, which Claim made live, again as it was
	// before the claim (worker.Local.Park).
	Park(ctx context.Context, seq uint64) error
}

// Recovered is one sequence that the engine's workers recovered after a
// restart, as Adopt takes it: what each worker reported for it
// (worker.RecoveredSeq, matched over the workers by its grid and id).
type Recovered struct {
	// Seq is the id the engine adopts it under: the id it had before the
	// restart (worker.RecoveredSeq.Seq), so that the workers' tables keep
	// naming it the same way.
	Seq SeqID
	// Layout is its layout; its CP x TP must be the engine's.
	Layout plan.Layout
	// Parts has one entry per worker of the engine, in the order of the
	// hosts Open was given (New: one worker per rank, TP-major).
	Parts []RecoveredPart
}

// RecoveredPart is what one worker recovered of a sequence.
type RecoveredPart struct {
	// Missing: the worker did not recover the sequence (its ranks lost
	// it, or it came back damaged). Adopt then frees it on the others.
	Missing bool
	// Key is the worker's handle of it (worker.RecoveredSeq.Key).
	Key uint64
	// Recovered are the worker's lengths (worker.RecoveredSeq's, as
	// it reported them): Lens, the global lengths per layer the
	// worker's ranks hold (the end of their last token; the other
	// workers may hold more); Had, the length before the stop as far as
	// they know; HadLens, when not nil, the same per layer (nil from a
	// worker that does not report them: Had stands for every layer
	// then); RolledBack, when not nil, the tokens per layer the
	// worker's recovery cut as the appends of an interrupted step;
	// HadExact, when not nil, per layer whether HadLens[layer] is exact
	// (nil: every one an upper bound).
	decode.Recovered
	// Why, when Missing, is what the worker reported of the sequence
	// (it found it damaged, or its data directory was quarantined);
	// "" when it reported nothing.
	Why string
}

// Adopted is what Adopt made of a recovered sequence, as
// decode.Recovered describes one:
//   - Lens are its lengths per layer now: the smallest over the workers;
//   - Had is its length before the stop (the largest the workers know);
//     LostTokens() = Had - max(Lens) the tokens of every layer to append
//     again, from position max(Lens), before it decodes as it would have
//     (0 after a graceful stop of every worker);
//   - HadLens, when every worker reported them, are per layer the
//     largest of the workers' RecoveredPart.HadLens, so that Lost() is
//     per layer the tokens that layer lacks of what it held at the stop
//     (those past the length every worker holds are cut from the
//     workers that held more); nil when a worker reported none, Lost()
//     being Had - Lens[layer] then (an upper bound where the layers
//     were uneven at the stop). Lost()[layer] - RolledBack[layer] are
//     the acknowledged tokens to append again to that layer from
//     Lens[layer];
//   - RolledBack, when not nil, are per layer the tokens of an
//     interrupted step (never acknowledged) that the workers' recovery
//     cut, the largest over the workers; counted in Lost() and
//     LostTokens() as well;
//   - HadExact (LostExact()) says per layer whether Lost()[layer] is
//     exact: a worker that knows the layer's length at the stop exactly
//     reports the largest (RecoveredPart.HadExact), so no other
//     worker's upper bound exceeds it. Otherwise Lost()[layer] is an
//     upper bound (a worker killed inside a step estimates from its
//     length record, which holds only the longest layer).
type Adopted = decode.Recovered

// ErrIncomplete: a recovered sequence that not every worker of its grid
// recovered, or that the workers cannot agree on; Adopt freed what the
// others held of it.
var ErrIncomplete = errors.New("engine: recovered sequence incomplete")

// ErrParked: Adopt failed for a reason that is not the sequence's (a
// context that ended, a worker unavailable or failing) and left it
// parked on every worker that answered, for a later adoption (another
// grid's, or after the next restart).
var ErrParked = errors.New("engine: recovered sequence left parked")

// Adopt makes a sequence the workers recovered after a restart one of
// the engine's, under id r.Seq: it takes the smallest length over the
// workers in every layer, claims the sequence on every worker
// (Claimer.Claim) and rolls back (worker.RollbackRequest) the ranks of
// the workers that hold more than that, so that every rank holds its
// share of the same lengths; Step, Decode, Append, Fork, Rollback and
// Release then work on it as on any sequence. A sequence some worker is
// missing (RecoveredPart.Missing, or a Claim answered
// worker.ErrUnknownSequence), or whose workers cannot agree (a layout
// that is not the engine's, lengths out of range), is freed on
// the workers that hold it and Adopt returns an error wrapping
// ErrIncomplete. Workers may hold different surpluses in different
// layers (a crash inside a step keeps the layers the step had reached
// on one node, and less on another): such a worker is cut back per
// layer (worker.RollbackRequest.Lens). Any other failure (ctx ending, a worker unavailable, a
// Claim or roll back failing) frees nothing: the sequence is parked
// again (Claimer.Park) on every worker that claimed it, or may have
// (a Claim that failed may have taken effect), and stays parked on the
// others; the error wraps ErrParked and says what failed. A worker
// whose Park fails keeps it live, unknown to the engine, until its grid
// closes (which persists it). Every worker must implement Claimer.
func (e *Engine) Adopt(ctx context.Context, r Recovered) (Adopted, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return Adopted{}, ErrClosed
	}
	if len(r.Parts) != len(e.workers) {
		return Adopted{}, fmt.Errorf("adopt seq %d: %w: %d parts for %d workers", r.Seq, ErrBadInput, len(r.Parts), len(e.workers))
	}
	claimers := make([]Claimer, len(e.workers))
	for w, wk := range e.workers {
		c, ok := wk.(Claimer)
		if !ok {
			return Adopted{}, fmt.Errorf("adopt seq %d: %w: worker %d (%T) cannot claim recovered sequences", r.Seq, ErrBadInput, w, wk)
		}
		claimers[w] = c
	}
	if err := e.freeID(r.Seq); err != nil {
		// Not the parts' fault: leave them parked for a caller who
		// picks another id.
		return Adopted{}, fmt.Errorf("adopt seq %d: %w", r.Seq, err)
	}
	a, err := e.agree(r)
	if err != nil {
		e.dropParts(r, 0)
		return Adopted{}, fmt.Errorf("adopt seq %d: %w", r.Seq, err)
	}
	for w, c := range claimers {
		err := c.Claim(ctx, r.Parts[w].Key, uint64(r.Seq))
		if err == nil {
			continue
		}
		if errors.Is(err, worker.ErrUnknownSequence) {
			// The worker answered that it holds no such recovered
			// sequence: incomplete.
			e.releaseOn(r.Seq, w)
			e.dropParts(r, w+1)
			return Adopted{}, fmt.Errorf("adopt seq %d: %w: claim on worker %d: %w", r.Seq, ErrIncomplete, w, err)
		}
		// The claim may have taken effect on w (its answer lost).
		err = fmt.Errorf("adopt seq %d: %w: claim on worker %d: %w", r.Seq, ErrParked, w, err)
		return Adopted{}, e.parkOn(claimers[:w+1], r.Seq, w, err)
	}
	sq := &seqState{layout: r.Layout, lens: a.Lens}
	if err := e.trim(ctx, r, sq); err != nil {
		return Adopted{}, e.parkOn(claimers, r.Seq, -1, fmt.Errorf("adopt seq %d: %w: %w", r.Seq, ErrParked, err))
	}
	e.nextID = max(e.nextID, r.Seq+1)
	e.seqs[r.Seq] = sq
	return a, nil
}

// agree checks r's layout and parts and returns the lengths the
// workers agree on.
func (e *Engine) agree(r Recovered) (Adopted, error) {
	c := e.cfg
	lay := r.Layout
	if lay.CP != c.CP || lay.TP != c.TP {
		return Adopted{}, fmt.Errorf("%w: layout %d x %d (cp x tp), the engine's grid is %d x %d", ErrIncomplete, lay.CP, lay.TP, c.CP, c.TP)
	}
	if err := lay.Validate(c.KVHeads); err != nil {
		return Adopted{}, fmt.Errorf("%w: layout: %w", ErrIncomplete, err)
	}
	a := Adopted{Lens: nil}
	for w, p := range r.Parts {
		if p.Missing {
			if p.Why != "" {
				return Adopted{}, fmt.Errorf("%w: worker %d (ranks %v) did not recover it: %s", ErrIncomplete, w, e.hosts[w], p.Why)
			}
			return Adopted{}, fmt.Errorf("%w: worker %d (ranks %v) did not recover it", ErrIncomplete, w, e.hosts[w])
		}
		if len(p.Lens) != c.Layers {
			return Adopted{}, fmt.Errorf("%w: worker %d: %d lengths for %d layers", ErrIncomplete, w, len(p.Lens), c.Layers)
		}
		if slices.Min(p.Lens) < 0 || p.Had < 0 {
			return Adopted{}, fmt.Errorf("%w: worker %d: negative length", ErrIncomplete, w)
		}
		// A worker reports the end of the tokens its ranks hold; the
		// others may hold more, up to the next token one of its ranks
		// owns and lacks.
		bound := worker.MaxLens(lay, c.PageSize, e.hosts[w], p.Lens)
		if a.Lens == nil {
			a.Lens = bound
		}
		for l, n := range bound {
			a.Lens[l] = min(a.Lens[l], n)
		}
		a.Had = max(a.Had, p.Had)
		if p.RolledBack != nil {
			if len(p.RolledBack) != c.Layers || slices.Min(p.RolledBack) < 0 {
				return Adopted{}, fmt.Errorf("%w: worker %d: rolled back counts %v for %d layers", ErrIncomplete, w, p.RolledBack, c.Layers)
			}
			if a.RolledBack == nil {
				a.RolledBack = make([]int, c.Layers)
			}
			for l, n := range p.RolledBack {
				a.RolledBack[l] = max(a.RolledBack[l], n)
			}
		}
	}
	// Per layer, what it held: the largest any worker knows, or Had
	// where a worker does not say.
	had := make([]int, c.Layers)
	for l := range had {
		had[l] = -1
	}
	for w, p := range r.Parts {
		if p.HadLens == nil {
			had = nil
			break
		}
		if len(p.HadLens) != c.Layers || slices.Min(p.HadLens) < 0 || slices.Max(p.HadLens) > p.Had {
			return Adopted{}, fmt.Errorf("%w: worker %d: lengths before the stop %v for %d layers, had %d", ErrIncomplete, w, p.HadLens, c.Layers, p.Had)
		}
		for l, n := range p.HadLens {
			had[l] = max(had[l], n)
		}
		if p.HadExact != nil && len(p.HadExact) != c.Layers {
			return Adopted{}, fmt.Errorf("%w: worker %d: %d exact flags for %d layers", ErrIncomplete, w, len(p.HadExact), c.Layers)
		}
	}
	exact := make([]bool, c.Layers)
	for _, p := range r.Parts {
		if had == nil || p.HadExact == nil {
			continue
		}
		for l, n := range p.HadLens {
			if p.HadExact[l] && n == had[l] {
				exact[l] = true
			}
		}
	}
	a.HadLens, a.HadExact = had, exact
	// A worker that holds more is cut back in trim: by one Rollback per
	// rank when it holds the same surplus in every layer, else per layer.
	return a, nil
}

// evenDrop returns the tokens worker part p drops in every layer to
// reach lengths want when that is one number from one length (a
// Rollback of Len and Drop), and false when its layers must be cut by
// different amounts.
func evenDrop(p RecoveredPart, want []int) (int, bool) {
	d := p.Lens[0] - want[0]
	for l := range p.Lens {
		if p.Lens[l] != p.Lens[0] || p.Lens[l]-want[l] != d {
			return 0, false
		}
	}
	return d, d > 0
}

// trim rolls back, on every claimed worker that holds more than sq's
// lengths, its ranks' surplus (checked first on the worker): from one
// length by one drop when every layer holds the same surplus, else
// each layer to its own length (RollbackRequest.Lens, checked by the
// worker before it changes anything).
func (e *Engine) trim(ctx context.Context, r Recovered, sq *seqState) error {
	for w, p := range r.Parts {
		if e.holdsSame(w, r.Layout, p.Lens, sq.lens) {
			continue
		}
		wk := e.workers[w]
		d, even := evenDrop(p, sq.lens)
		if !even {
			for _, rk := range e.hosts[w] {
				if _, err := wk.Rollback(ctx, worker.RollbackRequest{Seq: uint64(r.Seq), Rank: rk, Lens: slices.Clone(sq.lens)}); err != nil {
					return fmt.Errorf("cut rank %v from lengths %v to %v: %w", rk, p.Lens, sq.lens, err)
				}
			}
			continue
		}
		if err := wk.Check(ctx, worker.CheckRequest{Seq: uint64(r.Seq), Len: p.Lens[0], Drop: d}); err != nil {
			return fmt.Errorf("roll back worker %d from %d to %d tokens: %w", w, p.Lens[0], sq.lens[0], err)
		}
		for _, rk := range e.hosts[w] {
			if _, err := wk.Rollback(ctx, worker.RollbackRequest{Seq: uint64(r.Seq), Rank: rk, Len: p.Lens[0], Drop: d}); err != nil {
				return fmt.Errorf("roll back rank %v from %d to %d tokens: %w", rk, p.Lens[0], sq.lens[0], err)
			}
		}
	}
	return nil
}

// parkOn parks seq again on the given claimers (best effort, on a
// detached context: the caller's may have ended). uncertain is the
// worker whose Claim failed (-1 for none): that it does not hold seq
// live is no failure. It returns cause, with the failures if any.
func (e *Engine) parkOn(claimers []Claimer, seq SeqID, uncertain int, cause error) error {
	ctx, cancel := detached()
	defer cancel()
	var errs []error
	for w, c := range claimers {
		err := c.Park(ctx, uint64(seq))
		if err != nil && !(w == uncertain && errors.Is(err, worker.ErrUnknownSequence)) {
			errs = append(errs, fmt.Errorf("worker %d: %w", w, err))
		}
	}
	if len(errs) == 0 {
		return cause
	}
	return fmt.Errorf("%w; park again: %w", cause, errors.Join(errs...))
}

// dropParts frees r on the workers from the first-th on that recovered
// it (best effort: a worker that fails keeps it parked; its grid's close
// persists it again and its next restart recovers it).
func (e *Engine) dropParts(r Recovered, first int) {
	ctx, cancel := detached()
	defer cancel()
	for w := first; w < len(e.workers); w++ {
		if r.Parts[w].Missing {
			continue
		}
		if c, ok := e.workers[w].(Claimer); ok {
			_ = c.DropRecovered(ctx, r.Parts[w].Key)
		}
	}
}

// DropRecovered frees, on worker w (the hosts' order of Open), the
// recovered sequence key that the engine will not adopt.
func (e *Engine) DropRecovered(ctx context.Context, w int, key uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	if w < 0 || w >= len(e.workers) {
		return fmt.Errorf("drop recovered %d: %w: worker %d of %d", key, ErrBadInput, w, len(e.workers))
	}
	c, ok := e.workers[w].(Claimer)
	if !ok {
		return fmt.Errorf("drop recovered %d: %w: worker %d (%T) cannot drop recovered sequences", key, ErrBadInput, w, e.workers[w])
	}
	if err := c.DropRecovered(ctx, key); err != nil {
		return fmt.Errorf("drop recovered %d on worker %d: %w", key, w, err)
	}
	return nil
}

// holdsSame reports whether worker w's ranks own, in every layer, as
// many tokens of a sequence laid out by lay at lengths have as at
// lengths want: a worker's recovered lengths are the longest its
// tokens fit, and it need not roll back to shorter ones that give its
// ranks the same tokens.
func (e *Engine) holdsSame(w int, lay plan.Layout, have, want []int) bool {
	S := e.cfg.PageSize
	for _, rk := range e.hosts[w] {
		p := lay.Place(rk.CP)
		for l := range have {
			if p.Tokens(S, have[l]) != p.Tokens(S, want[l]) {
				return false
			}
		}
	}
	return true
}
