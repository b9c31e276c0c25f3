package gpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// Options configure an Executor. Zero fields take their defaults.
type Options struct {
	// Float32Weights stores the weights as float32 on the device
	// (default: bf16, half the bytes to stream per token).
	Float32Weights bool
	// MaxBatch is the most rows one Decode call takes (default 16).
	MaxBatch int
	// NoPDL launches every model kernel only after the previous one
	// ended (default: as its programmatic dependent, overlapping the
	// launch and the first weight loads with the previous kernel's tail).
	NoPDL bool
	// PrefillChunk is the most prompt tokens one Prefill pass runs
	// through the layers (default DefaultPrefillChunk); its activations
	// are allocated with the executor.
	PrefillChunk int
}

// Timing splits the host's time of the last Decode call.
type Timing struct {
	// Enqueue is the time to queue every layer (the host's share: when
	// it is about the whole step, the device waited for the host).
	Enqueue time.Duration
	// EndWait is the Stepper's End, which waits for the queued layers.
	EndWait time.Duration
	// Head is the final norm, the LM head and the argmax, with its wait.
	Head time.Duration
}

// ErrBadInput marks a Decode call refused before anything ran.
var ErrBadInput = errors.New("gpu: bad input")

// ErrNoMemory marks a model (with its pages) refused because it does not
// fit the device's free memory; nothing was allocated.
var ErrNoMemory = errors.New("gpu: does not fit the device")

// Reserve is the device memory Admit keeps free besides what it is asked
// for: the backends' scratch buffers and staging (a few MiB at decode
// batch sizes; a prefill chunk's bf16 GEMM input, chunk x intermediate
// size x 2 bytes) and the driver's own allocations.
const Reserve = 256 << 20

// Need returns the device memory an executor of config c with options
// opt takes (the zero Options: their defaults): its weights and its
// activations for MaxBatch rows.
func Need(c model.Config, opt Options) (weights, activations int64) {
	wb := int64(2)
	if opt.Float32Weights {
		wb = 4
	}
	batch := int64(opt.MaxBatch)
	if batch <= 0 {
		batch = 16
	}
	chunk := int64(opt.PrefillChunk)
	if chunk <= 0 {
		chunk = DefaultPrefillChunk
	}
	h, qd, kvd, in, v := int64(c.HiddenSize), int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim), int64(c.IntermediateSize), int64(c.VocabSize)
	perLayer := 2*h + (qd+2*kvd)*h + h*qd + 2*in*h + h*in
	weights = wb * (2*v*h + h + int64(c.Layers)*perLayer)
	activations = 4 * batch * (h + 2*qd + 2*kvd + 2*in + v + int64(c.HeadDim))
	// Prefill: the chunk's rows (the GEMM's bf16 copy of its widest
	// input is the backend's scratch, in Reserve: 59 MB for an 8B model's
	// chunk of 2048).
	activations += 4 * chunk * (h + 2*qd + 2*kvd + 2*in + int64(c.HeadDim))
	return weights, activations
}

// Admit checks that need bytes (and Reserve) fit dev's free memory now,
// naming what they are for (what) and the device's figures when they do
// not: an error wrapping ErrNoMemory.
func Admit(ctx context.Context, dev kernels.ModelDevice, need int64, what string) error {
	free, total, err := dev.MemInfo(ctx)
	if err != nil {
		return fmt.Errorf("gpu: device memory: %w", err)
	}
	if need+Reserve > free {
		return fmt.Errorf("%w: %s need %.2f GB (+%.2f GB reserved), %v has %.2f GB free of %.2f GB",
			ErrNoMemory, what, float64(need)/1e9, float64(Reserve)/1e9, dev.Device(), float64(free)/1e9, float64(total)/1e9)
	}
	return nil
}

