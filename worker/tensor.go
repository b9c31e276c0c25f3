package worker

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// TensorWorker is a Worker that runs a layer with its tensors in a
// device's memory, in place and queued (decode.Tensor): the in-process
// worker whose one rank keeps its pages on that device. A remote worker
// is not one; its caller copies to the host and sends.
type TensorWorker interface {
	Worker
	// TensorDevice returns the device whose tensors LayerTensor takes,
	// and false when it takes none now.
	TensorDevice() (decode.Device, bool)
	// CheckTensor reports whether t is a view of n floats that
	// LayerTensor can take (kernels.TensorStepper.CheckTensor), changing
	// nothing.
	CheckTensor(what string, t decode.Tensor, n int) error
	// LayerTensor is Layer for a worker of one rank with every tensor on
	// TensorDevice: q [seqs][QHeads][HeadDim] and the new tokens' k and v
	// [new][KVHeads][HeadDim] in the step's order, o and lse
	// ([seqs][QHeads]; lse may be the zero Tensor) written by the queued
	// work. It checks shapes and devices (refused: nothing changed, the
	// step open), queues the appends and the fused step on the device
	// and returns how many of the new tokens it appended (in order; all
	// of them unless it failed); EndStep waits for the queued work and
	// reports its failure.
	LayerTensor(ctx context.Context, step uint64, layer int, q, k, v, o, lse decode.Tensor) (appended int, err error)
	// PrefillTensor appends a prompt chunk (k, v [n][KVHeads][HeadDim])
	// to one layer of sequence seq, which must hold start tokens there,
	// and queues the chunk's causal attention over all of the sequence:
	// o [n][QHeads][HeadDim] from q, every tensor on TensorDevice
	// (shard.Shard.PrefillTensor). Outside steps only. Refused: nothing
	// changed; an error wrapping ErrChanged: the chunk may be in the
	// layer (break the sequence).
	PrefillTensor(ctx context.Context, seq uint64, layer, start int, q, k, v, o decode.Tensor) error
	// AppendTensor appends tokens (k, v [n][KVHeads][HeadDim], on
	// TensorDevice) to one layer of sequence seq, which must hold start
	// tokens there, queued on the device: PrefillTensor without the
	// attention (K/V made on the device, e.g. a benchmark's random
	// context). Outside steps only; errors as PrefillTensor's.
	AppendTensor(ctx context.Context, seq uint64, layer, start int, k, v decode.Tensor) error
}

var _ TensorWorker = (*Local)(nil)

// TensorDevice implements TensorWorker: one rank (CP 1, TP 1), quest
// selection, no replicated mirror, and a shard that takes device tensors
// (shard.Shard.TensorDevice).
func (l *Local) TensorDevice() (decode.Device, bool) {
	l.lock()
	defer l.unlock()
	return l.tensorDevice()
}

func (l *Local) tensorDevice() (decode.Device, bool) {
	if l.closed || len(l.ranks) != 1 || l.cfg.CP != 1 || l.cfg.TP != 1 || l.ranks[0].mirror != nil || l.cfg.Policy.Selector != plan.Quest {
		return decode.Device{}, false
	}
	return l.ranks[0].sh.TensorDevice()
}

// CheckTensor implements TensorWorker.
func (l *Local) CheckTensor(what string, t decode.Tensor, n int) error {
	l.lock()
	defer l.unlock()
	if _, ok := l.tensorDevice(); !ok {
		return fmt.Errorf("%w: this worker takes host tensors only", decode.ErrDeviceTensor)
	}
	return l.ranks[0].sh.CheckTensor(what, t, n)
}

// LayerTensor implements TensorWorker.
func (l *Local) LayerTensor(ctx context.Context, step uint64, layer int, q, k, v, o, lse decode.Tensor) (int, error) {
	l.lock()
	defer l.unlock()
	if l.closed {
		return 0, ErrClosed
	}
	if err := l.checkTensorLayer(step, layer, q, k, v, o, lse); err != nil {
		return 0, fmt.Errorf("layer %d of step %d: %w", layer, step, err)
	}
	st, c, rk := l.step, l.cfg, l.ranks[0]
	st.next = layer + 1
	st.ran = append(st.ran, layer)
	st.queued = true
	fail := func(err error) error {
		st.failed = true
		return fmt.Errorf("layer %d of step %d: rank %v: %w", layer, step, rk.id, err)
	}
	tok := c.KVHeads * c.HeadDim
	for j, si := range st.fresh {
		if err := rk.sh.AppendTensor(st.sq[si].local[0], layer, k.Slice(j*tok, tok), v.Slice(j*tok, tok)); err != nil {
			return j, fail(fmt.Errorf("new token of sequence %d: %w", st.ids[si], err))
		}
	}
	appended := len(st.fresh)
	w := &rk.w
	w.parts = w.parts[:0]
	for si, sq := range st.sq {
		w.parts = append(w.parts, shard.SeqPart{Seq: sq.local[0], Place: sq.layout.Place(0), Plan: st.plans[si]})
	}
	if err := rk.sh.BeginTensor(&w.ls, layer, w.parts); err != nil {
		return appended, fail(err)
	}
	done, err := rk.sh.FusedStepTensor(ctx, &w.ls, q, o, lse)
	switch {
	case err != nil:
		return appended, fail(err)
	case !done:
		return appended, fail(fmt.Errorf("%w: the step cannot run fused on the device", decode.ErrDeviceTensor))
	}
	return appended, nil
}

