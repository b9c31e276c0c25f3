package engine

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/worker"
)

// Device tensors (decode.Tensor): an engine whose one worker is a
// worker.TensorWorker on the tensors' device (an in-process grid of one
// rank, CP 1 x TP 1, its pages on that device) runs a layer with q, k, v
// and the output in place: the worker queues the appends and the fused
// step on the device and Layer returns; End waits for the queued work,
// one host synchronisation per step. Any other engine refuses device
// tensors with decode.ErrDeviceTensor (its caller copies to the host).

// tensorWorker returns the worker that takes the engine's device tensors
// on dev, or an error wrapping decode.ErrDeviceTensor.
func (e *Engine) tensorWorker(dev decode.Device) (worker.TensorWorker, error) {
	if len(e.workers) != 1 {
		return nil, fmt.Errorf("%w: device tensors need a grid of one in-process worker; this one has %d workers", decode.ErrDeviceTensor, len(e.workers))
	}
	tw, ok := e.workers[0].(worker.TensorWorker)
	if !ok {
		return nil, fmt.Errorf("%w: the worker (%T) takes host tensors only", decode.ErrDeviceTensor, e.workers[0])
	}
	got, ok := tw.TensorDevice()
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: the worker takes host tensors only (device tensors need CP 1 x TP 1, quest selection, the pages on the device, no offload)", decode.ErrDeviceTensor)
	case got != dev:
		return nil, fmt.Errorf("%w: the tensors are on %v, the pages on %v", decode.ErrDeviceTensor, dev, got)
	}
	return tw, nil
}

// onDevice reports whether a layer's tensors are on a device.
func onDevice(q, k, v decode.Tensor, res *decode.Result) bool {
	return !q.OnHost() || !k.OnHost() || !v.OnHost() || !res.O.OnHost()
}

