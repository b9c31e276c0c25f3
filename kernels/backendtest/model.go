package backendtest

import (
	"context"
	"fmt"
	"math"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
)

// The QueuedDevice's model operations (kernels.ModelDevice): the CPU twin
// of kernels/cuda's model kernels on the pretend device memory, so that
// a device executor (model/gpu) runs in CI. Each operation first lands
// the outputs of the steps queued before it, as a device stream would
// (without counting a host synchronisation); Argmax is a host
// synchronisation and counts as one. Sums are taken in float64 and
// rounded once (the CPU executor's RMSNorm and SiLU do the same).

var _ kernels.ModelDevice = (*QueuedDevice)(nil)

// FreeTensor implements kernels.ModelDevice: t must start an allocation,
// whose memory is dropped (later views of it are refused).
func (d *QueuedDevice) FreeTensor(t decode.Tensor) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.resolve(t); err != nil {
		return err
	}
	i, off := int(t.Ptr>>fakeShift)-1, t.Ptr&(1<<fakeShift-1)
	if off != 0 {
		return fmt.Errorf("fake device: free of %#x, inside an allocation", t.Ptr)
	}
	d.used -= d.sizes[i]
	d.sizes[i] = 0
	d.mem[i] = nil
	return nil
}

// MemInfo implements kernels.ModelDevice: Capacity less what is allocated
// (an unlimited device reports 1 TiB).
func (d *QueuedDevice) MemInfo(ctx context.Context) (free, total int64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	total = d.Capacity
	if total == 0 {
		total = 1 << 40
	}
	return total - d.used, total, nil
}

// Allocated is the pretend memory allocated now, in bytes.
func (d *QueuedDevice) Allocated() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// landLocked writes the outputs of the queued steps (d.mu held): the
// stream reached them.
func (d *QueuedDevice) landLocked() {
	for _, p := range d.pending {
		copy(p.dst, p.src)
	}
	d.pending = nil
}

// matrix resolves m's pretend memory (d.mu held).
func (d *QueuedDevice) matrix(what string, m kernels.Matrix) ([]float32, error) {
	if m.DType != plan.Float32 && m.DType != plan.BFloat16 {
		return nil, fmt.Errorf("fake device: %s: weights as %v (float32 or bf16)", what, m.DType)
	}
	return d.resolve(decode.OnDevice(d.Device(), m.Ptr, m.Rows*m.Cols, 0))
}

// rows resolves t as rows x width floats (d.mu held).
func (d *QueuedDevice) rows(what string, t decode.Tensor, rows, width int) ([]float32, error) {
	if t.Len != rows*width {
		return nil, fmt.Errorf("fake device: %s holds %d floats, want %d x %d", what, t.Len, rows, width)
	}
	return d.resolve(t)
}

func roundTo(dt plan.DType, x float32) float32 {
	if dt == plan.BFloat16 {
		return RoundBF16(x)
	}
	return x
}

// UploadMatrix implements kernels.ModelDevice.
func (d *QueuedDevice) UploadMatrix(ctx context.Context, w []float32, rows, cols int, dt plan.DType) (kernels.Matrix, error) {
	if rows <= 0 || cols <= 0 || len(w) != rows*cols {
		return kernels.Matrix{}, fmt.Errorf("fake device: upload matrix: %d floats for %d x %d", len(w), rows, cols)
	}
	return d.newMatrix(rows, cols, dt, func(m []float32) {
		for i, x := range w {
			m[i] = roundTo(dt, x)
		}
	})
}

// RandomMatrix implements kernels.ModelDevice with RandomWeight (the
// CUDA fill's hash, model.cu's fill), so that both devices make the same
// weights.
func (d *QueuedDevice) RandomMatrix(ctx context.Context, rows, cols int, dt plan.DType, seed uint64, scale, offset float32) (kernels.Matrix, error) {
	if rows <= 0 || cols <= 0 {
		return kernels.Matrix{}, fmt.Errorf("fake device: random matrix of %d x %d", rows, cols)
	}
	return d.newMatrix(rows, cols, dt, func(m []float32) {
		for i := range m {
			m[i] = roundTo(dt, RandomWeight(seed, int64(i), scale, offset))
		}
	})
}

