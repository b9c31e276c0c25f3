package shard

import (
	"context"
	"fmt"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
)

// OffloadStats is a snapshot of an offloading shard (Store.DeviceBudget >
// 0): its store's device pool and tier traffic, and how its steps
// attended. Counters are cumulative since New; a shard without offload
// reports zeros.
type OffloadStats struct {
	pagestore.ResidencyStats
	// Steps counts attention phases that brought their pages in.
	// MultiPass counts those whose pages did not fit the device at once:
	// they attended in Passes passes in all (a pass per device-full of
	// pages), whose partial states were merged, which equals one pass up
	// to fp32 rounding but not bit for bit.
	Steps, MultiPass, Passes int64
	// PrefetchSteps counts steps that ranked pages for prefetch (see
	// [Config.PrefetchPages]) and PrefetchRanked the candidates they
	// ranked outside their own working set (resident ones included: the
	// store reserves only for the others, PrefetchIssued). PrefetchPlan
	// is the time those steps spent ranking and reserving, on the step's
	// critical path (the reads are not).
	PrefetchSteps, PrefetchRanked int64
	PrefetchPlan                  time.Duration
	// Fused counts steps that found every page resident and ran fused,
	// reading K/V through the device's page -> slot table (see
	// fused; not in Steps).
	Fused int64
}

// StallPerStep is the mean time a step spent in its recalls (Stall /
// Steps; 0 before the first step).
func (st OffloadStats) StallPerStep() time.Duration {
	if st.Steps == 0 {
		return 0
	}
	return st.Stall / time.Duration(st.Steps)
}

// OffloadStats returns a snapshot of the shard's offload counters.
func (s *Shard) OffloadStats() OffloadStats {
	if s.off == nil {
		return OffloadStats{}
	}
	s.mu.Lock()
	o := s.off
	st := OffloadStats{Steps: o.steps, MultiPass: o.multi, Passes: o.passes, Fused: o.fused}
	if pp := s.pfPlan; pp != nil {
		st.PrefetchSteps, st.PrefetchRanked, st.PrefetchPlan = pp.steps, pp.ranked, pp.time
	}
	s.mu.Unlock()
	st.ResidencyStats = s.store.ResidencyStats()
	return st
}

// offload is the step side of an offloading shard: the working set of a
// step's attention, its translation to device slots, and the scratch of
// multi-pass attention. Guarded by the shard's mutex.
type offload struct {
	budget  int
	sumPage int // floats of one page's summaries in one layer

	mark  []uint32 // physical page: == epoch while in the step's working set
	pass  []uint32 // physical page: == passEpoch while in the current pass
	epoch uint32
	pe    uint32

	want   []int32 // the working set: distinct physical pages, in list order
	pinned []int32 // pinned pages of want (DeviceRoom)
	order  []int32 // multi-pass: want ordered pinned, resident, missing
	slots  []int32 // AppendSlots scratch
	batch  kernels.Batch

	// compact: the attended pages of a one-pass step by position.
	pos                    []int32
	posMark                []uint32 // physical page -> position, valid when posMark == posEp
	posEp                  uint32
	cPages, cIndptr, cLast []int32
	lists                  kernels.Lists // a pass's lists
	o, lse                 []float32     // a pass's partial states

	steps, multi, passes, fused int64
}

func newOffload(c pagestore.Config) *offload {
	return &offload{
		budget:  c.DeviceBudget,
		sumPage: c.SummaryElems(),
		mark:    make([]uint32, c.Capacity),
		pass:    make([]uint32, c.Capacity),
		pos:     make([]int32, c.Capacity),
		posMark: make([]uint32, c.Capacity),
	}
}

// next advances an epoch over marks, clearing them when it wraps.
func next(e *uint32, marks []uint32) uint32 {
	*e++
	if *e == 0 {
		clear(marks)
		*e = 1
	}
	return *e
}

// attnLayer is the kernels' view of layer l for attention on an
// offloading shard: the device pool's K/V slots (float32 blocks or fp8
// records), with the summary pool cut
// to as many pages so that the layer is one pool of DeviceBudget pages
// (attention reads no summaries; scoring gets the whole summary pool).
//
// On a DeviceResident shard it is the device slot pool itself, which the
// backend attends by slot.
func (s *Shard) attnLayer(l int) kernels.Layer {
	if s.dev != nil {
		return kernels.Layer{Device: s.dev[l]}
	}
	h := s.store.Layer(l)
	return kernels.Layer{K: h.K, V: h.V, K8: h.K8, V8: h.V8, KScale: h.KScale, VScale: h.VScale,
		Summary: h.Summary[:s.off.budget*s.off.sumPage]}
}

// collect gathers the step's working set: every physical page some row
// of ls.lists attends, once.
func (o *offload) collect(ls *LocalStep) {
	ep := next(&o.epoch, o.mark)
	o.want = o.want[:0]
	add := func(p int32) {
		if o.mark[p] != ep {
			o.mark[p] = ep
			o.want = append(o.want, p)
		}
	}
	for i := range ls.parts {
		pages := ls.batch.Pages[ls.batch.Indptr[i]:ls.batch.Indptr[i+1]]
		if ls.lists.All {
			for _, p := range pages {
				add(p)
			}
			continue
		}
		for r := range ls.rows {
			k := i*ls.rows + r
			for _, lp := range ls.lists.Pages[ls.lists.Indptr[k]:ls.lists.Indptr[k+1]] {
				add(pages[lp])
			}
		}
	}
}

