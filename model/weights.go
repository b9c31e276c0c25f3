package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/questrt/questrt/internal/memlimit"
)

// Weights are a Model's parameters as float32 views (row-major, [out][in]
// for projections, as the checkpoint stores them), for an executor that
// copies them elsewhere (model/gpu). They share the Model's memory: read
// only.
type Weights struct {
	// Embed is the token embedding [VocabSize][HiddenSize]; Norm the
	// final RMSNorm weight [HiddenSize]; LMHead [VocabSize][HiddenSize]
	// (Embed itself when the embeddings are tied).
	Embed, Norm, LMHead []float32
	Layers              []LayerWeights
}

// LayerWeights are one decoder layer's parameters.
type LayerWeights struct {
	AttnNorm, MLPNorm []float32 // [HiddenSize]
	Wq                []float32 // [Heads*HeadDim][HiddenSize]
	Wk, Wv            []float32 // [KVHeads*HeadDim][HiddenSize]
	Wo                []float32 // [HiddenSize][Heads*HeadDim]
	Gate, Up          []float32 // [IntermediateSize][HiddenSize]
	Down              []float32 // [HiddenSize][IntermediateSize]
}

// Weights returns views of the model's parameters.
func (m *Model) Weights() Weights {
	w := Weights{Embed: m.embed, Norm: m.normW, LMHead: m.lmHead}
	for _, l := range m.layers {
		w.Layers = append(w.Layers, LayerWeights{AttnNorm: l.attnNorm, MLPNorm: l.mlpNorm, Wq: l.wq, Wk: l.wk, Wv: l.wv, Wo: l.wo,
			Gate: l.gate, Up: l.up, Down: l.down})
	}
	return w
}

// RopeCosSin appends to cs the cosine and sine of every rotary angle at
// position pos ([HeadDim/2][2]), rounded as the CPU executor rounds them
// (so that a device applying them rotates exactly as Forward does).
func (m *Model) RopeCosSin(cs []float32, pos int) []float32 {
	return m.rope.cosSin(cs, pos)
}

// Rotary is the rotary position embedding of a config (rotate-half, with
// Llama 3.1 scaling where the config asks for it), for an executor
// without host weights.
type Rotary struct{ r *rope }

// NewRotary returns c's rotary embedding.
func NewRotary(c Config) *Rotary { return &Rotary{newRope(c)} }

// CosSin is Model.RopeCosSin.
func (r *Rotary) CosSin(cs []float32, pos int) []float32 { return r.r.cosSin(cs, pos) }

// RandomOptions tune NewRandom. Zero fields take the defaults noted.
type RandomOptions struct {
	// Seed seeds the weights (the same seed, the same model).
	Seed uint64
	// Std is the standard deviation of the projections and embeddings,
	// drawn uniform in [-Std*sqrt(3), Std*sqrt(3)) (default 0.02, Hugging
	// Face's initialisation); the norms are 1.
	Std float64
	// MemoryLimit bounds the float32 weights as LoadOptions.MemoryLimit.
	MemoryLimit int64
	// Workers is the goroutines of matrix products (0: GOMAXPROCS).
	Workers int
}

// NewRandom builds a model of config c with random weights (vLLM's
// --load-format dummy): for benchmarks and tests of a shape without its
// checkpoint. Every weight is exact in bf16, so that a device holding
// bf16 weights computes with the same values.
func NewRandom(c Config, opt RandomOptions) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if opt.Std == 0 {
		opt.Std = 0.02
	}
	if opt.Std < 0 || math.IsNaN(opt.Std) || math.IsInf(opt.Std, 0) {
		return nil, fmt.Errorf("model: random weights with standard deviation %v", opt.Std)
	}
	if err := memlimit.Check(fmt.Sprintf("model: %d float32 random weights", c.Params()), memlimit.Mul(c.Params(), 4), opt.MemoryLimit); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x9e3779b97f4a7c15))
	a := opt.Std * math.Sqrt(3)
	mat := func(rows, cols int) []float32 {
		w := make([]float32, rows*cols)
		for i := range w {
			w[i] = bf16(float32((rng.Float64()*2 - 1) * a))
		}
		return w
	}
	ones := func(n int) []float32 {
		w := make([]float32, n)
		for i := range w {
			w[i] = 1
		}
		return w
	}
	h, q, kv, in := c.HiddenSize, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.IntermediateSize
	m := &Model{Config: c, workers: opt.Workers}
	m.embed = mat(c.VocabSize, h)
	m.normW = ones(h)
	m.lmHead = m.embed
	if !c.TieEmbeddings {
		m.lmHead = mat(c.VocabSize, h)
	}
	for range c.Layers {
		m.layers = append(m.layers, layerWeights{attnNorm: ones(h), mlpNorm: ones(h),
			wq: mat(q, h), wk: mat(kv, h), wv: mat(kv, h), wo: mat(h, q),
			gate: mat(in, h), up: mat(in, h), down: mat(h, in)})
	}
	m.rope = newRope(c)
	return m, nil
}

// bf16 rounds x to the nearest bfloat16 (ties to even).
func bf16(x float32) float32 {
	b := math.Float32bits(x)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}