// AdmitAll checks, before anything is allocated, that an executor of
// config c with options opt and pages pages of K/V and summaries taking
// pageBytes of device memory (engine.Config.DevicePageBytes) fit dev's
// free memory (and Reserve): ErrNoMemory naming each part when they do
// not.
func AdmitAll(ctx context.Context, dev kernels.ModelDevice, c model.Config, opt Options, pages int, pageBytes int64) error {
	w, a := Need(c, opt)
	return Admit(ctx, dev, w+a+pageBytes, fmt.Sprintf("the weights (%.2f GB), activations (%.2f GB) and %d pages (%.2f GB)",
		float64(w)/1e9, float64(a)/1e9, pages, float64(pageBytes)/1e9))
}

// admitModel checks the executor's own memory before it allocates.
func admitModel(ctx context.Context, dev kernels.ModelDevice, c model.Config, opt Options) error {
	w, a := Need(c, opt)
	return Admit(ctx, dev, w+a, fmt.Sprintf("the weights (%.2f GB) and activations (%.2f GB)", float64(w)/1e9, float64(a)/1e9))
}

// Executor runs a model's decode steps on a device (the CUDA backend, or
// its CPU twin in tests). It is used by one goroutine at a time.
type Executor struct {
	be  kernels.ModelDevice
	cfg model.Config
	opt Options
	rot func(cs []float32, pos int) []float32 // RoPE's cos/sin at a position

	embed, norm, head kernels.Matrix
	layers            []layer

	// Activations for MaxBatch rows, in device memory.
	x, q, k, v, o, gate, up, logits, csd decode.Tensor
	pre                                  activations // Prefill's, for PrefillChunk rows
	cs                                   []float32   // RoPE cos/sin of the rows, host (copied to csd once a step)
	ids                                  []int32
	last                                 Timing
	steps                                [][]model.StepInfo // [row][layer] of the last Decode
	greedy                               []int              // each row's argmax in the last Decode
	marker                               PhaseMarker        // phase marks (MarkPhases), or nil
	qkv                                  [3]decode.Tensor   // attnIn's GemvNorm outputs (no slice allocated a layer)
	gateUp                               [2]decode.Tensor   // attnOut's
	phases                               Phases             // of the last marked Decode
	prePhases                            PrefillPhases      // of the last marked Prefill
}

// activations are a prefill chunk's rows in device memory.
type activations struct {
	x, q, k, v, o, gate, up, cs decode.Tensor
}

func (a *activations) all() []decode.Tensor {
	return []decode.Tensor{a.x, a.q, a.k, a.v, a.o, a.gate, a.up, a.cs}
}

// layer holds one decoder layer's weights; q|k|v and gate|up are fused
// (one launch each, more outputs to spread over the GPU).
type layer struct {
	attnNorm, mlpNorm, qkv, wo, gateUp, down kernels.Matrix
}

func (l *layer) matrices() []kernels.Matrix {
	return []kernels.Matrix{l.attnNorm, l.mlpNorm, l.qkv, l.wo, l.gateUp, l.down}
}

func concat(parts ...[]float32) []float32 {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]float32, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// New uploads m's weights to be's device. Close frees them.
func New(ctx context.Context, be kernels.ModelDevice, m *model.Model, opt Options) (*Executor, error) {
	if err := admitModel(ctx, be, m.Config, opt); err != nil {
		return nil, err
	}
	x := newExecutor(be, m.Config, opt, m.RopeCosSin)
	c := x.cfg
	w := m.Weights()
	var err error
	up := func(dst *kernels.Matrix, a []float32, rows, cols int, what string) {
		if err != nil {
			return
		}
		if *dst, err = be.UploadMatrix(ctx, a, rows, cols, x.dtype()); err != nil {
			err = fmt.Errorf("gpu: upload %s: %w", what, err)
		}
	}
	h, qd, kvd, inter := c.HiddenSize, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.IntermediateSize
	up(&x.embed, w.Embed, c.VocabSize, h, "embedding")
	up(&x.norm, w.Norm, 1, h, "final norm")
	up(&x.head, w.LMHead, c.VocabSize, h, "LM head")
	for i, lw := range w.Layers {
		l := &x.layers[i]
		name := func(s string) string { return fmt.Sprintf("layer %d %s", i, s) }
		up(&l.attnNorm, lw.AttnNorm, 1, h, name("attention norm"))
		up(&l.mlpNorm, lw.MLPNorm, 1, h, name("MLP norm"))
		up(&l.qkv, concat(lw.Wq, lw.Wk, lw.Wv), qd+2*kvd, h, name("q|k|v"))
		up(&l.wo, lw.Wo, h, qd, name("o"))
		up(&l.gateUp, concat(lw.Gate, lw.Up), 2*inter, h, name("gate|up"))
		up(&l.down, lw.Down, h, inter, name("down"))
	}
	return x.finish(ctx, err)
}

