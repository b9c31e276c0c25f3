//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math/bits"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// Model kernels (model.cu) for the device executor (model/gpu): weight
// matrices in device memory and the decoder's operations on float32
// activations held in device tensors of the backend (AllocTensor). Each
// call queues its kernel on the backend's stream and returns; Argmax
// waits (it is the executor's one host synchronisation per token).

func loadModelKernels(fn map[string]cu.Function) (cu.Module, error) {
	mod, err := cu.LoadData(PTXModel)
	if err != nil {
		return mod, fmt.Errorf("cuda: load model PTX: %w", err)
	}
	for _, n := range modelKernelNames() {
		f, err := mod.Function(n)
		if err != nil {
			mod.Unload()
			return mod, fmt.Errorf("cuda: kernel %s: %w", n, err)
		}
		fn[n] = f
	}
	return mod, nil
}

// SetModelPDL launches the model kernels as programmatic dependents of
// the kernel before them (sm_90: a kernel's blocks start while the
// previous one drains; the GEMVs prefetch their first weights meanwhile).
// Off by default; set it before the first model kernel is queued.
func (b *Backend) SetModelPDL(on bool) { b.modelPDL = on }

func weightName(dt plan.DType) (string, error) {
	switch dt {
	case plan.Float32:
		return "f32", nil
	case plan.BFloat16:
		return "bf16", nil
	}
	return "", fmt.Errorf("cuda: weights as %v: the model kernels take float32 or bf16", dt)
}

var _ kernels.ModelDevice = (*Backend)(nil)

// UploadMatrix copies w ([rows][cols] float32) to the device as dt.
func (b *Backend) UploadMatrix(ctx context.Context, w []float32, rows, cols int, dt plan.DType) (kernels.Matrix, error) {
	if _, err := weightName(dt); err != nil {
		return kernels.Matrix{}, err
	}
	if rows <= 0 || cols <= 0 || len(w) != rows*cols {
		return kernels.Matrix{}, fmt.Errorf("cuda: upload matrix: %d floats for %d x %d", len(w), rows, cols)
	}
	return b.newMatrix(ctx, rows, cols, dt, func(p cu.DevicePtr) error { return b.convert(p, dt, w) })
}

// newMatrix allocates a rows x cols matrix of dt and fills it with fill
// (device goroutine), freeing it when fill fails.
func (b *Backend) newMatrix(ctx context.Context, rows, cols int, dt plan.DType, fill func(cu.DevicePtr) error) (kernels.Matrix, error) {
	m := kernels.Matrix{Rows: rows, Cols: cols, DType: dt}
	err := b.do(ctx, func() error {
		p, err := cu.MemAlloc(m.Bytes())
		if err != nil {
			return fmt.Errorf("cuda: alloc a %d x %d matrix (%d bytes): %w", rows, cols, m.Bytes(), err)
		}
		if err := fill(p); err != nil {
			cu.MemFree(p)
			return err
		}
		m.Ptr = uintptr(p)
		return nil
	})
	if err != nil {
		return kernels.Matrix{}, err
	}
	return m, nil
}

// MemInfo implements kernels.ModelDevice (cuMemGetInfo).
func (b *Backend) MemInfo(ctx context.Context) (free, total int64, err error) {
	err = b.do(ctx, func() error {
		var err error
		free, total, err = cu.MemInfo()
		return err
	})
	return free, total, err
}

// FreeMatrix frees m's device memory (the zero Matrix: nothing).
func (b *Backend) FreeMatrix(ctx context.Context, m kernels.Matrix) error {
	if m.Ptr == 0 {
		return nil
	}
	return b.do(context.WithoutCancel(ctx), func() error { return cu.MemFree(cu.DevicePtr(m.Ptr)) })
}

// mptr is m's device address as a kernel parameter.
func mptr(m kernels.Matrix) uint64 { return uint64(m.Ptr) }

// rowsOf checks that t is a device tensor of the backend holding rows x
// width floats.
func (b *Backend) rowsOf(what string, t decode.Tensor, rows, width int) error {
	return b.checkTensor(what, t, rows*width)
}

// Embed writes the rows of table ([vocab][H]) that ids name into out
// ([len(ids)][H]).
func (b *Backend) Embed(ctx context.Context, out decode.Tensor, table kernels.Matrix, ids []int32) error {
	name, err := weightName(table.DType)
	if err != nil {
		return err
	}
	if err := b.rowsOf("embed out", out, len(ids), table.Cols); err != nil {
		return err
	}
	for i, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			return fmt.Errorf("cuda: embed: token %d at row %d outside the vocabulary of %d", id, i, table.Rows)
		}
	}
	return b.do(ctx, func() error {
		p, err := upload(b, "model.ids", ids)
		if err != nil {
			return err
		}
		return b.launch("model_embed_"+name, [3]int{len(ids), 1, 1}, 256, 0, uint64(out.Ptr), mptr(table), u(p), uint64(table.Cols))
	})
}

