//go:build cuda

package cuda

import (
	"context"
	"fmt"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/kernels"
)

// The fused step (kernels.Stepper, kernels.QueuedStepper): score, top-K
// and attention back to back on the device with one upload.

// Step implements kernels.Stepper: the batch, queries, lists and plan go
// up once; score, top-K (writing straight into the device lists) and
// attention run back to back on the device (top-K and attention as
// programmatic dependents where the kernels allow); the attention writes
// o and lse into mapped host memory and the lists come back in one copy.
func (b *Backend) Step(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	return b.step(ctx, false, s, l, bt, q, plan, lists, o, lse)
}

// StepQueued implements kernels.QueuedStepper: Step's device work, queued
// without waiting for it; o and lse are filled from the staging buffer at
// the next synchronization (Sync, or any call that waits for the device).
func (b *Backend) StepQueued(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	return b.step(ctx, true, s, l, bt, q, plan, lists, o, lse)
}

// Sync implements kernels.QueuedStepper: it waits for every queued step
// and fills their outputs.
// It waits for its turn whatever ctx (at most one call), so that no
// queued output is written after it returns; when the device fails, the
// queued outputs are dropped unwritten.
func (b *Backend) Sync(ctx context.Context) error {
	return b.do(context.WithoutCancel(ctx), func() error {
		if err := cu.Synchronize(); err != nil {
			clear(b.pending)
			b.pending = b.pending[:0]
			return fmt.Errorf("cuda: sync: %w", err)
		}
		b.settle()
		return nil
	})
}

func (b *Backend) step(ctx context.Context, queued bool, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	b.stepMu.Lock()
	defer b.stepMu.Unlock()
	b.probe.enter()
	if err := b.checkStep(s, l, bt, q, plan, lists, o, lse); err != nil {
		return err
	}
	return b.do(ctx, func() error { return b.stepDevice(queued, s, l, bt, q, plan, lists, o, lse, nil) })
}

// checkStep validates a Step call (b.stepMu held).
func (b *Backend) checkStep(s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	if err := b.checkAttend(s, l, bt, q, lists, o, lse); err != nil {
		return fmt.Errorf("step: %w", err)
	}
	return b.stepCheck.Check(bt, s.Rows(lists.Mode), plan, lists)
}

// tensorArgs are the device arrays of a step whose query and outputs
// live in device memory (StepTensor).
type tensorArgs struct{ q, o, lse cu.DevicePtr }

// stepDevice is a checked Step's device work (device goroutine only):
// queued leaves the outputs to the next settle. With dev set, the query
// and outputs are the device arrays it names (StepTensor; q, o and lse
// unused) and nothing is left to settle.
func (b *Backend) stepDevice(queued bool, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32, dev *tensorArgs) error {
	// Tile maxima serve the threshold top-K when every plan row starts at
	// its score row's start.
	tiles := true
	for r := range plan.Rows() {
		tiles = tiles && plan.Base[r] == 0
	}
	if err := b.probe.mark(0); err != nil {
		return err
	}
	var pi [5]int
	dl, a, err := b.prepareAttend(s, l, bt, q, lists, func(in *packed) {
		for i, x := range [][]int32{plan.ScoreOff, plan.N, plan.Base, plan.K, plan.OutOff} {
			pi[i] = pack(in, x)
		}
	})
	if err != nil {
		return err
	}
	if dev != nil {
		a.q, a.o, a.lse = dev.q, dev.o, dev.lse
	}
	// A slot pool read through its page -> slot table: the score reads
	// the summaries by page, attention the K/V by slot (bySlot, below).
	tab, err := slotUse(l, dl)
	if err != nil {
		return err
	}
	if err := b.probe.mark(1); err != nil {
		return err
	}
	var ptrs [5]cu.DevicePtr
	for i := range ptrs {
		ptrs[i] = b.in.ptr(pi[i])
	}
	heads, perHead := headsOf(s, lists.Mode)
	if plan.Rows() > 0 {
		if _, err := b.scoreTopK(dl, s, bt, lists.Mode, plan, a.ind, a.pg, a.q, ptrs, a.lists, tiles); err != nil {
			return err
		}
	}
	if tab != nil {
		if err := b.bySlot(tab, bt.Total(), &a, true, l.Slots.Tick, plan.Rows() > 0); err != nil {
			return err
		}
	}
	if err := b.launchAttendReduce(dl, s, heads, perHead, a, plan.Rows() > 0); err != nil {
		return err
	}
	if err := b.probe.mark(2); err != nil {
		return err
	}
	if dev != nil {
		b.out.reset() // the kernels wrote the caller's device arrays
		return nil
	}
	if queued {
		b.queueOut(o, lse)
		return nil
	}
	var back []int32 // the lists with the top-K's picks
	if !lists.All {
		back = lists.Pages
	}
	if err := b.receiveOut(o, lse, back, a); err != nil {
		return err
	}
	return b.probe.done()
}

// scoreTopK scores the batch (device arrays ind, pg, qp) into the scratch
// buffer "scores", with tile maxima when tiles is set and the tensor-core
// kernel writes them, and launches plan's top-K over them into out as a
// programmatic dependent of the score kernel. It returns the scores
// (device goroutine only).
func (b *Backend) scoreTopK(dl *DeviceLayer, s kernels.Shape, bt *kernels.Batch, mode kernels.GQAMode, plan *kernels.TopKPlan, ind, pg, qp cu.DevicePtr, ptrs [5]cu.DevicePtr, out cu.DevicePtr, tiles bool) (cu.DevicePtr, error) {
	nScores := int64(bt.Total() * s.Rows(mode))
	sp, err := b.buf("scores", nScores*4)
	if err != nil {
		return 0, err
	}
	tmax := cu.DevicePtr(0)
	if tiles && b.scoreWritesTiles(s, dl) {
		if tmax, err = b.buf("step.tmax", nScores*4); err != nil {
			return 0, err
		}
	}
	_, perHead := headsOf(s, mode)
	wrote, err := b.launchScore(dl, s, bt.Len(), bt.MaxPages(), ind, pg, qp, sp, tmax, perHead)
	if err != nil {
		return 0, err
	}
	if !wrote {
		tmax = 0
	}
	return sp, b.launchTopK(plan, sp, tmax, ptrs, out, true)
}