// NewRandom builds an executor of config c with random weights made on
// the device from seed (vLLM's --load-format dummy): projections uniform
// with the standard deviation 0.02 of Hugging Face's initialisation,
// norms 1. For benchmarks of a model shape without its checkpoint.
func NewRandom(ctx context.Context, be kernels.ModelDevice, c model.Config, seed uint64, opt Options) (*Executor, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	if err := admitModel(ctx, be, c, opt); err != nil {
		return nil, err
	}
	x := newExecutor(be, c, opt, model.NewRotary(c).CosSin)
	var err error
	n := uint64(0)
	rnd := func(dst *kernels.Matrix, rows, cols int, norm bool) {
		if err != nil {
			return
		}
		n++
		scale, offset := float32(0.02*math.Sqrt(3)), float32(0)
		if norm {
			scale, offset = 0, 1
		}
		*dst, err = be.RandomMatrix(ctx, rows, cols, x.dtype(), seed*1000003+n, scale, offset)
	}
	h, qd, kvd, inter := c.HiddenSize, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.IntermediateSize
	rnd(&x.embed, c.VocabSize, h, false)
	rnd(&x.norm, 1, h, true)
	rnd(&x.head, c.VocabSize, h, false)
	for i := range x.layers {
		l := &x.layers[i]
		rnd(&l.attnNorm, 1, h, true)
		rnd(&l.mlpNorm, 1, h, true)
		rnd(&l.qkv, qd+2*kvd, h, false)
		rnd(&l.wo, h, qd, false)
		rnd(&l.gateUp, 2*inter, h, false)
		rnd(&l.down, h, inter, false)
	}
	return x.finish(ctx, err)
}

func newExecutor(be kernels.ModelDevice, c model.Config, opt Options, rot func([]float32, int) []float32) *Executor {
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = 16
	}
	if p, ok := be.(interface{ SetModelPDL(bool) }); ok {
		p.SetModelPDL(!opt.NoPDL)
	}
	return &Executor{be: be, cfg: c, opt: opt, rot: rot, layers: make([]layer, c.Layers)}
}

// dtype is the weights' storage type.
func (x *Executor) dtype() plan.DType {
	if x.opt.Float32Weights {
		return plan.Float32
	}
	return plan.BFloat16
}

// finish allocates the activations once the weights are in (err: the
// weights' failure) and frees everything on failure.
func (x *Executor) finish(ctx context.Context, err error) (*Executor, error) {
	c, be := x.cfg, x.be
	alloc := func(dst *decode.Tensor, width int) {
		if err != nil {
			return
		}
		*dst, err = be.AllocTensor(x.opt.MaxBatch * width)
	}
	h, qd, kvd, inter := c.HiddenSize, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.IntermediateSize
	alloc(&x.x, h)
	alloc(&x.q, qd)
	alloc(&x.k, kvd)
	alloc(&x.v, kvd)
	alloc(&x.o, qd)
	alloc(&x.gate, inter)
	alloc(&x.up, inter)
	alloc(&x.logits, c.VocabSize)
	alloc(&x.csd, c.HeadDim)
	p, chunk := &x.pre, x.PrefillChunk()
	for _, a := range []struct {
		t     *decode.Tensor
		width int
	}{{&p.x, h}, {&p.q, qd}, {&p.k, kvd}, {&p.v, kvd}, {&p.o, qd}, {&p.gate, inter}, {&p.up, inter}, {&p.cs, c.HeadDim}} {
		if err == nil {
			*a.t, err = be.AllocTensor(chunk * a.width)
		}
	}
	if err != nil {
		x.Close(ctx)
		return nil, err
	}
	return x, nil
}

