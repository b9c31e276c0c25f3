package shard

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Sync waits for the steps queued with StepOptions.Queue and fills their
// results; their errors surface here. With nothing queued, or a backend
// that does not queue, it returns at once.
func (s *Shard) Sync(ctx context.Context) error {
	qs, ok := s.be.(kernels.QueuedStepper)
	if !ok {
		return nil
	}
	if err := qs.Sync(ctx); err != nil {
		return fmt.Errorf("shard sync: %w", err)
	}
	return nil
}

// fused runs the score, candidates and attend phases of ls in one
// backend call when it can: the backend is a kernels.Stepper (the CUDA
// backend keeps scores, the top-K output and the lists on the device), the
// selector is quest, and the shard holds every page of every part (one CP
// rank), so its local top-K is the global one, and the shard does not
// offload (Store.DeviceBudget 0) or, offloading on the device
// (DeviceResident with a backend that keeps a device page -> slot
// table, kernels.SlotTables, and no prefetch), finds every page resident
// (pagestore.Store.StepResident): the step then reads K/V through the
// table, and nothing is done on the host per page. It reports whether it ran;
// when it did not, nothing happened and the program runs the phases. After
// a fused step ls.O and ls.LSE hold the partial states, Time.Fused the
// step's time; Scored is false and the candidates empty (the scores never
// reached the host).
func (s *Shard) fused(ctx context.Context, ls *LocalStep) (bool, error) {
	st, ok := s.be.(kernels.Stepper)
	if !ok {
		return false, nil
	}
	n := len(ls.parts)
	ls.O = resize(ls.O, n*s.shape.QHeads*s.shape.HeadDim)
	ls.LSE = resize(ls.LSE, n*s.shape.QHeads)
	return s.fusedInto(ctx, ls, st.Step, ls.O, ls.LSE)
}

// stepFunc is kernels.Stepper.Step or kernels.QueuedStepper.StepQueued.
type stepFunc func(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error

// fusedInto runs ls as one call of step with outputs o and lse, when the
// shard can fuse (see fused).
func (s *Shard) fusedInto(ctx context.Context, ls *LocalStep, step stepFunc, o, lse []float32) (bool, error) {
	return s.fusedRun(ctx, ls, func(ctx context.Context, sh kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists) error {
		return step(ctx, sh, l, b, q, plan, lists, o, lse)
	})
}

// fusedRun builds the top-K plan and lists of ls and runs them as one
// call of run, when the shard can fuse (see fused).
func (s *Shard) fusedRun(ctx context.Context, ls *LocalStep, run func(ctx context.Context, sh kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists) error) (bool, error) {
	if _, hier := s.canHier(); s.cfg.Policy.Selector != plan.Quest || (s.off != nil && !s.canFuseOffload()) || hier {
		// An offloading shard runs phased: its pages are brought in
		// between selection and attention (see attendOffload).
		return false, nil
	}
	for i, p := range ls.parts {
		np := ls.batch.NumPages(i)
		if p.Place.Ranks > 1 && np > 0 && p.Place.Global(np-1) != np-1 {
			return false, nil // another CP rank holds some pages
		}
		if !p.Plan.Dense && p.Plan.Pages != np {
			return false, nil // the plan counts pages held elsewhere
		}
	}
	kl, b := ls.kl, &ls.batch
	if s.off != nil {
		// Fused only when every page is resident: then the step reads
		// K/V by page through the device's page -> slot table.
		tick, ok, err := s.store.StepResident()
		if err != nil {
			return true, fmt.Errorf("fused step layer %d: %w", ls.layer, err)
		}
		if !ok {
			return false, nil
		}
		s.off.fused++
		ls.slotUse = kernels.SlotUse{Table: s.slotTab, Tick: tick}
		kl.Slots = &ls.slotUse
		b = &ls.rankBatch // the device page tables
	}
	ls.scored = false
	ls.cands = ls.cands[:0]
	ls.cPtr = append(ls.cPtr[:0], 0)
	ls.topk.Reset()
	ls.lists.Mode = ls.mode
	ls.lists.Indptr = append(ls.lists.Indptr[:0], 0)
	ls.lists.Pages = ls.lists.Pages[:0]
	ls.lists.All = ls.allDense()
	for i, p := range ls.parts {
		if ls.lists.All {
			for range ls.rows {
				ls.cPtr = append(ls.cPtr, 0)
			}
			continue // every row reads every page: nothing to list
		}
		pl := p.Plan
		np := ls.batch.NumPages(i)
		for r := range ls.rows {
			ls.cPtr = append(ls.cPtr, 0)
			if pl.Dense {
				ls.appendLocal(i, 0, np)
				ls.lists.Indptr = append(ls.lists.Indptr, int32(len(ls.lists.Pages)))
				continue
			}
			ls.appendLocal(i, 0, pl.Sink)
			lo, hi := pl.Lo(), pl.Hi()
			if k := min(pl.Rank, hi-lo); k > 0 {
				ls.topk.Add(ls.batch.ScoreOffset(i, ls.rows)+r*np+lo, hi-lo, lo, k, len(ls.lists.Pages))
				n := len(ls.lists.Pages)
				ls.lists.Pages = slices.Grow(ls.lists.Pages, k)[:n+k]
				for j := range ls.lists.Pages[n:] {
					ls.lists.Pages[n+j] = -1 // filled by the top-K
				}
			}
			ls.appendLocal(i, hi, np)
			ls.lists.Indptr = append(ls.lists.Indptr, int32(len(ls.lists.Pages)))
		}
	}
	t0 := time.Now()
	if err := run(ctx, s.shape, kl, b, ls.q, &ls.topk, &ls.lists); err != nil {
		return true, fmt.Errorf("fused step layer %d: %w", ls.layer, err)
	}
	ls.Time.Fused = time.Since(t0)
	return true, nil
}

// canFuseOffload reports whether an offloading shard may run a step fused
// when its pages are all resident: its device keeps a page -> slot table
// and it does not prefetch (a prefetching step ranks more pages than it
// attends).
func (s *Shard) canFuseOffload() bool {
	return s.slotTab != nil && s.pfPlan == nil && s.pf == nil
}