// translate readdresses b by device slot into o.batch; pages of the
// current pass (pass marks == pe) must be resident. Pages not attended
// get slot 0: the kernels read only listed pages.
func (o *offload) translate(st *pagestore.Store, b *kernels.Batch) error {
	o.slots = st.AppendSlots(o.slots[:0], b.Pages)
	for j, sl := range o.slots {
		if sl < 0 {
			if p := b.Pages[j]; o.pass[p] == o.pe {
				return fmt.Errorf("page %d is to be attended but not resident after its recall", p)
			}
			o.slots[j] = 0
		}
	}
	o.batch = kernels.Batch{Indptr: b.Indptr, Pages: o.slots, LastLen: b.LastLen}
	return nil
}

// attendOffload is the attention of an offloading shard: it brings the
// pages that ls.lists attend into the device pool, readdresses the batch
// by device slot and attends over ls.lists unchanged, so the outputs are
// bit-identical to those of a shard holding every page. When the pages
// do not fit beside the pinned pages of other sequences, it attends in
// passes of one device-full each (pinned pages in the first, the resident
// ones next) and merges the passes' partial states.
func (s *Shard) attendOffload(ctx context.Context, ls *LocalStep) error {
	o := s.off
	o.steps++
	o.collect(ls)
	var room int
	room, o.pinned = s.store.DeviceRoom(o.want, o.pinned[:0])
	kl := s.attnLayer(ls.layer)
	if len(o.want) <= room {
		o.passes++
		if err := s.recall(ctx, ls, o.want); err != nil {
			return err
		}
		if s.pf != nil {
			// Ranked and reserved now, read while this step attends.
			if err := s.prefetchNext(ctx, ls); err != nil {
				return fmt.Errorf("prefetch: %w", err)
			}
		}
		if ls.lists.All {
			if err := o.translate(s.store, &ls.batch); err != nil {
				return err
			}
			return s.be.Attend(ctx, s.shape, kl, &o.batch, ls.q, &ls.lists, ls.O, ls.LSE)
		}
		if err := o.compact(s, ls); err != nil {
			return err
		}
		return s.be.Attend(ctx, s.shape, kl, &o.batch, ls.q, &o.lists, ls.O, ls.LSE)
	}
	return s.attendPasses(ctx, ls, kl, room)
}

// recall brings pages in for ls's attention and marks them as the pass.
func (s *Shard) recall(ctx context.Context, ls *LocalStep, pages []int32) error {
	o := s.off
	pe := next(&o.pe, o.pass)
	for _, p := range pages {
		o.pass[p] = pe
	}
	t0 := time.Now()
	err := s.store.Recall(ctx, pages)
	ls.Time.Recall += time.Since(t0)
	return err
}

// attendPasses attends the working set in passes of at most room pages
// (see attendOffload) and merges them into ls.O and ls.LSE.
func (s *Shard) attendPasses(ctx context.Context, ls *LocalStep, kl kernels.Layer, room int) error {
	o := s.off
	o.multi++
	// Order: the pinned pages (they stay resident: the first pass holds
	// them), then the resident pages (hits), then the missing ones.
	pe := next(&o.pe, o.pass)
	o.order = append(o.order[:0], o.pinned...)
	for _, p := range o.pinned {
		o.pass[p] = pe
	}
	o.slots = s.store.AppendSlots(o.slots[:0], o.want)
	for pass := range 2 {
		for j, p := range o.want {
			if o.pass[p] != pe && (o.slots[j] >= 0) == (pass == 0) {
				o.order = append(o.order, p)
			}
		}
	}
	rest := room - len(o.pinned)
	if rest < 1 {
		return fmt.Errorf("attend: %d pages to attend, %d of them pinned, device room %d of budget %d: %w",
			len(o.want), len(o.pinned), room, o.budget, pagestore.ErrDeviceFull)
	}
	sh := s.shape
	n := len(ls.parts)
	o.o = resize(o.o, n*sh.QHeads*sh.HeadDim)
	o.lse = resize(o.lse, n*sh.QHeads)
	first := true
	for at := 0; at < len(o.order); {
		end := min(len(o.order), at+rest)
		if first {
			end = min(len(o.order), len(o.pinned)+rest)
		}
		chunk := o.order[at:end]
		at = end
		o.passes++
		if err := s.recall(ctx, ls, chunk); err != nil {
			return err
		}
		if err := o.translate(s.store, &ls.batch); err != nil {
			return err
		}
		o.passLists(ls)
		out, lse := o.o, o.lse
		if first {
			out, lse = ls.O, ls.LSE
		}
		if err := s.be.Attend(ctx, sh, kl, &o.batch, ls.q, &o.lists, out, lse); err != nil {
			return err
		}
		if !first {
			kernels.MergeStates(sh.HeadDim, ls.O, ls.LSE, o.o, o.lse)
		}
		first = false
	}
	return nil
}

// passLists builds o.lists: each row of ls.lists restricted to the pages
// of the current pass, in its order.
func (o *offload) passLists(ls *LocalStep) {
	l := &o.lists
	l.Mode, l.All = ls.lists.Mode, false
	l.Indptr = append(l.Indptr[:0], 0)
	l.Pages = l.Pages[:0]
	for i := range ls.parts {
		pages := ls.batch.Pages[ls.batch.Indptr[i]:ls.batch.Indptr[i+1]]
		for r := range ls.rows {
			if ls.lists.All {
				for lp, p := range pages {
					if o.pass[p] == o.pe {
						l.Pages = append(l.Pages, int32(lp))
					}
				}
			} else {
				k := i*ls.rows + r
				for _, lp := range ls.lists.Pages[ls.lists.Indptr[k]:ls.lists.Indptr[k+1]] {
					if o.pass[pages[lp]] == o.pe {
						l.Pages = append(l.Pages, lp)
					}
				}
			}
			l.Indptr = append(l.Indptr, int32(len(l.Pages)))
		}
	}
}