// Close frees the weights and activations on the device.
func (x *Executor) Close(ctx context.Context) error {
	var errs []error
	for _, t := range append([]decode.Tensor{x.x, x.q, x.k, x.v, x.o, x.gate, x.up, x.logits, x.csd}, x.pre.all()...) {
		if !t.Zero() {
			errs = append(errs, x.be.FreeTensor(t))
		}
	}
	free := func(m kernels.Matrix) { errs = append(errs, x.be.FreeMatrix(ctx, m)) }
	free(x.embed)
	free(x.norm)
	free(x.head)
	for _, l := range x.layers {
		for _, m := range l.matrices() {
			free(m)
		}
	}
	return errors.Join(errs...)
}

// Config is the model's config.
func (x *Executor) Config() model.Config { return x.cfg }

// MaxBatch is the most rows one Decode call takes (Options.MaxBatch, or
// its default).
func (x *Executor) MaxBatch() int { return x.opt.MaxBatch }

// WeightBytes is the device memory the weights take.
func (x *Executor) WeightBytes() int64 {
	n := x.embed.Bytes() + x.norm.Bytes() + x.head.Bytes()
	for _, l := range x.layers {
		for _, m := range l.matrices() {
			n += m.Bytes()
		}
	}
	return n
}

// Row is one sequence of a decode step: its sequence in the Stepper,
// the token it decodes (not yet in the sequence) and that token's
// position (the sequence's length), and its page budget (0: the
// policy's).
type Row struct {
	Seq    decode.SeqID
	Token  int
	Pos    int
	Budget int
	// Dense attends every page in every layer (a dense reference step);
	// DenseLayers attends every page in the first DenseLayers layers
	// (decode.Row's).
	Dense       bool
	DenseLayers int
	// Sample picks the row's next token on the device
	// (kernels.ModelDevice.Sample; model.Sampler.Params gives the
	// parameters of a request's sampler). The zero value is greedy.
	Sample kernels.SampleParams
}