// RMSNorm writes x ([rows][H]) normalised and scaled by w (1 x H) into
// out (which may be x).
func (b *Backend) RMSNorm(ctx context.Context, out, x decode.Tensor, w kernels.Matrix, rows int, eps float32) error {
	name, err := weightName(w.DType)
	if err != nil {
		return err
	}
	h := w.Rows * w.Cols
	if err := b.rowsOf("rmsnorm out", out, rows, h); err != nil {
		return err
	}
	if err := b.rowsOf("rmsnorm x", x, rows, h); err != nil {
		return err
	}
	return b.do(ctx, func() error {
		return b.launchMode(b.modelPDL, "model_rmsnorm_"+name, [3]int{rows, 1, 1}, 256, 0, uint64(out.Ptr), uint64(x.Ptr), mptr(w), uint64(h), f32bits(eps))
	})
}

// Gemv writes y = x w^T (+ res) for rows rows: x [rows][w.Cols], y and
// res [rows][w.Rows]; res may be the zero Tensor, or y itself (a
// residual add in place).
func (b *Backend) Gemv(ctx context.Context, y decode.Tensor, w kernels.Matrix, x, res decode.Tensor, rows int) error {
	return b.gemv(ctx, GemvKernel{}, w, x, res, gemvNormArgs{}, rows, y)
}

// GemvNorm is GemvSplit of x normalised as RMSNorm does (weights norm,
// 1 x w.Cols of w's type, and eps), in one launch: the norm is fused into
// the GEMV, and the normalised x is never stored.
func (b *Backend) GemvNorm(ctx context.Context, w kernels.Matrix, x decode.Tensor, norm kernels.Matrix, eps float32, rows int, ys ...decode.Tensor) error {
	if norm.DType != w.DType || norm.Rows*norm.Cols != w.Cols {
		return fmt.Errorf("cuda: gemv norm: weights %dx%d %v for a %dx%d %v matrix (%d of its type)", norm.Rows, norm.Cols, norm.DType, w.Rows, w.Cols, w.DType, w.Cols)
	}
	return b.gemv(ctx, GemvKernel{}, w, x, decode.Tensor{}, gemvNormArgs{w: norm, eps: eps, on: true}, rows, ys...)
}

// gemvNormArgs is the RMSNorm a GEMV launch fuses (on), or none.
type gemvNormArgs struct {
	w   kernels.Matrix
	eps float32
	on  bool
}

// GemvSplit writes x w^T for rows rows into ys: ys[0] takes the first
// ys[0].Len/rows outputs of every row, ys[1] the next, and so on (one
// launch over a fused q|k|v or gate|up matrix writes the separate
// activations). At most three outputs, whose widths add up to w.Rows.
func (b *Backend) GemvSplit(ctx context.Context, w kernels.Matrix, x decode.Tensor, rows int, ys ...decode.Tensor) error {
	return b.gemv(ctx, GemvKernel{}, w, x, decode.Tensor{}, gemvNormArgs{}, rows, ys...)
}

// GemvWith is GemvSplit through the variant v (rows at most v.Rows; v's
// weights type must be w's), for benchmarks and tests of the variants.
func (b *Backend) GemvWith(ctx context.Context, v GemvKernel, w kernels.Matrix, x, res decode.Tensor, rows int, ys ...decode.Tensor) error {
	if v.Rows == 0 {
		return fmt.Errorf("cuda: gemv: no variant given")
	}
	return b.gemv(ctx, v, w, x, res, gemvNormArgs{}, rows, ys...)
}

