package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/worker"
)

// PrefillTensor runs a prompt chunk of one layer of sequence id on the
// device that holds its pages: the chunk's keys and values k and v
// ([n][KVHeads][HeadDim]) are appended to the layer and o
// ([n][QHeads][HeadDim]) becomes the causal attention of q over all of
// the sequence (dense: a prompt attends to every earlier token), queued
// on the device with the tensors; the next step's End, or a download of
// o, waits for it. Every tensor is on one device, the pages' (an
// in-process grid of one rank, see tensorWorker; else
// decode.ErrDeviceTensor). Layers go in any order, each chunk once per
// layer, between steps (an open step holds the engine). Bad input
// changes nothing (ErrBadInput); a failure once the chunk may be in the
// layer breaks the sequence.
func (e *Engine) PrefillTensor(ctx context.Context, id SeqID, layer int, q, k, v, o decode.Tensor) error {
	if err := e.lockOp(ctx, "prefill"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	c := e.cfg
	n := k.Len / c.KVRow()
	switch {
	case layer < 0 || layer >= c.Layers:
		return fmt.Errorf("prefill seq %d: %w: layer %d outside 0..%d", id, ErrBadInput, layer, c.Layers-1)
	case n == 0 || k.Len != n*c.KVRow() || v.Len != k.Len || q.Len != n*c.QRow() || o.Len != q.Len:
		return fmt.Errorf("prefill seq %d layer %d: %w: q, k, v, o hold %d, %d, %d, %d floats; want n x %d, n x %d (twice), n x %d",
			id, layer, ErrBadInput, q.Len, k.Len, v.Len, o.Len, c.QRow(), c.KVRow(), c.QRow())
	case q.OnHost() || k.OnHost() || v.OnHost() || o.OnHost():
		return fmt.Errorf("prefill seq %d layer %d: %w: device tensors only (a host prompt goes through Append)", id, layer, decode.ErrDeviceTensor)
	case overlap(q, o):
		return fmt.Errorf("prefill seq %d layer %d: %w: the output overlaps q", id, layer, ErrBadInput)
	}
	tw, err := e.tensorWorker(q.Device)
	if err != nil {
		return fmt.Errorf("prefill seq %d layer %d: %w", id, layer, err)
	}
	ctx, cancel := e.opContext(ctx)
	defer cancel()
	if err := tw.PrefillTensor(ctx, uint64(id), layer, sq.lens[layer], q, k, v, o); err != nil {
		if errors.Is(err, worker.ErrChanged) {
			sq.broken = true
		}
		return fmt.Errorf("prefill seq %d layer %d: %w", id, layer, err)
	}
	sq.lens[layer] += n
	return nil
}

// AppendTensor appends tokens to one layer of sequence id from device
// tensors k and v ([n][KVHeads][HeadDim], on the device that holds the
// pages, see tensorWorker), queued on the device: Append without the
// trip through the host, for K/V made on the device (PrefillTensor
// without the attention; a benchmark's random context). The values are
// not checked (they never reach the host). Between steps; bad input
// changes nothing (ErrBadInput); a failure once the tokens may be in
// the layer breaks the sequence.
func (e *Engine) AppendTensor(ctx context.Context, id SeqID, layer int, k, v decode.Tensor) error {
	if err := e.lockOp(ctx, "append"); err != nil {
		return err
	}
	defer e.mu.Unlock()
	sq, err := e.lookup(id)
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	c := e.cfg
	n := k.Len / c.KVRow()
	switch {
	case layer < 0 || layer >= c.Layers:
		return fmt.Errorf("append seq %d: %w: layer %d outside 0..%d", id, ErrBadInput, layer, c.Layers-1)
	case n == 0 || k.Len != n*c.KVRow() || v.Len != k.Len:
		return fmt.Errorf("append seq %d layer %d: %w: k and v hold %d and %d floats; want the same n x %d", id, layer, ErrBadInput, k.Len, v.Len, c.KVRow())
	case k.OnHost() || v.OnHost():
		return fmt.Errorf("append seq %d layer %d: %w: device tensors only (host tokens go through Append)", id, layer, decode.ErrDeviceTensor)
	case v.Device != k.Device:
		return fmt.Errorf("append seq %d layer %d: %w: k on %v, v on %v", id, layer, decode.ErrDeviceTensor, k.Device, v.Device)
	}
	tw, err := e.tensorWorker(k.Device)
	if err != nil {
		return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
	}
	for name, t := range map[string]decode.Tensor{"k": k, "v": v} {
		if err := tw.CheckTensor(name, t, t.Len); err != nil {
			return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
		}
	}
	ctx, cancel := e.opContext(ctx)
	defer cancel()
	if err := tw.AppendTensor(ctx, uint64(id), layer, sq.lens[layer], k, v); err != nil {
		if errors.Is(err, worker.ErrChanged) {
			sq.broken = true
		}
		return fmt.Errorf("append seq %d layer %d: %w", id, layer, err)
	}
	sq.lens[layer] += n
	return nil
}