// Decode runs one decode step of rows through st (whose pages live on
// the executor's device; see the package doc): each row's token goes
// through every layer, its keys and values are appended, and each row's
// next token comes back, greedy or sampled on the device by its Sample
// parameters. One host synchronisation (the argmax or the sampling)
// besides the Stepper's End. Each row's Pos must be its
// sequence's length (RoPE rotates by it; the Stepper does not check it).
// Bad rows are refused with ErrBadInput before anything runs; an error
// after the first layer ran leaves the rows' new token in the layers
// that ran (the Stepper's contract), so that those sequences cannot
// decode again: release them.
func (x *Executor) Decode(ctx context.Context, st decode.Stepper, rows []Row) ([]int, error) {
	c := x.cfg
	n := len(rows)
	switch {
	case n == 0 || n > x.opt.MaxBatch:
		return nil, fmt.Errorf("%w: %d rows, 1..%d", ErrBadInput, n, x.opt.MaxBatch)
	}
	x.ids, x.cs = x.ids[:0], x.cs[:0]
	b := decode.Batch{Rows: make([]decode.Row, n)}
	sampled := false
	for i, r := range rows {
		if r.Token < 0 || r.Token >= c.VocabSize {
			return nil, fmt.Errorf("%w: row %d: token %d outside the vocabulary of %d", ErrBadInput, i, r.Token, c.VocabSize)
		}
		if r.Pos < 0 || (c.MaxPositions > 0 && r.Pos >= c.MaxPositions) {
			return nil, fmt.Errorf("%w: row %d: position %d outside 0..%d", ErrBadInput, i, r.Pos, c.MaxPositions-1)
		}
		if err := r.Sample.Validate(); err != nil {
			return nil, fmt.Errorf("%w: row %d: %v", ErrBadInput, i, err)
		}
		if r.Sample.Temperature != 0 {
			sampled = true
		}
		x.ids = append(x.ids, int32(r.Token))
		x.cs = x.rot(x.cs, r.Pos)
		if r.DenseLayers < 0 {
			return nil, fmt.Errorf("%w: row %d: %d dense layers", ErrBadInput, i, r.DenseLayers)
		}
		b.Rows[i] = decode.Row{Seq: r.Seq, New: true, Budget: r.Budget, DenseLayers: min(r.DenseLayers, c.Layers)}
		if r.Dense {
			b.Rows[i].DenseLayers = c.Layers
		}
	}
	h, qd, kvd, inter := c.HiddenSize, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.IntermediateSize
	view := func(t decode.Tensor, width int) decode.Tensor { return t.Slice(0, n*width) }
	xx, q, k, v, o := view(x.x, h), view(x.q, qd), view(x.k, kvd), view(x.v, kvd), view(x.o, qd)
	gate, up, logits, cs := view(x.gate, inter), view(x.up, inter), view(x.logits, c.VocabSize), view(x.csd, c.HeadDim)
	eps := float32(c.RMSNormEps)
	be := x.be
	if x.marker != nil {
		// Marks a failed Decode left queued.
		if _, err := x.marker.PhaseTimes(ctx); err != nil {
			return nil, fmt.Errorf("gpu: phase marks: %w", err)
		}
	}
	t0 := time.Now()
	if err := be.UploadTensor(cs, x.cs); err != nil {
		return nil, fmt.Errorf("gpu: rope cos/sin: %w", err)
	}
	if err := be.Embed(ctx, xx, x.embed, x.ids); err != nil {
		return nil, fmt.Errorf("gpu: embed: %w", err)
	}
	step, err := st.Begin(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("gpu: begin: %w", err)
	}
	if err := x.mark(ctx); err != nil {
		step.End(ctx)
		return nil, fmt.Errorf("gpu: phase mark: %w", err)
	}
	res := decode.Result{O: o}
	// Each row's steps reuse the last Decode's (LastSteps' slices are
	// the executor's until the next Decode).
	x.steps = slices.Grow(x.steps[:0], n)[:n]
	for i := range x.steps {
		x.steps[i] = slices.Grow(x.steps[i][:0], c.Layers)
	}
	for li := range x.layers {
		l := &x.layers[li]
		err := x.attnIn(ctx, l, xx, q, k, v, cs, n)
		if err == nil {
			err = x.mark(ctx)
		}
		if err == nil {
			err = step.Layer(ctx, li, q, k, v, &res)
		}
		if err == nil {
			x.record(li, n, &res)
			err = x.mark(ctx)
		}
		if err == nil {
			err = x.attnOut(ctx, l, xx, o, gate, up, n)
		}
		if err == nil {
			err = x.mark(ctx)
		}
		if err != nil {
			step.End(ctx)
			return nil, fmt.Errorf("gpu: layer %d: %w", li, err)
		}
	}
	t1 := time.Now()
	if err := step.End(ctx); err != nil {
		return nil, fmt.Errorf("gpu: end: %w", err)
	}
	t2 := time.Now()
	if err := x.mark(ctx); err != nil {
		return nil, fmt.Errorf("gpu: phase mark: %w", err)
	}
	if err := be.GemvNorm(ctx, x.head, xx, x.norm, eps, n, logits); err != nil {
		return nil, fmt.Errorf("gpu: head: %w", err)
	}
	if err := x.mark(ctx); err != nil {
		return nil, fmt.Errorf("gpu: phase mark: %w", err)
	}
	var ids, greedy []int32
	if sampled {
		ps := make([]kernels.SampleParams, n)
		for i, r := range rows {
			ps[i] = r.Sample
		}
		ids, greedy, err = be.Sample(ctx, logits, n, c.VocabSize, ps)
	} else {
		ids, err = be.Argmax(ctx, logits, n, c.VocabSize)
		greedy = ids
	}
	if err != nil {
		return nil, fmt.Errorf("gpu: next tokens: %w", err)
	}
	x.greedy = x.greedy[:0]
	for _, id := range greedy {
		x.greedy = append(x.greedy, int(id))
	}
	x.last = Timing{Enqueue: t1.Sub(t0), EndWait: t2.Sub(t1), Head: time.Since(t2)}
	if err := x.readPhases(ctx, len(x.layers)); err != nil {
		return nil, fmt.Errorf("gpu: phase marks: %w", err)
	}
	next := make([]int, n)
	for i, id := range ids {
		next[i] = int(id)
	}
	return next, nil
}

