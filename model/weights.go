package model

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
