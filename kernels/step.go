package kernels

import (
	"context"
	"fmt"
	"slices"
)

// Stepper is implemented by backends that run the local step of a shard
// holding every page of its sequences (score, top-K, attention) in one
// call, keeping the scores where they are computed: the CUDA backend
// leaves scores, top-K output and lists on the device, with no host round
// trip between the phases.
type Stepper interface {
	// Step scores every page of b for every row of lists.Mode (as Score),
	// runs plan over those scores (as TopK) writing each plan row's chosen
	// pages into lists.Pages at the row's OutOff, then attends over lists
	// (as Attend). The caller fills the other entries of lists (forced
	// pages); see CheckStep for what plan and lists must satisfy. On
	// return lists.Pages holds the chosen pages too.
	Step(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, plan *TopKPlan, lists *Lists, o, lse []float32) error
}

// QueuedStepper is a Stepper that can also queue a step on its device and
// return without waiting for it: a caller running many layers (or many
// shards on one device) pays one host synchronisation per decode step
// instead of one per layer.
type QueuedStepper interface {
	Stepper
	// StepQueued checks its arguments as Step does and queues the same
	// step. It reads b, q, plan and lists before it returns (the caller
	// may reuse them), writes o and lse only by the time Sync returns nil
	// (the caller must not touch them until then), and never writes back
	// lists.Pages. Steps run in the order they were queued.
	StepQueued(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, plan *TopKPlan, lists *Lists, o, lse []float32) error
	// Sync waits for every queued step and fills its o and lse; an error
	// of a queued step is returned here (then the outputs of the steps
	// queued since the last Sync are undefined). Nothing is written into
	// a queued step's o and lse after Sync returns, with or without an
	// error, so a caller may reuse them then.
	Sync(ctx context.Context) error
}

// StepCheck validates the plan and lists of a Stepper call; the zero value
// is ready to use and keeps its scratch between calls.
type StepCheck struct {
	slot []bool // lists.Pages entries written by the top-K
	seen []bool // pages of one list row
	cand []int32
}

