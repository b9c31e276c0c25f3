//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math/bits"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Prefill on the device (prefill.cu): the projections of many rows as a
// tensor-core GEMM (taken by gemv from gemmMinRows rows of bf16 weights
// on), and the causal attention of a prompt chunk over its sequence's
// pages (kernels.PrefillAttender).

// gemmMinRows is the fewest activation rows a bf16 projection runs as a
// GEMM instead of GEMV launches of 16 rows each (which stream the
// weights once per 16 rows).
const gemmMinRows = 64

var _ kernels.PrefillAttender = (*Backend)(nil)

func loadPrefillKernels(fn map[string]cu.Function) (cu.Module, error) {
	mod, err := cu.LoadData(PTXPrefill)
	if err != nil {
		return mod, fmt.Errorf("cuda: load prefill PTX: %w", err)
	}
	smem := map[string]int{}
	for _, g := range GemmKernels() {
		smem[g.name()] = g.smem()
	}
	for _, a := range AttendKernels() {
		smem[a.name()] = a.smem()
	}
	for _, n := range prefillKernelNames() {
		f, err := mod.Function(n)
		if err != nil {
			mod.Unload()
			return mod, fmt.Errorf("cuda: kernel %s: %w", n, err)
		}
		if smem[n] > 0 {
			if err := setMaxDynamicSmem(f, smem[n]); err != nil {
				mod.Unload()
				return mod, fmt.Errorf("cuda: kernel %s: %w", n, err)
			}
		}
		fn[n] = f
	}
	return mod, nil
}

// gemm queues ys = x w^T (+ res) for rows rows of bf16 weights (k a
// multiple of 8, x 16-byte aligned; checked by gemv), x normalised first
// when nm is on: x (normalised) goes to bf16 in a scratch buffer, then
// cuBLAS (one GEMM per output) or the variant g. Device goroutine only.
func (b *Backend) gemm(g GemmKernel, w kernels.Matrix, x, res decode.Tensor, nm gemvNormArgs, rows int, yp [3]uint64, widths [3]int) error {
	a, err := b.buf("gemm.a", int64(rows)*int64(w.Cols)*2)
	if err != nil {
		return err
	}
	norm := uint64(0)
	if nm.on {
		norm = mptr(nm.w)
	}
	if err := b.launch("prefill_tobf16_bf16", [3]int{rows, 1, 1}, 256, 0, u(a), uint64(x.Ptr), norm, uint64(w.Cols), f32bits(nm.eps)); err != nil {
		return err
	}
	if blas := b.cublas(); blas != nil {
		acc := false
		if !res.Zero() {
			// One output (gemv checked): y += res in place, or res copied
			// to y first.
			if uint64(res.Ptr) != yp[0] {
				if err := cu.MemcpyDtoDAsync(cu.DevicePtr(yp[0]), cu.DevicePtr(res.Ptr), int64(rows)*int64(w.Rows)*4, cu.Stream{}); err != nil {
					return fmt.Errorf("cuda: gemm residual: %w", err)
				}
			}
			acc = true
		}
		off := 0
		for i, wd := range widths {
			if wd == 0 {
				continue
			}
			if err := blas.gemm(rows, wd, w.Cols, mptr(w)+uint64(off*w.Cols*2), u(a), yp[i], wd, acc); err != nil {
				return err
			}
			off += wd
		}
		return nil
	}
	return b.launch(g.name(), [3]int{(rows + g.BM - 1) / g.BM, (w.Rows + g.BN - 1) / g.BN, 1}, g.threads(), g.smem(),
		yp[0], yp[1], yp[2], uint64(res.Ptr), u(a), mptr(w),
		uint64(rows), uint64(w.Rows), uint64(w.Cols), uint64(widths[0]), uint64(widths[1]))
}

// cublas returns the backend's cuBLAS handle, opened on first use, or
// nil: Config.OwnGemm, or cuBLAS not found (GemmEngine says why).
// Device goroutine only.
func (b *Backend) cublas() *cublas {
	if b.cfg.OwnGemm {
		return nil
	}
	if !b.blasTried {
		b.blasTried = true
		b.blas, b.blasErr = openCublas()
	}
	return b.blas
}

// GemmEngine names what runs the projections of prompt chunks: "cublas
// PATH", or "own VARIANT" with the reason cuBLAS is not used (nil with
// Config.OwnGemm).
func (b *Backend) GemmEngine(ctx context.Context) (string, error) {
	var name string
	var why error
	err := b.do(ctx, func() error {
		if blas := b.cublas(); blas != nil {
			name = "cublas " + blas.path
			return nil
		}
		name, why = "own "+b.gemmKernel.String(), b.blasErr
		return nil
	})
	if err != nil {
		return "", err
	}
	return name, why
}

