package backendtest

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/questrt/questrt/kernels"
)

// QueuedDevice is a FakeDevice whose steps can be queued
// (kernels.QueuedStepper) the way a device queues them: StepQueued runs
// the step into buffers of its own and fills the caller's o and lse with
// NaN; Sync copies the results in. A caller that reads a queued output
// before Sync sees NaN. It also has pretend device memory that
// decode.Tensor views can name (kernels.TensorStepper; see AllocTensor). Use
// it by pointer.
type QueuedDevice struct {
	FakeDevice
	// Ordinal is the pretend device's ordinal: its memory is cuda:Ordinal.
	Ordinal int

	mu      sync.Mutex
	pending []queuedOut
	queued  int
	syncs   int
	mem     [][]float32 // pretend device memory (tensors.go)
	used    int64       // bytes of mem allocated
	sizes   []int64     // bytes each allocation of mem counts
	// Capacity is the pretend device's memory in bytes (0: unlimited):
	// AllocTensor fails past it and MemInfo reports it.
	Capacity int64
}

type queuedOut struct{ dst, src []float32 }

var _ kernels.QueuedStepper = (*QueuedDevice)(nil)

// StepQueued implements kernels.QueuedStepper.
func (d *QueuedDevice) StepQueued(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32) error {
	return d.queue(ctx, s, l, b, q, plan, lists, o, lse, true)
}

// queue runs the step into buffers of its own and copies them into o and
// lse at the next Sync; poison fills o and lse with NaN meanwhile (host
// outputs: a caller that reads them early sees NaN).
func (d *QueuedDevice) queue(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q []float32, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse []float32, poison bool) error {
	if len(o) != b.Len()*s.QHeads*s.HeadDim || len(lse) != b.Len()*s.QHeads {
		return fmt.Errorf("fake device: o and lse hold %d and %d floats for %d sequences", len(o), len(lse), b.Len())
	}
	o2, lse2 := make([]float32, len(o)), make([]float32, len(lse))
	// The contract leaves lists.Pages alone: run on a copy.
	l2 := *lists
	l2.Pages = append([]int32(nil), lists.Pages...)
	if err := d.FakeDevice.Step(ctx, s, l, b, q, plan, &l2, o2, lse2); err != nil {
		return err
	}
	if poison {
		nan := float32(math.NaN())
		for i := range o {
			o[i] = nan
		}
		for i := range lse {
			lse[i] = nan
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pending = append(d.pending, queuedOut{o, o2}, queuedOut{lse, lse2})
	d.queued++
	return nil
}

// Sync implements kernels.QueuedStepper. With ctx done it drops the
// queued outputs unwritten and returns ctx's error (as a device failure
// would), so nothing is written after it returns.
func (d *QueuedDevice) Sync(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.syncs++
	if err := ctx.Err(); err != nil {
		d.pending = nil
		return err
	}
	for _, p := range d.pending {
		copy(p.dst, p.src)
	}
	d.pending = nil
	return nil
}

// Queued is the number of steps queued so far.
func (d *QueuedDevice) Queued() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queued
}

// Syncs is the number of Sync calls so far (DownloadTensor's included): the
// host synchronisations a caller paid.
func (d *QueuedDevice) Syncs() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.syncs
}