func (d *QueuedDevice) newMatrix(rows, cols int, dt plan.DType, fill func([]float32)) (kernels.Matrix, error) {
	if dt != plan.Float32 && dt != plan.BFloat16 {
		return kernels.Matrix{}, fmt.Errorf("fake device: weights as %v (float32 or bf16)", dt)
	}
	t, err := d.alloc(rows*cols, int64(rows)*int64(cols)*int64(dt.Bytes()))
	if err != nil {
		return kernels.Matrix{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.resolve(t)
	if err != nil {
		return kernels.Matrix{}, err
	}
	fill(m)
	return kernels.Matrix{Ptr: t.Ptr, Rows: rows, Cols: cols, DType: dt}, nil
}

// FreeMatrix implements kernels.ModelDevice.
func (d *QueuedDevice) FreeMatrix(ctx context.Context, m kernels.Matrix) error {
	if m.Ptr == 0 {
		return nil
	}
	return d.FreeTensor(decode.OnDevice(d.Device(), m.Ptr, m.Rows*m.Cols, 0))
}

// Embed implements kernels.ModelDevice.
func (d *QueuedDevice) Embed(ctx context.Context, out decode.Tensor, table kernels.Matrix, ids []int32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	tm, err := d.matrix("embed table", table)
	if err != nil {
		return err
	}
	om, err := d.rows("embed out", out, len(ids), table.Cols)
	if err != nil {
		return err
	}
	for i, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			return fmt.Errorf("fake device: embed: token %d at row %d outside the vocabulary of %d", id, i, table.Rows)
		}
	}
	d.landLocked()
	h := table.Cols
	for i, id := range ids {
		copy(om[i*h:(i+1)*h], tm[int(id)*h:(int(id)+1)*h])
	}
	return nil
}

// RMSNorm implements kernels.ModelDevice.
func (d *QueuedDevice) RMSNorm(ctx context.Context, out, x decode.Tensor, w kernels.Matrix, rows int, eps float32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	wm, err := d.matrix("rmsnorm w", w)
	if err != nil {
		return err
	}
	h := len(wm)
	om, err := d.rows("rmsnorm out", out, rows, h)
	if err != nil {
		return err
	}
	xm, err := d.rows("rmsnorm x", x, rows, h)
	if err != nil {
		return err
	}
	d.landLocked()
	for r := range rows {
		xr, yr := xm[r*h:(r+1)*h], om[r*h:(r+1)*h]
		rmsnormRow(yr, xr, wm, eps)
	}
	return nil
}

// rmsnormRow writes xr normalised and scaled by w into yr: the mean of
// squares in float64, rounded once, as the CPU executor's.
func rmsnormRow(yr, xr, w []float32, eps float32) {
	var ss float64
	for _, v := range xr {
		ss += float64(v) * float64(v)
	}
	s := float32(1 / math.Sqrt(ss/float64(len(xr))+float64(eps)))
	for i, v := range xr {
		yr[i] = w[i] * (v * s)
	}
}

// Gemv implements kernels.ModelDevice.
func (d *QueuedDevice) Gemv(ctx context.Context, y decode.Tensor, w kernels.Matrix, x, res decode.Tensor, rows int) error {
	return d.gemv(w, x, res, nil, rows, y)
}

// GemvSplit implements kernels.ModelDevice.
func (d *QueuedDevice) GemvSplit(ctx context.Context, w kernels.Matrix, x decode.Tensor, rows int, ys ...decode.Tensor) error {
	return d.gemv(w, x, decode.Tensor{}, nil, rows, ys...)
}

// GemvNorm implements kernels.ModelDevice: RMSNorm into a scratch copy of
// x, then the GEMV (the device fuses them; the twin need not).
func (d *QueuedDevice) GemvNorm(ctx context.Context, w kernels.Matrix, x decode.Tensor, norm kernels.Matrix, eps float32, rows int, ys ...decode.Tensor) error {
	if norm.DType != w.DType || norm.Rows*norm.Cols != w.Cols {
		return fmt.Errorf("fake device: gemv norm: weights %dx%d %v for a %dx%d %v matrix", norm.Rows, norm.Cols, norm.DType, w.Rows, w.Cols, w.DType)
	}
	return d.gemv(w, x, decode.Tensor{}, &gemvNorm{norm, eps}, rows, ys...)
}

type gemvNorm struct {
	w   kernels.Matrix
	eps float32
}

func (d *QueuedDevice) gemv(w kernels.Matrix, x, res decode.Tensor, nm *gemvNorm, rows int, ys ...decode.Tensor) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(ys) == 0 || len(ys) > 3 || rows <= 0 {
		return fmt.Errorf("fake device: gemv: %d outputs for %d rows (1 to 3 outputs, rows > 0)", len(ys), rows)
	}
	wm, err := d.matrix("gemv w", w)
	if err != nil {
		return err
	}
	xm, err := d.rows("gemv x", x, rows, w.Cols)
	if err != nil {
		return err
	}
	var nw []float32
	if nm != nil {
		if nw, err = d.matrix("gemv norm", nm.w); err != nil {
			return err
		}
	}
	outs := make([][]float32, len(ys))
	widths := make([]int, len(ys))
	total := 0
	for i, y := range ys {
		if y.Len%rows != 0 {
			return fmt.Errorf("fake device: gemv: output %d holds %d floats, not a multiple of %d rows", i, y.Len, rows)
		}
		widths[i] = y.Len / rows
		if outs[i], err = d.resolve(y); err != nil {
			return err
		}
		total += widths[i]
	}
	if total != w.Rows {
		return fmt.Errorf("fake device: gemv: outputs %v wide, the matrix has %d rows", widths, w.Rows)
	}
	var rm []float32
	if !res.Zero() {
		if len(ys) != 1 {
			return fmt.Errorf("fake device: gemv: a residual with %d outputs (one only)", len(ys))
		}
		if rm, err = d.rows("gemv res", res, rows, w.Rows); err != nil {
			return err
		}
	}
	d.landLocked()
	k := w.Cols
	if nm != nil {
		xn := make([]float32, len(xm))
		for r := range rows {
			rmsnormRow(xn[r*k:(r+1)*k], xm[r*k:(r+1)*k], nw, nm.eps)
		}
		xm = xn
	}
	// All outputs first, then the stores: y may alias res (and x, as on
	// the device, may not alias y).
	acc := make([]float32, rows*w.Rows)
	for r := range rows {
		xr := xm[r*k : (r+1)*k]
		for o := range w.Rows {
			var s float64
			for j, wv := range wm[o*k : (o+1)*k] {
				s += float64(wv) * float64(xr[j])
			}
			acc[r*w.Rows+o] = float32(s)
			if rm != nil {
				acc[r*w.Rows+o] += rm[r*w.Rows+o]
			}
		}
	}
	for r := range rows {
		at := 0
		for i, wd := range widths {
			copy(outs[i][r*wd:(r+1)*wd], acc[r*w.Rows+at:r*w.Rows+at+wd])
			at += wd
		}
	}
	return nil
}