// checkTensorLayer validates a LayerTensor call against the open step
// and computes the layer's plans (st.plans); it changes nothing else.
func (l *Local) checkTensorLayer(step uint64, layer int, q, k, v, o, lse decode.Tensor) error {
	c, st := l.cfg, l.step
	_, ok := l.tensorDevice()
	switch {
	case !ok:
		return fmt.Errorf("%w: this worker takes host tensors only", decode.ErrDeviceTensor)
	case st == nil:
		return fmt.Errorf("%w: no open step", ErrStep)
	case step != st.id:
		return fmt.Errorf("%w: step %d is open", ErrStep, st.id)
	case st.failed:
		return fmt.Errorf("%w: the step failed; end it", ErrStep)
	case st.phased:
		return fmt.Errorf("%w: %w: a phased step or diagnostics run on host tensors", ErrBadMessage, decode.ErrDeviceTensor)
	case c.Policy.ReuseOn():
		return fmt.Errorf("%w: %w: selection reuse (policy reuse steps %d) runs on host tensors only", ErrBadMessage, decode.ErrDeviceTensor, c.Policy.ReuseSteps)
	case c.Policy.ReuseLayersOn():
		return fmt.Errorf("%w: %w: selection reuse across layers (policy reuse layers %v) runs on host tensors only", ErrBadMessage, decode.ErrDeviceTensor, c.Policy.ReuseLayers)
	}
	if err := l.checkLayer(layer); err != nil {
		return err
	}
	if layer < st.next {
		return fmt.Errorf("%w: layers must increase (next %d)", ErrStep, st.next)
	}
	for ti, t := range [...]struct {
		name string
		t    decode.Tensor
		n    int
	}{
		{"q", q, len(st.seqs) * c.QHeads * c.HeadDim},
		{"k", k, len(st.fresh) * c.KVHeads * c.HeadDim},
		{"v", v, len(st.fresh) * c.KVHeads * c.HeadDim},
		{"o", o, len(st.seqs) * c.QHeads * c.HeadDim},
		{"lse", lse, len(st.seqs) * c.QHeads},
	} {
		if t.t.Zero() && (t.n == 0 || t.name == "lse") {
			continue // no new tokens: k and v may be empty; lse not wanted
		}
		if c := st.checked[ti]; !c.OnHost() && c.Device == t.t.Device && c.Ptr == t.t.Ptr && c.Len == t.t.Len && c.Len == t.n && c.Stream == t.t.Stream && t.t.Data == nil {
			continue // the shard took this view at an earlier layer of the step
		}
		if err := l.ranks[0].sh.CheckTensor(t.name, t.t, t.n); err != nil {
			return fmt.Errorf("%w: %w", ErrBadMessage, err)
		}
		st.checked[ti] = t.t
	}
	if layer != st.first {
		for si, s := range st.seqs {
			if err := l.checkLen(0, s.Seq, st.sq[si], layer, s.Len); err != nil {
				return err
			}
		}
	}
	st.plans = st.plans[:0]
	for _, s := range st.seqs {
		pl, err := l.plan(layer, s, st.dense)
		if err != nil {
			return err
		}
		st.plans = append(st.plans, pl)
	}
	return nil
}

// syncTensors waits for the work LayerTensor queued in the open step
// (l.mu held).
func (l *Local) syncTensors(ctx context.Context) error {
	if !l.step.queued {
		return nil
	}
	l.step.queued = false
	if err := l.ranks[0].sh.Sync(ctx); err != nil {
		return fmt.Errorf("step %d: rank %v: %w", l.step.id, l.ranks[0].id, err)
	}
	return nil
}

// PrefillTensor implements TensorWorker.
func (l *Local) PrefillTensor(ctx context.Context, seq uint64, layer, start int, q, k, v, o decode.Tensor) error {
	return l.tensorChunk(ctx, "prefill", seq, layer, start, func(sh *shard.Shard, id pagestore.SeqID) error {
		return sh.PrefillTensor(ctx, id, layer, q, k, v, o)
	})
}

// AppendTensor implements TensorWorker.
func (l *Local) AppendTensor(ctx context.Context, seq uint64, layer, start int, k, v decode.Tensor) error {
	return l.tensorChunk(ctx, "append", seq, layer, start, func(sh *shard.Shard, id pagestore.SeqID) error {
		return sh.AppendTensor(id, layer, k, v)
	})
}

// tensorChunk checks a chunk of device tokens for layer of seq (which
// must hold start tokens there) and runs it on the one rank's shard.
func (l *Local) tensorChunk(ctx context.Context, op string, seq uint64, layer, start int, run func(*shard.Shard, pagestore.SeqID) error) error {
	l.lock()
	defer l.unlock()
	if l.closed {
		return ErrClosed
	}
	if _, ok := l.tensorDevice(); !ok {
		return fmt.Errorf("%s: %w: this worker takes host tensors only", op, decode.ErrDeviceTensor)
	}
	sq, err := l.mutable(seq)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := l.checkLayer(layer); err != nil {
		return fmt.Errorf("%s sequence %d: %w", op, seq, err)
	}
	if err := l.checkLen(0, seq, sq, layer, start); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	rk := l.ranks[0]
	if err := run(rk.sh, sq.local[0]); err != nil {
		if changedBy(err) {
			err = fmt.Errorf("%w: %w", ErrChanged, err)
		}
		return fmt.Errorf("%s sequence %d layer %d on rank %v: %w", op, seq, layer, rk.id, err)
	}
	return nil
}