// layerTensor is Layer with device tensors (st checked the layer's order).
func (st *stepState) layerTensor(ctx context.Context, layer int, q, k, v decode.Tensor, res *decode.Result) error {
	e, c := st.e, st.e.cfg
	n := len(st.reqs)
	dev := q.Device
	if st.opt.Phased {
		return fmt.Errorf("layer %d: %w: a phased step runs on host tensors", layer, decode.ErrDeviceTensor)
	}
	tw := st.tw
	if tw == nil || dev != st.twDev {
		var err error
		if tw, err = e.tensorWorker(dev); err != nil {
			return fmt.Errorf("layer %d: %w", layer, err)
		}
		st.tw, st.twDev = tw, dev
	}
	for ti, t := range [...]struct {
		name string
		t    decode.Tensor
		n    int
	}{
		{"q", q, n * c.QRow()}, {"k", k, st.nNew * c.KVRow()}, {"v", v, st.nNew * c.KVRow()}, {"output", res.O, n * c.QRow()},
	} {
		switch {
		case t.t.Zero() && t.n == 0:
		case t.t.Zero():
			return fmt.Errorf("layer %d: %w: %s is empty, want %d floats", layer, ErrBadInput, t.name, t.n)
		case t.t.Device != dev:
			return fmt.Errorf("layer %d: %w: %s is on %v, q on %v", layer, decode.ErrDeviceTensor, t.name, t.t.Device, dev)
		case t.t.Len != t.n:
			return fmt.Errorf("layer %d: %w: %s has %d floats, want %d", layer, ErrBadInput, t.name, t.t.Len, t.n)
		case sameTensor(st.checked[ti], t.t):
			// Checked by an earlier layer of the step (the worker checks
			// it again before it queues anything).
		default:
			// The backend's own conditions (stream, address), before any
			// state changes.
			if err := tw.CheckTensor(t.name, t.t, t.n); err != nil {
				return fmt.Errorf("layer %d: %w", layer, err)
			}
			st.checked[ti] = t.t
		}
	}
	// The step reads q in more than one kernel and writes the output:
	// they must not overlap.
	if overlap(q, res.O) {
		return fmt.Errorf("layer %d: %w: the output overlaps q", layer, ErrBadInput)
	}
	if err := st.checkLens(layer); err != nil {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	plans, err := e.plans(layer, st.reqs, st.seqs, st.opt.ForceDense, res.Plans[:0])
	if err != nil {
		return fmt.Errorf("layer %d: %w", layer, err)
	}
	start := time.Now()
	ctx = st.deviceContext(ctx)
	st.next = layer + 1
	st.ran = append(st.ran, layer)
	st.device = true
	if st.queued == nil {
		st.queued = append(e.stepQueued[:0], make([]bool, n)...)
	}
	appended, err := tw.LayerTensor(ctx, st.id, layer, q, k, v, res.O, decode.Tensor{})
	// The worker appended the first `appended` new tokens (one rank: a
	// row's token is all there or not at all).
	j := 0
	for i, r := range st.reqs {
		if r.K == nil {
			continue
		}
		if j < appended {
			st.seqs[i].lens[layer]++
			st.queued[i] = true
		}
		j++
	}
	if err != nil {
		// The engine checked what the worker checks: a refusal there is
		// a failure too.
		st.err = fmt.Errorf("layer %d: %w", layer, err)
		return fmt.Errorf("%w: %w", decode.ErrStepFailed, st.err)
	}
	res.LSE = res.LSE[:0]
	res.Time = decode.Times{Total: time.Since(start)}
	res.Plans = plans
	return nil
}

// sameTensor reports whether a and b are the same device tensor view.
func sameTensor(a, b decode.Tensor) bool {
	return !a.OnHost() && a.Device == b.Device && a.Ptr == b.Ptr && a.Len == b.Len && a.Stream == b.Stream && b.Data == nil
}

// deviceContext returns the context of a device layer called with ctx:
// ctx bounded by StepTimeout from the step's first device layer (the
// timeout bounds the step; a device layer only queues work). One context
// serves every layer that passes the first one's ctx: no timer a layer.
func (st *stepState) deviceContext(ctx context.Context) context.Context {
	if st.dctx != nil && sameContext(ctx, st.dparent) {
		return st.dctx
	}
	if st.dcancel != nil {
		st.dcancel()
	}
	st.dparent = ctx
	st.dctx, st.dcancel = context.WithTimeout(ctx, st.e.cfg.StepTimeout)
	return st.dctx
}

// sameContext reports whether a and b are the same context value (false
// when either cannot be compared).
func sameContext(a, b context.Context) bool {
	if a == nil || b == nil || reflect.TypeOf(a) != reflect.TypeOf(b) || !reflect.TypeOf(a).Comparable() {
		return false
	}
	return a == b
}

// endTensor ends a step that queued work on a device: the worker's
// EndStep waits for it. A failure there means the device did not store
// what the step appended: the rows whose tokens were queued are marked
// broken (their pages hold what the device left).
func (st *stepState) endTensor(ctx context.Context) error {
	e := st.e
	// The queued work must be waited for whatever the caller's context
	// says (the step ends either way): its own bound, not the caller's.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(endTimeout, e.cfg.StepTimeout))
	defer cancel()
	m := worker.EndRequest{Step: st.id, Failed: st.err != nil}
	if m.Failed {
		m.Layers = st.ran
	}
	err := e.workers[0].EndStep(ctx, m)
	if err == nil {
		return nil
	}
	for i, q := range st.queued {
		if q {
			st.seqs[i].broken = true
		}
	}
	return fmt.Errorf("end step: %w: %w", decode.ErrStepFailed, err)
}

// overlap reports whether two device tensors of one device share memory.
func overlap(a, b decode.Tensor) bool {
	return a.Device == b.Device && a.Ptr < b.Ptr+uintptr(4*b.Len) && b.Ptr < a.Ptr+uintptr(4*a.Len)
}
