//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
)

// Device tensors (kernels.TensorStepper): a caller's q, k, v and outputs
// in the backend's device memory, read and written in place by the
// backend's kernels. Every call of the backend runs on its context's
// default stream, in order, so a tensor must be ordered on it (Stream 0)
// and allocated in the backend's context (AllocTensor; an executor that
// computes q, k and v launches its kernels through the same backend).

var _ kernels.TensorStepper = (*Backend)(nil)

// Device implements kernels.TensorStepper.
func (b *Backend) Device() decode.Device {
	return decode.Device{Kind: decode.CUDA, Ordinal: b.cfg.Device}
}

// CheckTensor implements kernels.TensorStepper.
func (b *Backend) CheckTensor(what string, t decode.Tensor, n int) error {
	return b.checkTensor(what, t, n)
}

// checkTensor checks that t is a view of n floats on the backend's
// device and stream.
func (b *Backend) checkTensor(what string, t decode.Tensor, n int) error {
	switch {
	case t.Device != b.Device():
		return fmt.Errorf("cuda: %w: %s is on %v, the backend on %v", decode.ErrDeviceTensor, what, t.Device, b.Device())
	case t.Stream != 0:
		return fmt.Errorf("cuda: %w: %s is ordered on stream %#x; the backend takes tensors on its own stream (0)", decode.ErrDeviceTensor, what, t.Stream)
	case t.Len != n:
		return fmt.Errorf("cuda: %s has %d floats, want %d", what, t.Len, n)
	case t.Ptr == 0 || t.Ptr%4 != 0:
		return fmt.Errorf("cuda: %w: %s at %#x is not a float32 array", decode.ErrDeviceTensor, what, t.Ptr)
	}
	return nil
}

// AllocTensor returns a device tensor of n zeros in the backend's
// context. It lives until the backend is closed.
func (b *Backend) AllocTensor(n int) (decode.Tensor, error) {
	if n <= 0 {
		return decode.Tensor{}, fmt.Errorf("cuda: alloc tensor of %d floats", n)
	}
	var p cu.DevicePtr
	err := b.do(context.Background(), func() error {
		var err error
		if p, err = cu.MemAlloc(int64(n) * 4); err != nil {
			return fmt.Errorf("cuda: alloc tensor of %d floats: %w", n, err)
		}
		return cu.MemsetD32(p, 0, int64(n))
	})
	if err != nil {
		return decode.Tensor{}, err
	}
	return decode.OnDevice(b.Device(), uintptr(p), n, 0), nil
}

// FreeTensor frees a tensor AllocTensor returned (not a view into one).
func (b *Backend) FreeTensor(t decode.Tensor) error {
	if err := b.checkTensor("free", t, t.Len); err != nil {
		return err
	}
	return b.do(context.Background(), func() error { return cu.MemFree(cu.DevicePtr(t.Ptr)) })
}

// UploadTensor copies src into device tensor t, after the work queued so
// far.
func (b *Backend) UploadTensor(t decode.Tensor, src []float32) error {
	if err := b.checkTensor("upload", t, len(src)); err != nil {
		return err
	}
	return b.do(context.Background(), func() error {
		return cu.MemcpyHtoD(cu.DevicePtr(t.Ptr), unsafe.Pointer(&src[0]), int64(len(src))*4)
	})
}

// DownloadTensor waits for the queued work and returns a copy of device
// tensor t.
func (b *Backend) DownloadTensor(ctx context.Context, t decode.Tensor) ([]float32, error) {
	if err := b.checkTensor("download", t, t.Len); err != nil {
		return nil, err
	}
	if err := b.Sync(ctx); err != nil {
		return nil, err
	}
	out := make([]float32, t.Len)
	err := b.do(ctx, func() error {
		return cu.MemcpyDtoH(unsafe.Pointer(&out[0]), cu.DevicePtr(t.Ptr), int64(len(out))*4)
	})
	return out, err
}

// StepTensor implements kernels.TensorStepper: StepQueued's device work
// with the query read from q and the attention writing o and lse (or a
// scratch lse when lse is the zero Tensor) in place.
func (b *Backend) StepTensor(ctx context.Context, s kernels.Shape, l kernels.Layer, bt *kernels.Batch, q decode.Tensor, plan *kernels.TopKPlan, lists *kernels.Lists, o, lse decode.Tensor) error {
	n := bt.Len()
	nq, nlse := n*s.QHeads*s.HeadDim, n*s.QHeads
	if err := b.checkTensor("q", q, nq); err != nil {
		return err
	}
	if err := b.checkTensor("o", o, nq); err != nil {
		return err
	}
	if !lse.Zero() {
		if err := b.checkTensor("lse", lse, nlse); err != nil {
			return err
		}
	}
	b.stepMu.Lock()
	defer b.stepMu.Unlock()
	b.probe.enter()
	if err := b.checkAttendLens(s, l, bt, nq, lists, nq, nlse); err != nil {
		return fmt.Errorf("step: %w", err)
	}
	if err := b.stepCheck.Check(bt, s.Rows(lists.Mode), plan, lists); err != nil {
		return err
	}
	return b.do(ctx, func() error {
		dev := &tensorArgs{q: cu.DevicePtr(q.Ptr), o: cu.DevicePtr(o.Ptr), lse: cu.DevicePtr(lse.Ptr)}
		if lse.Zero() {
			p, err := b.buf("step.lse", int64(nlse)*4)
			if err != nil {
				return err
			}
			dev.lse = p
		}
		return b.stepDevice(true, s, l, bt, nil, plan, lists, nil, nil, dev)
	})
}

// WriteTokensTensor implements kernels.TensorStepper with the append
// kernel reading k and v in place.
func (b *Backend) WriteTokensTensor(ctx context.Context, pool any, pages []int32, slot int, k, v decode.Tensor) error {
	l, err := devicePool(pool)
	if err != nil {
		return err
	}
	if err := l.checkTokenLens("cuda write tokens", len(pages), slot, k.Len, v.Len); err != nil {
		return err
	}
	if err := b.checkTensor("k", k, k.Len); err != nil {
		return err
	}
	if err := b.checkTensor("v", v, v.Len); err != nil {
		return err
	}
	if l.Slots > 0 {
		return errSlotPool
	}
	if err := l.checkPages(pages...); err != nil {
		return err
	}
	return b.do(ctx, func() error {
		return b.appendFrom(l, pages, slot, k.Len/(l.KVHeads*l.HeadDim), cu.DevicePtr(k.Ptr), cu.DevicePtr(v.Ptr))
	})
}