// Check reports whether plan and lists describe one step over batch b
// with rows rows per sequence: lists has one well-formed row per
// (sequence, row); each plan row ranks candidates [Base, Base+N) of one
// list row's own score row (ScoreOff = b.ScoreOffset(i, rows) +
// r*NumPages(i) + Base) and writes min(K, N) pages into that list row,
// slots no other plan row writes; every other entry of a list row is a
// page of its sequence outside the candidates, listed once. Then the
// lists after the top-K hold no duplicate and no page outside its
// sequence, whatever the scores.
func (c *StepCheck) Check(b *Batch, rows int, plan *TopKPlan, lists *Lists) error {
	if err := b.checkIndptr(); err != nil {
		return fmt.Errorf("step: %w", err)
	}
	if rows < 1 {
		return fmt.Errorf("step: %d rows per sequence", rows)
	}
	if lists.All {
		if plan.Rows() > 0 {
			return fmt.Errorf("step: %d top-K rows but lists of every page", plan.Rows())
		}
		return nil
	}
	n := b.Len()
	if len(lists.Indptr) != n*rows+1 || lists.Indptr[0] != 0 || int(lists.Indptr[n*rows]) != len(lists.Pages) {
		return fmt.Errorf("step: lists indptr has %d entries for %d rows and %d pages", len(lists.Indptr), n*rows, len(lists.Pages))
	}
	for row := range n * rows {
		if lists.Indptr[row+1] < lists.Indptr[row] {
			return fmt.Errorf("step: lists indptr decreases at row %d", row)
		}
	}
	if _, err := plan.Check(b.Total()*rows, len(lists.Pages)); err != nil {
		return fmt.Errorf("step: %w", err)
	}
	c.slot = slices.Grow(c.slot[:0], len(lists.Pages))[:len(lists.Pages)]
	clear(c.slot)
	// cand[row] = plan row ranking into list row, or -1.
	c.cand = slices.Grow(c.cand[:0], n*rows)[:n*rows]
	for i := range c.cand {
		c.cand[i] = -1
	}
	for pr := range plan.Rows() {
		oo, m := plan.OutOff[pr], min(plan.K[pr], plan.N[pr])
		row, _ := slices.BinarySearch(lists.Indptr, oo+1) // first indptr > oo
		row--
		if row < 0 || row >= n*rows || oo+m > lists.Indptr[row+1] {
			return fmt.Errorf("step: top-K row %d writes [%d,%d), not inside one list row", pr, oo, oo+m)
		}
		if c.cand[row] >= 0 {
			return fmt.Errorf("step: top-K rows %d and %d both write list row %d", c.cand[row], pr, row)
		}
		c.cand[row] = int32(pr)
		i, r := row/rows, row%rows
		np := int32(b.NumPages(i))
		if plan.Base[pr] < 0 || plan.Base[pr]+plan.N[pr] > np {
			return fmt.Errorf("step: top-K row %d ranks pages [%d,%d) of a sequence of %d", pr, plan.Base[pr], plan.Base[pr]+plan.N[pr], np)
		}
		if want := int32(b.ScoreOffset(i, rows)) + int32(r)*np + plan.Base[pr]; plan.ScoreOff[pr] != want {
			return fmt.Errorf("step: top-K row %d reads scores at %d, list row %d's candidates start at %d", pr, plan.ScoreOff[pr], row, want)
		}
		for j := oo; j < oo+m; j++ {
			c.slot[j] = true
		}
	}
	// seen marks the forced pages of the row being checked; the marks are
	// cleared after each row, so only the listed entries are touched.
	for row := range n * rows {
		np := b.NumPages(row / rows)
		if len(c.seen) < np {
			c.seen = make([]bool, np)
		}
		lo, hi := int32(0), int32(0)
		if pr := c.cand[row]; pr >= 0 {
			lo, hi = plan.Base[pr], plan.Base[pr]+plan.N[pr]
		}
		var err error
		j := lists.Indptr[row]
		for ; j < lists.Indptr[row+1]; j++ {
			if c.slot[j] {
				continue
			}
			p := lists.Pages[j]
			switch {
			case p < 0 || int(p) >= np:
				err = fmt.Errorf("step: list row %d: page %d outside 0..%d", row, p, np-1)
			case p >= lo && p < hi:
				err = fmt.Errorf("step: list row %d: forced page %d is also a top-K candidate", row, p)
			case c.seen[p]:
				err = fmt.Errorf("step: list row %d: page %d listed twice", row, p)
			}
			if err != nil {
				break
			}
			c.seen[p] = true
		}
		for _, p := range lists.Pages[lists.Indptr[row]:j] {
			if p >= 0 && int(p) < len(c.seen) {
				c.seen[p] = false
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Compose runs a Stepper call as separate Score, TopK and Attend calls of
// be, with scores in the caller's buffer (grown as needed and returned):
// the reference for Stepper implementations, and the CPU backend's Step.
func Compose(ctx context.Context, be Backend, scores []float32, s Shape, l Layer, b *Batch, q []float32, plan *TopKPlan, lists *Lists, o, lse []float32) ([]float32, error) {
	if plan.Rows() == 0 { // nothing ranked: attention alone
		return scores, be.Attend(ctx, s, l, b, q, lists, o, lse)
	}
	n := b.Total() * s.Rows(lists.Mode)
	scores = slices.Grow(scores[:0], n)[:n]
	if err := be.Score(ctx, s, l, b, q, lists.Mode, scores); err != nil {
		return scores, err
	}
	if err := be.TopK(ctx, scores, plan, lists.Pages); err != nil {
		return scores, err
	}
	return scores, be.Attend(ctx, s, l, b, q, lists, o, lse)
}