// Rope implements kernels.ModelDevice.
func (d *QueuedDevice) Rope(ctx context.Context, q, k decode.Tensor, rows, qh, kh, hd int, cs decode.Tensor) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if hd%2 != 0 {
		return fmt.Errorf("fake device: rope: head dim %d (even)", hd)
	}
	if qh <= 0 || kh < 0 || (kh == 0) != k.Zero() {
		return fmt.Errorf("fake device: rope: %d q heads, %d k heads (k given: %t)", qh, kh, !k.Zero())
	}
	qm, err := d.rows("rope q", q, rows, qh*hd)
	if err != nil {
		return err
	}
	var km []float32
	if kh > 0 {
		if km, err = d.rows("rope k", k, rows, kh*hd); err != nil {
			return err
		}
	}
	cm, err := d.rows("rope cos/sin", cs, rows, hd)
	if err != nil {
		return err
	}
	d.landLocked()
	half := hd / 2
	for _, t := range []struct {
		x     []float32
		heads int
	}{{qm, qh}, {km, kh}} {
		for r := range rows {
			for h := range t.heads {
				v := t.x[(r*t.heads+h)*hd : (r*t.heads+h+1)*hd]
				for i := range half {
					c, s := cm[(r*half+i)*2], cm[(r*half+i)*2+1]
					a, b := v[i], v[i+half]
					v[i] = a*c - b*s
					v[i+half] = b*c + a*s
				}
			}
		}
	}
	return nil
}

// SiluMul implements kernels.ModelDevice.
func (d *QueuedDevice) SiluMul(ctx context.Context, g, u decode.Tensor) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	gm, err := d.resolve(g)
	if err != nil {
		return err
	}
	um, err := d.rows("silu u", u, 1, g.Len)
	if err != nil {
		return err
	}
	d.landLocked()
	for i, x := range gm {
		gm[i] = float32(float64(x)/(1+math.Exp(-float64(x)))) * um[i]
	}
	return nil
}

// Argmax implements kernels.ModelDevice: a host synchronisation (counted
// by Syncs).
func (d *QueuedDevice) Argmax(ctx context.Context, logits decode.Tensor, rows, vocab int) ([]int32, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	lm, err := d.rows("argmax logits", logits, rows, vocab)
	if err != nil {
		return nil, err
	}
	d.syncs++
	if err := ctx.Err(); err != nil {
		d.pending = nil
		return nil, err
	}
	d.landLocked()
	out := make([]int32, rows)
	for r := range rows {
		best := float32(math.Inf(-1))
		for i, x := range lm[r*vocab : (r+1)*vocab] {
			if x > best {
				best, out[r] = x, int32(i)
			}
		}
	}
	return out, nil
}

// Sample implements kernels.ModelDevice with kernels.SampleRow; like
// Argmax it is a host synchronisation.
func (d *QueuedDevice) Sample(ctx context.Context, logits decode.Tensor, rows, vocab int, params []kernels.SampleParams) ([]int32, []int32, error) {
	if len(params) != rows {
		return nil, nil, fmt.Errorf("fake device: sample: %d parameter sets for %d rows", len(params), rows)
	}
	for r, p := range params {
		if err := p.Validate(); err != nil {
			return nil, nil, fmt.Errorf("fake device: row %d: %w", r, err)
		}
	}
	greedy, err := d.Argmax(ctx, logits, rows, vocab)
	if err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	lm, err := d.rows("sample logits", logits, rows, vocab)
	if err != nil {
		return nil, nil, err
	}
	out := make([]int32, rows)
	for r := range rows {
		out[r] = kernels.SampleRow(lm[r*vocab:(r+1)*vocab], params[r])
	}
	return out, greedy, nil
}
