package shard

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
)

// Device tensors: a DeviceResident shard whose backend is a
// kernels.TensorStepper takes the new tokens' k and v and the step's q
// and outputs in that device's memory (decode.Tensor), queued on the
// device without a host synchronisation; Sync waits for them.

// WriteTensor implements pagestore.TensorData when the backend takes
// device tensors (DeviceResident shards only).
func (d *deviceData) WriteTensor(layer int, pages []int32, slot int, k, v decode.Tensor) error {
	ts, ok := d.ds.(kernels.TensorStepper)
	if !ok {
		return fmt.Errorf("%w: the backend does not read device tensors", decode.ErrDeviceTensor)
	}
	return ts.WriteTokensTensor(context.Background(), d.pools[layer], pages, slot, k, v)
}

// TensorDevice returns the device whose tensors the shard takes in place
// (AppendTensor, FusedStepTensor), and false when it takes none: its
// backend is not a kernels.TensorStepper, it is not DeviceResident, or it
// offloads.
func (s *Shard) TensorDevice() (decode.Device, bool) {
	ts, ok := s.be.(kernels.TensorStepper)
	if !ok || s.ds == nil || s.off != nil {
		return decode.Device{}, false
	}
	return ts.Device(), true
}

// CheckTensor reports whether t is a view of n floats the shard's
// backend takes in place (kernels.TensorStepper.CheckTensor); it wraps
// decode.ErrDeviceTensor when the shard takes no device tensors.
func (s *Shard) CheckTensor(what string, t decode.Tensor, n int) error {
	if _, ok := s.TensorDevice(); !ok {
		return fmt.Errorf("%w: the shard takes host tensors only", decode.ErrDeviceTensor)
	}
	return s.be.(kernels.TensorStepper).CheckTensor(what, t, n)
}

// AppendTensor is Append with k and v as tensors; device tensors must be
// on TensorDevice (else decode.ErrDeviceTensor, nothing changed).
func (s *Shard) AppendTensor(id pagestore.SeqID, layer int, k, v decode.Tensor) error {
	if !k.OnHost() || !v.OnHost() {
		dev, ok := s.TensorDevice()
		if !ok || k.Device != dev || v.Device != dev {
			return fmt.Errorf("append seq %d layer %d: %w: k on %v, v on %v; the shard takes %s", id, layer, decode.ErrDeviceTensor, k.Device, v.Device, tensorDevice(dev, ok))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store.AppendTensor(id, layer, k, v)
}

func tensorDevice(dev decode.Device, ok bool) string {
	if !ok {
		return "host tensors only"
	}
	return "tensors on " + dev.String()
}

// FusedStepTensor is FusedStep with the parts' queries in q
// ([parts][QHeads][HeadDim], the parts' Q unused) and the outputs written
// to o and lse (lse may be the zero Tensor: not wanted), all on
// TensorDevice: it queues the step and returns
// without waiting (Sync waits). It reports false, with nothing queued,
// when the step cannot be fused (see FusedStep); ls.O and ls.LSE are left
// alone. ls must come from BeginTensor.
func (s *Shard) FusedStepTensor(ctx context.Context, ls *LocalStep, q, o, lse decode.Tensor) (bool, error) {
	dev, ok := s.TensorDevice()
	if !ok {
		return false, fmt.Errorf("fused step: %w: the shard takes host tensors only", decode.ErrDeviceTensor)
	}
	n := len(ls.parts)
	switch {
	case !ls.qDev:
		return false, fmt.Errorf("fused step: %w: the step was not begun with BeginTensor", ErrBadInput)
	case q.Device != dev || o.Device != dev || (!lse.Zero() && lse.Device != dev):
		return false, fmt.Errorf("fused step: %w: q on %v, o on %v, lse on %v; the shard takes tensors on %v", decode.ErrDeviceTensor, q.Device, o.Device, lse.Device, dev)
	case q.Len != n*s.shape.QHeads*s.shape.HeadDim || o.Len != q.Len || (!lse.Zero() && lse.Len != n*s.shape.QHeads):
		return false, fmt.Errorf("fused step: %w: q, o, lse hold %d, %d, %d floats for %d sequences of %d heads x %d", ErrBadInput, q.Len, o.Len, lse.Len, n, s.shape.QHeads, s.shape.HeadDim)
	}
	ts := s.be.(kernels.TensorStepper)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fusedRun(ctx, ls, func(ctx context.Context, sh kernels.Shape, l kernels.Layer, b *kernels.Batch, _ []float32, plan *kernels.TopKPlan, lists *kernels.Lists) error {
		return ts.StepTensor(ctx, sh, l, b, q, plan, lists, o, lse)
	})
}
