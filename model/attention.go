package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/questrt/questrt/kernels"
)

// Attention is the KV cache and the attention of one sequence. The model
// hands it post-RoPE queries, keys and values layer by layer: a forward
// pass over n tokens calls layers 0..L-1 in order, each with the same n
// tokens, so between passes every layer holds Len tokens. Implementations
// are not safe for concurrent use.
type Attention interface {
	// Len is the number of tokens every layer holds.
	Len() int
	// Prefill appends n tokens' keys and values to layer (k, v:
	// [n][KVHeads][HeadDim]) and writes the causal dense attention of their
	// queries (q: [n][Heads][HeadDim]) into out ([n][Heads][HeadDim]):
	// each token attends to every earlier token of the sequence and to
	// itself.
	Prefill(ctx context.Context, layer int, q, k, v, out []float32) error
	// Decode appends one token's k and v to layer and writes its query's
	// attention over the sequence into out, reading the pages the
	// implementation selects (all of them for a dense one).
	Decode(ctx context.Context, layer int, q, k, v, out []float32) error
}

// Geometry is the attention shape of a model.
type Geometry struct {
	Layers, Heads, KVHeads, HeadDim int
}

// Geometry returns the model's attention shape.
func (c Config) Geometry() Geometry {
	return Geometry{Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
}

// check validates one call's buffers for n tokens.
func (g Geometry) check(layer, n int, q, k, v, out []float32) error {
	qn, kvn := n*g.Heads*g.HeadDim, n*g.KVHeads*g.HeadDim
	switch {
	case layer < 0 || layer >= g.Layers:
		return fmt.Errorf("attention: layer %d outside 0..%d", layer, g.Layers-1)
	case n < 1 || len(q) != qn || len(out) != qn || len(k) != kvn || len(v) != kvn:
		return fmt.Errorf("attention: q %d, k %d, v %d, out %d floats for %d tokens of %d query and %d KV heads of %d", len(q), len(k), len(v), len(out), n, g.Heads, g.KVHeads, g.HeadDim)
	}
	return nil
}

// tokens returns how many tokens q holds.
func (g Geometry) tokens(q []float32) int { return len(q) / (g.Heads * g.HeadDim) }

// Reference is a dense attention over a KV cache held in float32, with
// every dot product and softmax accumulated in float64: the naive
// reference that the engine adapter and the fast kernels are tested
// against. It is slow (no tiling, one goroutine).
type Reference struct {
	g    Geometry
	k, v [][]float32 // per layer: [tokens][KVHeads][HeadDim]
}

// NewReference returns an empty reference cache for geometry g.
func NewReference(g Geometry) *Reference {
	return &Reference{g: g, k: make([][]float32, g.Layers), v: make([][]float32, g.Layers)}
}

// Len returns the tokens of the last layer.
func (r *Reference) Len() int { return len(r.k[r.g.Layers-1]) / (r.g.KVHeads * r.g.HeadDim) }

// Prefill appends and attends causally in float64.
func (r *Reference) Prefill(ctx context.Context, layer int, q, k, v, out []float32) error {
	n := r.g.tokens(q)
	if err := r.g.check(layer, n, q, k, v, out); err != nil {
		return err
	}
	r.k[layer] = append(r.k[layer], k...)
	r.v[layer] = append(r.v[layer], v...)
	total := len(r.k[layer]) / (r.g.KVHeads * r.g.HeadDim)
	base := total - n
	d, grp := r.g.HeadDim, r.g.Heads/r.g.KVHeads
	scale := 1 / math.Sqrt(float64(d))
	w := make([]float64, total)
	acc := make([]float64, d)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		pos := base + i
		for h := range r.g.Heads {
			kvh := h / grp
			qh := q[(i*r.g.Heads+h)*d:][:d]
			m := math.Inf(-1)
			for t := 0; t <= pos; t++ {
				kt := r.k[layer][(t*r.g.KVHeads+kvh)*d:][:d]
				var s float64
				for j := range d {
					s += float64(qh[j]) * float64(kt[j])
				}
				w[t] = s * scale
				m = max(m, w[t])
			}
			var sum float64
			clear(acc)
			for t := 0; t <= pos; t++ {
				e := math.Exp(w[t] - m)
				sum += e
				vt := r.v[layer][(t*r.g.KVHeads+kvh)*d:][:d]
				for j := range d {
					acc[j] += e * float64(vt[j])
				}
			}
			o := out[(i*r.g.Heads+h)*d:][:d]
			for j := range d {
				o[j] = float32(acc[j] / sum)
			}
		}
	}
	return nil
}

