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

// FusedStepTensor is the fused step (fused) with the parts' queries in q
// ([parts][QHeads][HeadDim], the parts' Q unused) and the outputs written
// to o and lse (lse may be the zero Tensor: not wanted), all on
// TensorDevice: it queues the step and returns
// without waiting (Sync waits). It reports false, with nothing queued,
// when the step cannot be fused (see fused); ls.O and ls.LSE are left
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

// PrefillTensor appends a prompt chunk's keys and values (k, v
// [n][KVHeads][HeadDim], device tensors on TensorDevice) to one layer of
// sequence id and queues the chunk's causal attention over every page of
// the sequence: o ([n][QHeads][HeadDim]) from q (kernels.PrefillAttender).
// The attention is dense (a prompt attends to all of itself); the pages
// and summaries written are those of any append. Input checked before
// anything changes (ErrBadInput, decode.ErrDeviceTensor); a failure of the
// attention after the append leaves the tokens appended (the caller
// breaks the sequence).
func (s *Shard) PrefillTensor(ctx context.Context, id pagestore.SeqID, layer int, q, k, v, o decode.Tensor) error {
	dev, ok := s.TensorDevice()
	if !ok {
		return fmt.Errorf("prefill: %w: the shard takes host tensors only", decode.ErrDeviceTensor)
	}
	pa, ok := s.be.(kernels.PrefillAttender)
	if !ok {
		return fmt.Errorf("prefill: %w: the backend (%s) has no prefill attention", decode.ErrDeviceTensor, s.be.Name())
	}
	sh := s.shape
	tok := sh.KVHeads * sh.HeadDim
	n := k.Len / max(tok, 1)
	switch {
	case q.Device != dev || k.Device != dev || v.Device != dev || o.Device != dev:
		return fmt.Errorf("prefill: %w: q on %v, k on %v, v on %v, o on %v; the shard takes tensors on %v", decode.ErrDeviceTensor, q.Device, k.Device, v.Device, o.Device, dev)
	case n == 0 || k.Len != n*tok || v.Len != k.Len || q.Len != n*sh.QHeads*sh.HeadDim || o.Len != q.Len:
		return fmt.Errorf("prefill: %w: q, k, v, o hold %d, %d, %d, %d floats; want n x %d, n x %d (twice), n x %d", ErrBadInput,
			q.Len, k.Len, v.Len, o.Len, sh.QHeads*sh.HeadDim, tok, sh.QHeads*sh.HeadDim)
	}
	ts := s.be.(kernels.TensorStepper)
	for _, t := range [...]struct {
		name string
		t    decode.Tensor
	}{{"q", q}, {"k", k}, {"v", v}, {"o", o}} {
		if err := ts.CheckTensor(t.name, t.t, t.t.Len); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start, err := s.store.LayerLen(id, layer)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	if err := s.store.AppendTensor(id, layer, k, v); err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	if err := pa.PrefillTensor(ctx, sh, s.dev[layer], s.tables, uint64(id), start, n, q, o); err != nil {
		// The chunk is appended: the sequence changed.
		return fmt.Errorf("prefill seq %d layer %d: %w: attention: %w", id, layer, pagestore.ErrData, err)
	}
	return nil
}
