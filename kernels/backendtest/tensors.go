package backendtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
)

// The QueuedDevice's pretend device memory: allocations are float32
// arrays addressed by fake device pointers (allocation i starts at
// (i+1)<<fakeShift), so a decode.Tensor can name them, views included.
// Reads and writes from outside go through AllocTensor, UploadTensor and
// DownloadTensor, as a caller's copies to and from a device would;
// DownloadTensor waits for the queued steps first (a copy on the stream
// after them).

const fakeShift = 32

var _ kernels.TensorStepper = (*QueuedDevice)(nil)

// Device implements kernels.TensorStepper: cuda:Ordinal, pretended.
func (d *QueuedDevice) Device() decode.Device {
	return decode.Device{Kind: decode.CUDA, Ordinal: d.Ordinal}
}

// AllocTensor returns a device tensor of n zeros in the pretend memory.
func (d *QueuedDevice) AllocTensor(n int) (decode.Tensor, error) {
	return d.alloc(n, int64(n)*4)
}

// alloc allocates n floats of pretend memory that count as bytes
// against Capacity (a bf16 matrix counts 2 bytes an element).
func (d *QueuedDevice) alloc(n int, bytes int64) (decode.Tensor, error) {
	if n <= 0 {
		return decode.Tensor{}, fmt.Errorf("fake device: alloc tensor of %d floats", n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.Capacity > 0 && d.used+bytes > d.Capacity {
		return decode.Tensor{}, fmt.Errorf("fake device: out of memory: %d bytes asked, %d of %d free", bytes, d.Capacity-d.used, d.Capacity)
	}
	d.used += bytes
	d.sizes = append(d.sizes, bytes)
	d.mem = append(d.mem, make([]float32, n))
	return decode.OnDevice(d.Device(), uintptr(len(d.mem))<<fakeShift, n, 0), nil
}

// UploadTensor copies src into device tensor t (which must have len(src)
// elements), after the steps queued so far have read their inputs (as a
// copy on the stream would: the QueuedDevice runs a step's reads when it
// is queued).
func (d *QueuedDevice) UploadTensor(t decode.Tensor, src []float32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.resolve(t)
	if err != nil {
		return err
	}
	if len(src) != len(m) {
		return fmt.Errorf("fake device: upload of %d floats into a tensor of %d", len(src), len(m))
	}
	copy(m, src)
	return nil
}

// DownloadTensor waits for the queued steps (Sync) and returns a copy of
// device tensor t.
func (d *QueuedDevice) DownloadTensor(ctx context.Context, t decode.Tensor) ([]float32, error) {
	if err := d.Sync(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.resolve(t)
	if err != nil {
		return nil, err
	}
	return append([]float32(nil), m...), nil
}

// CheckTensor implements kernels.TensorStepper: t must be n floats of
// allocated pretend memory on the default stream (0, which resolve
// checks), as the CUDA backend wants.
func (d *QueuedDevice) CheckTensor(what string, t decode.Tensor, n int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case t.Device != d.Device():
		return fmt.Errorf("fake device: %w: %s is on %v, the device is %v", decode.ErrDeviceTensor, what, t.Device, d.Device())
	case t.Len != n:
		return fmt.Errorf("fake device: %s has %d floats, want %d", what, t.Len, n)
	}
	_, err := d.resolve(t)
	return err
}

// resolve returns the memory a device tensor names (d.mu held).
func (d *QueuedDevice) resolve(t decode.Tensor) ([]float32, error) {
	if t.Device != d.Device() {
		return nil, fmt.Errorf("fake device %v: %w: tensor on %v", d.Device(), decode.ErrDeviceTensor, t.Device)
	}
	if t.Stream != 0 {
		return nil, fmt.Errorf("fake device %v: %w: ordered on stream %#x, the device takes stream 0", d.Device(), decode.ErrDeviceTensor, t.Stream)
	}
	i, off := int(t.Ptr>>fakeShift)-1, int(t.Ptr&(1<<fakeShift-1))
	if i < 0 || i >= len(d.mem) || off%4 != 0 || off/4+t.Len > len(d.mem[i]) || t.Len < 0 {
		return nil, fmt.Errorf("fake device %v: %w: %#x (+%d floats) is not allocated memory", d.Device(), decode.ErrDeviceTensor, t.Ptr, t.Len)
	}
	return d.mem[i][off/4 : off/4+t.Len], nil
}

// StepTensor implements kernels.TensorStepper: it runs the step as
// StepQueued does, reading q now and writing o and lse into the pretend
// memory at the next Sync.
func (d *QueuedDevice) StepTensor(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q decode.Tensor, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse decode.Tensor) error {
	d.mu.Lock()
	qm, err := d.resolve(q)
	var om, lm []float32
	if err == nil {
		om, err = d.resolve(o)
	}
	switch {
	case err == nil && lse.Zero():
		lm = make([]float32, b.Len()*s.QHeads) // not wanted: dropped at Sync
	case err == nil:
		lm, err = d.resolve(lse)
	}
	qc := append([]float32(nil), qm...)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	return d.queue(ctx, s, l, b, qc, plan, lists, om, lm, false)
}

// WriteTokensTensor implements kernels.TensorStepper.
func (d *QueuedDevice) WriteTokensTensor(ctx context.Context, pool any, pages []int32, slot int, k, v decode.Tensor) error {
	d.mu.Lock()
	km, err := d.resolve(k)
	var vm []float32
	if err == nil {
		vm, err = d.resolve(v)
	}
	kc, vc := append([]float32(nil), km...), append([]float32(nil), vm...)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if len(kc) == 0 {
		return errors.New("fake device: no tokens to write")
	}
	return d.WriteTokens(ctx, pool, pages, slot, kc, vc)
}