// attnIn queues a layer's side before attention for n rows: q, k and v
// of x normalised (one GEMV or GEMM), and their rotation.
func (x *Executor) attnIn(ctx context.Context, l *layer, xx, q, k, v, cs decode.Tensor, n int) error {
	c := x.cfg
	x.qkv = [3]decode.Tensor{q, k, v}
	return errors.Join(
		x.be.GemvNorm(ctx, l.qkv, xx, l.attnNorm, float32(c.RMSNormEps), n, x.qkv[:]...),
		x.be.Rope(ctx, q, k, n, c.Heads, c.KVHeads, c.HeadDim, cs),
	)
}

// attnOut queues the rest of a layer after attention for n rows: o's
// projection added to the residual x, and the MLP (SwiGLU) added too.
func (x *Executor) attnOut(ctx context.Context, l *layer, xx, o, gate, up decode.Tensor, n int) error {
	be := x.be
	x.gateUp = [2]decode.Tensor{gate, up}
	return errors.Join(
		be.Gemv(ctx, xx, l.wo, o, xx, n),
		be.GemvNorm(ctx, l.gateUp, xx, l.mlpNorm, float32(x.cfg.RMSNormEps), n, x.gateUp[:]...),
		be.SiluMul(ctx, gate, up),
		be.Gemv(ctx, xx, l.down, gate, xx, n),
	)
}

// record keeps each row's plan and phase times of layer li.
func (x *Executor) record(li, n int, res *decode.Result) {
	kvh := x.cfg.KVHeads
	for i := range n {
		st := model.StepInfo{Layer: li, Time: res.Time}
		if i < len(res.Plans) {
			pl := res.Plans[i]
			st.Plan, st.PagesRead, st.PagesTotal = pl, pl.Reads()*kvh, pl.Pages*kvh
		}
		x.steps[i] = append(x.steps[i], st)
	}
}

// LastSteps returns row's plan, pages read (as the plan's reads of every
// KV head) and the engine's phase times per layer in the last Decode, as
// model.EngineAttention's Steps (model.Summarize takes them). The slice
// is the executor's until the next Decode.
func (x *Executor) LastSteps(row int) []model.StepInfo {
	if row < 0 || row >= len(x.steps) {
		return nil
	}
	return x.steps[row]
}

// LastTiming is the host's time split of the last successful Decode.
func (x *Executor) LastTiming() Timing { return x.last }

// LastGreedy is each row's argmax in the last successful Decode (its
// tokens where the rows were greedy): what serving records beside a
// sampled token. Valid until the next Decode.
func (x *Executor) LastGreedy() []int { return x.greedy }

// Logits returns the last Decode call's logits of its n rows (a copy;
// it waits for the device). For tests and diagnostics.
func (x *Executor) Logits(ctx context.Context, n int) ([]float32, error) {
	return x.be.DownloadTensor(ctx, x.logits.Slice(0, n*x.cfg.VocabSize))
}