// gemv launches v (the default variant per 16 rows when v is zero; its
// _norm twin when nm is on).
func (b *Backend) gemv(ctx context.Context, v GemvKernel, w kernels.Matrix, x, res decode.Tensor, nm gemvNormArgs, rows int, ys ...decode.Tensor) error {
	name, err := weightName(w.DType)
	if err != nil {
		return err
	}
	if len(ys) == 0 || len(ys) > 3 || rows <= 0 {
		return fmt.Errorf("cuda: gemv: %d outputs for %d rows (1 to 3 outputs, rows > 0)", len(ys), rows)
	}
	if v.Rows != 0 && (v.Weights != name || rows > v.Rows || v.Norm != nm.on) {
		return fmt.Errorf("cuda: gemv: variant %v for %d rows of %s weights", v, rows, name)
	}
	var widths [3]int
	total := 0
	for i, y := range ys {
		if y.Len%rows != 0 {
			return fmt.Errorf("cuda: gemv: output %d holds %d floats, not a multiple of %d rows", i, y.Len, rows)
		}
		widths[i] = y.Len / rows
		if err := b.rowsOf(fmt.Sprintf("gemv y%d", i), y, rows, widths[i]); err != nil {
			return err
		}
		total += widths[i]
	}
	if total != w.Rows {
		return fmt.Errorf("cuda: gemv: outputs %v wide, the matrix has %d rows", widths[:len(ys)], w.Rows)
	}
	if err := b.rowsOf("gemv x", x, rows, w.Cols); err != nil {
		return err
	}
	if !res.Zero() {
		if len(ys) != 1 {
			return fmt.Errorf("cuda: gemv: a residual with %d outputs (one only)", len(ys))
		}
		if err := b.rowsOf("gemv res", res, rows, w.Rows); err != nil {
			return err
		}
	}
	var yp [3]uint64
	for i, y := range ys {
		yp[i] = uint64(y.Ptr)
	}
	// Vector loads need 16-byte aligned rows of weights and x.
	k8 := w.Cols%8 == 0 && x.Ptr%16 == 0
	if v.Tensor && !k8 {
		return fmt.Errorf("cuda: gemv: %v needs k a multiple of 8 and aligned rows (k %d)", v, w.Cols)
	}
	const warps = 8
	if v.Rows == 0 && name == "bf16" && k8 && rows >= gemmMinRows {
		return b.do(ctx, func() error { return b.gemm(b.gemmKernel, w, x, res, nm, rows, yp, widths) })
	}
	return b.do(ctx, func() error {
		for r0 := 0; r0 < rows; {
			kv := v
			if kv.Rows == 0 {
				kv = gemvDefault(name, min(gemvRows, rows-r0), k8)
				kv.Norm = nm.on
			}
			n := min(kv.Rows, rows-r0)
			off := func(p uint64, width int) uint64 {
				if p == 0 {
					return 0
				}
				return p + uint64(r0*width*4)
			}
			per := warps * kv.Tile // outputs a block
			if kv.Tensor {
				per = 16 * kv.Tile
			}
			if err := b.launchMode(b.modelPDL, kv.name(), [3]int{(w.Rows + per - 1) / per, 1, 1}, 32*warps, 0,
				off(yp[0], widths[0]), off(yp[1], widths[1]), off(yp[2], widths[2]), off(uint64(res.Ptr), w.Rows),
				mptr(w), uint64(x.Ptr)+uint64(r0*w.Cols*4),
				uint64(w.Rows), uint64(widths[0]), uint64(widths[1]), uint64(w.Cols), uint64(n), b2u(k8),
				mptr(nm.w), f32bits(nm.eps)); err != nil {
				return err
			}
			r0 += n
		}
		return nil
	})
}

// Rope rotates q ([rows][qh][d]) and k ([rows][kh][d]; the zero Tensor
// with kh 0 for none) in place, in one launch, by the angles whose
// cosines and sines cs holds ([rows][d/2][2], a device tensor of the
// backend).
func (b *Backend) Rope(ctx context.Context, q, k decode.Tensor, rows, qh, kh, d int, cs decode.Tensor) error {
	if d%2 != 0 || d > 2048 {
		return fmt.Errorf("cuda: rope: head dim %d (even, at most 2048)", d)
	}
	if qh <= 0 || kh < 0 || (kh == 0) != k.Zero() {
		return fmt.Errorf("cuda: rope: %d q heads, %d k heads (k given: %t)", qh, kh, !k.Zero())
	}
	if err := b.rowsOf("rope q", q, rows, qh*d); err != nil {
		return err
	}
	if kh > 0 {
		if err := b.rowsOf("rope k", k, rows, kh*d); err != nil {
			return err
		}
	}
	if err := b.rowsOf("rope cos/sin", cs, rows, d); err != nil {
		return err
	}
	return b.do(ctx, func() error {
		return b.launchMode(b.modelPDL, "model_rope", [3]int{qh + kh, rows, 1}, d/2, 0, uint64(q.Ptr), uint64(k.Ptr), uint64(cs.Ptr), uint64(qh), uint64(kh), uint64(d))
	})
}

// SiluMul sets g = silu(g) * u elementwise.
func (b *Backend) SiluMul(ctx context.Context, g, up decode.Tensor) error {
	if err := b.checkTensor("silu g", g, g.Len); err != nil {
		return err
	}
	if err := b.checkTensor("silu u", up, g.Len); err != nil {
		return err
	}
	return b.do(ctx, func() error {
		return b.launchMode(b.modelPDL, "model_silu_mul", [3]int{min((g.Len+255)/256, 4096), 1, 1}, 256, 0, uint64(g.Ptr), uint64(up.Ptr), uint64(g.Len))
	})
}