// Decode is Prefill of one token.
func (r *Reference) Decode(ctx context.Context, layer int, q, k, v, out []float32) error {
	if r.g.tokens(q) != 1 {
		return errors.New("attention: decode takes one token")
	}
	return r.Prefill(ctx, layer, q, k, v, out)
}

// KV returns layer's cached keys and values ([tokens][KVHeads][HeadDim]),
// in place.
func (r *Reference) KV(layer int) (k, v []float32) { return r.k[layer], r.v[layer] }

// Dense is a dense attention over a KV cache held in float32, computed with
// the tiled float32 kernel of the prefill path on workers goroutines: the
// fast full-attention baseline, and a recorder of the keys and values to
// load into another Attention (see EngineAttention.Load).
type Dense struct {
	g       Geometry
	workers int
	k, v    [][]float32
}

// NewDense returns an empty dense cache (workers 0: GOMAXPROCS).
func NewDense(g Geometry, workers int) *Dense {
	return &Dense{g: g, workers: workers, k: make([][]float32, g.Layers), v: make([][]float32, g.Layers)}
}

// Len returns the tokens of the last layer.
func (a *Dense) Len() int { return len(a.k[a.g.Layers-1]) / (a.g.KVHeads * a.g.HeadDim) }

// Prefill appends and attends causally.
func (a *Dense) Prefill(ctx context.Context, layer int, q, k, v, out []float32) error {
	n := a.g.tokens(q)
	if err := a.g.check(layer, n, q, k, v, out); err != nil {
		return err
	}
	a.k[layer] = append(a.k[layer], k...)
	a.v[layer] = append(a.v[layer], v...)
	base := len(a.k[layer])/(a.g.KVHeads*a.g.HeadDim) - n
	return causalAttention(ctx, a.workers, a.g, q, n, a.k[layer], a.v[layer], base, out)
}

// Decode is Prefill of one token.
func (a *Dense) Decode(ctx context.Context, layer int, q, k, v, out []float32) error {
	if a.g.tokens(q) != 1 {
		return errors.New("attention: decode takes one token")
	}
	return a.Prefill(ctx, layer, q, k, v, out)
}

// KV returns layer's cached keys and values ([tokens][KVHeads][HeadDim]),
// in place.
func (a *Dense) KV(layer int) (k, v []float32) { return a.k[layer], a.v[layer] }

// causalAttention writes into out the attention of n queries (q:
// [n][Heads][D]) at positions base..base+n-1 over the keys and values k, v
// ([base+n][KVHeads][D]), each query seeing positions up to its own
// (kernels.CausalAttention, on workers goroutines).
func causalAttention(ctx context.Context, workers int, g Geometry, q []float32, n int, k, v []float32, base int, out []float32) error {
	return kernels.CausalAttention(ctx, workers, kernels.CausalShape{Heads: g.Heads, KVHeads: g.KVHeads, HeadDim: g.HeadDim}, q, n, k, v, base, out)
}

// NewDenseFrom returns a dense cache that starts with the first tokens
// tokens of src's keys and values ([NewDense]'s otherwise): a prefill
// into it continues after them. It shares src's memory until its first
// append, which copies (src is never written).
func NewDenseFrom(g Geometry, workers int, src KVSource, tokens int) *Dense {
	a := NewDense(g, workers)
	n := tokens * g.KVHeads * g.HeadDim
	for l := range g.Layers {
		k, v := src.KV(l)
		a.k[l], a.v[l] = slices.Clip(k[:n]), slices.Clip(v[:n])
	}
	return a
}