// SetGemm makes g the GEMM variant of projections of many rows (default
// defaultGemm); set it before the first model kernel is queued.
func (b *Backend) SetGemm(g GemmKernel) { b.gemmKernel = g }

// PrefillTensor implements kernels.PrefillAttender for pools of bf16,
// f16 or fp8 pages (fp8 records decoded as the CPU store decodes them,
// then rounded to bf16 for the tensor cores) and head dimensions 32, 64
// and 128, with at most 64 query heads per KV head.
func (b *Backend) PrefillTensor(ctx context.Context, s kernels.Shape, pool, set any, seq uint64, start, n int, q, o decode.Tensor) error {
	return b.PrefillWith(ctx, AttendKernel{}, s, pool, set, seq, start, n, q, o)
}

// PrefillWith is PrefillTensor through variant a (the zero AttendKernel:
// the default for the pool's type and head dimension), for benchmarks
// and tests of the variants.
func (b *Backend) PrefillWith(ctx context.Context, a AttendKernel, s kernels.Shape, pool, set any, seq uint64, start, n int, q, o decode.Tensor) error {
	l, err := devicePool(pool)
	if err != nil {
		return err
	}
	ts, err := tableSet(set)
	if err != nil {
		return err
	}
	if err := s.Validate(); err != nil {
		return fmt.Errorf("cuda prefill: %w", err)
	}
	d, g := s.HeadDim, s.Group()
	if a == (AttendKernel{}) {
		a = defaultAttend(l.DType, d)
		for _, v := range AttendKernels() {
			if v.name() == b.cfg.PrefillKernel && v.DType == l.DType && v.D == d {
				a = v
			}
		}
	}
	name := a.name()
	switch {
	case l.Slots > 0:
		return fmt.Errorf("cuda prefill: %w", errSlotPool)
	case l.DType != plan.BFloat16 && l.DType != plan.Float16 && l.DType != plan.FP8:
		return fmt.Errorf("cuda prefill: pages of %v (the prefill attention reads bf16, f16 or fp8)", l.DType)
	case l.KVHeads != s.KVHeads || l.HeadDim != d || l.PageSize != s.PageSize:
		return fmt.Errorf("cuda prefill: shape %+v for a pool of %d KV heads x %d, pages of %d", s, l.KVHeads, l.HeadDim, l.PageSize)
	case !compiled(b.fn, name):
		return fmt.Errorf("cuda prefill: head dimension %d (compiled for %v)", d, prefillHeadDims)
	case g > a.rows():
		return fmt.Errorf("cuda prefill: %d query heads per KV head (at most %d)", g, a.rows())
	case start < 0 || n <= 0:
		return fmt.Errorf("cuda prefill: %d tokens at position %d", n, start)
	}
	width := s.QHeads * d
	if err := b.checkTensor("prefill q", q, n*width); err != nil {
		return err
	}
	if err := b.checkTensor("prefill o", o, n*width); err != nil {
		return err
	}
	if q.Ptr%16 != 0 {
		return fmt.Errorf("cuda prefill: %w: q at %#x is not 16-byte aligned", decode.ErrDeviceTensor, q.Ptr)
	}
	if q.Ptr < o.Ptr+uintptr(4*o.Len) && o.Ptr < q.Ptr+uintptr(4*q.Len) {
		return fmt.Errorf("cuda prefill: the output overlaps q")
	}
	need := (start + n + s.PageSize - 1) / s.PageSize
	tok := a.rows() / g
	shift := -1
	if s.PageSize&(s.PageSize-1) == 0 {
		shift = bits.TrailingZeros(uint(s.PageSize))
	}
	return b.do(ctx, func() error {
		t, ok := ts.m[seq]
		switch {
		case ts.freed:
			return fmt.Errorf("cuda prefill: the table set is freed")
		case !ok || t.n < need:
			have := 0
			if ok {
				have = t.n
			}
			return fmt.Errorf("cuda prefill: sequence %d's table holds %d pages, %d tokens at position %d need %d", seq, have, n, start, need)
		}
		return b.launch(name, [3]int{(n + tok - 1) / tok, s.KVHeads, 1}, 32*a.W, a.smem(),
			uint64(o.Ptr), uint64(q.Ptr), u(l.K), u(l.V), u(l.KScale), u(l.VScale), u(t.ptr),
			uint64(start), uint64(n), uint64(s.QHeads), uint64(s.KVHeads), uint64(s.PageSize), uint64(int64(shift)))
	})
}

func compiled(fn map[string]cu.Function, name string) bool {
	_, ok := fn[name]
	return ok
}