// Argmax waits for the queued work and returns, per row of logits
// ([rows][vocab]), the first index of its largest value.
func (b *Backend) Argmax(ctx context.Context, logits decode.Tensor, rows, vocab int) ([]int32, error) {
	if err := b.rowsOf("argmax logits", logits, rows, vocab); err != nil {
		return nil, err
	}
	out := make([]int32, rows)
	err := b.do(ctx, func() error {
		p, err := b.buf("model.argmax", int64(rows)*4)
		if err != nil {
			return err
		}
		if err := b.launchMode(b.modelPDL, "model_argmax", [3]int{rows, 1, 1}, 1024, 0, u(p), uint64(logits.Ptr), uint64(vocab)); err != nil {
			return err
		}
		if err := cu.Synchronize(); err != nil {
			return fmt.Errorf("cuda: argmax: wait: %w", err)
		}
		b.settle()
		return cu.MemcpyDtoH(unsafe.Pointer(&out[0]), p, int64(rows)*4)
	})
	return out, err
}

// Sample implements kernels.ModelDevice: model_sample, one block of 1024
// threads a row (kernels.SampleRow's rule), then a wait; rows that are
// all greedy take Argmax.
func (b *Backend) Sample(ctx context.Context, logits decode.Tensor, rows, vocab int, params []kernels.SampleParams) ([]int32, []int32, error) {
	if len(params) != rows {
		return nil, nil, fmt.Errorf("cuda: sample: %d parameter sets for %d rows", len(params), rows)
	}
	greedy := true
	flat := make([]float64, 0, 3*rows)
	for r, p := range params {
		if err := p.Validate(); err != nil {
			return nil, nil, fmt.Errorf("cuda: row %d: %w", r, err)
		}
		greedy = greedy && p.Temperature == 0
		flat = append(flat, p.Temperature, p.TopP, p.U)
	}
	if greedy {
		ids, err := b.Argmax(ctx, logits, rows, vocab)
		return ids, ids, err
	}
	if err := b.rowsOf("sample logits", logits, rows, vocab); err != nil {
		return nil, nil, err
	}
	out := make([]int32, 2*rows) // the tokens, then the argmaxes
	err := b.do(ctx, func() error {
		p, err := b.buf("model.sample", int64(rows)*8)
		if err != nil {
			return err
		}
		qb, err := b.buf("model.sample.mass", int64(rows)*int64(vocab)*8)
		if err != nil {
			return err
		}
		pp, err := upload(b, "model.sample.params", flat)
		if err != nil {
			return err
		}
		idbits := max(bits.Len(uint(vocab-1)), 1)
		if err := b.launchMode(b.modelPDL, "model_sample", [3]int{rows, 1, 1}, 1024, 0, u(p), u(p)+uint64(rows)*4, uint64(logits.Ptr), u(qb), u(pp),
			uint64(vocab), uint64(idbits)); err != nil {
			return err
		}
		if err := cu.Synchronize(); err != nil {
			return fmt.Errorf("cuda: sample: wait: %w", err)
		}
		b.settle()
		return cu.MemcpyDtoH(unsafe.Pointer(&out[0]), p, int64(rows)*8)
	})
	if err != nil {
		return nil, nil, err
	}
	return out[:rows], out[rows:], nil
}

// f32bits is x's bit pattern as a kernel's float parameter.
func f32bits(x float32) uint64 { return uint64(*(*uint32)(unsafe.Pointer(&x))) }

// RandomMatrix allocates a rows x cols matrix of dt on the device filled
// with offset + scale * u, u uniform in [-1, 1) from seed (random weights
// of a model without a checkpoint; nothing crosses from the host).
func (b *Backend) RandomMatrix(ctx context.Context, rows, cols int, dt plan.DType, seed uint64, scale, offset float32) (kernels.Matrix, error) {
	name, err := weightName(dt)
	if err != nil {
		return kernels.Matrix{}, err
	}
	if rows <= 0 || cols <= 0 {
		return kernels.Matrix{}, fmt.Errorf("cuda: random matrix of %d x %d", rows, cols)
	}
	n := int64(rows) * int64(cols)
	return b.newMatrix(ctx, rows, cols, dt, func(p cu.DevicePtr) error {
		return b.launch("model_fill_"+name, [3]int{int(min((n+255)/256, 4096)), 1, 1}, 256, 0, u(p), uint64(n), seed, f32bits(scale), f32bits(offset))
	})
}
