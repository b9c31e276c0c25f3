package model

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
)

// ErrBadInput marks a forward pass refused before it changed anything:
// a token id outside the vocabulary, no tokens, too many positions.
var ErrBadInput = errors.New("model: bad input")

type layerWeights struct {
	attnNorm, mlpNorm []float32 // [H]
	wq                []float32 // [Heads*D][H]
	wk, wv            []float32 // [KVHeads*D][H]
	wo                []float32 // [H][Heads*D]
	gate, up          []float32 // [I][H]
	down              []float32 // [H][I]
}

// Model is a Llama-family decoder (LlamaForCausalLM) on the CPU in
// float32: token embedding, RMSNorm, GQA attention with rotate-half RoPE
// through an [Attention], SwiGLU MLP, final norm and LM head. The weights
// are read-only: one Model serves any number of sequences, each with its
// own Attention, from concurrent goroutines.
type Model struct {
	Config  Config
	ck      *Checkpoint
	embed   []float32 // [V][H]
	normW   []float32 // final norm
	lmHead  []float32 // [V][H]
	layers  []layerWeights
	rope    *rope
	workers int
	// MemoryLimit bounds the activations of one forward pass (bytes, 0:
	// the memory available now, -1: no check).
	MemoryLimit int64
}

// Close releases the mapped checkpoint.
func (m *Model) Close() error {
	if m.ck == nil {
		return nil
	}
	return m.ck.Close()
}

// norm is rmsNorm over n rows, in parallel.
func (m *Model) norm(y, x, w []float32, n int) {
	h := len(w)
	rows(m.workers, n, func(lo, hi int) { rmsNorm(y[lo*h:hi*h], x[lo*h:hi*h], w, hi-lo, m.Config.RMSNormEps) })
}

// Geometry returns the attention shape.
func (m *Model) Geometry() Geometry { return m.Config.Geometry() }

// ForwardOptions tune one forward pass.
type ForwardOptions struct {
	// AllLogits returns the logits of every token ([n][VocabSize]); by
	// default only the last token's.
	AllLogits bool
	// Timing, when set, receives the pass's wall times.
	Timing *Timing
}

// Timing splits a forward pass's wall time.
type Timing struct {
	// Attention is the time inside Attention calls; Total the whole pass.
	Attention, Total time.Duration
}

// mlpChunk is the tokens whose MLP intermediates are live at once.
const mlpChunk = 256

// ActivationBytes is the memory a forward pass over n tokens allocates.
func (c Config) ActivationBytes(n int) int64 {
	h, q, kv := int64(c.HiddenSize), int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim)
	nn := int64(n)
	per := memlimit.Mul(nn, 2*h+2*q+2*kv)                                       // x, xn, q, o, k, v
	mlp := memlimit.Mul(int64(min(n, mlpChunk)), 2*int64(c.IntermediateSize)+h) // gate, up, down out
	logits := memlimit.Mul(nn, int64(c.VocabSize))
	return memlimit.Mul(memlimit.Add(per, mlp, logits), 4)
}

// Forward runs tokens through the model after the attn.Len() tokens the
// sequence already holds, appending their keys and values to attn: a
// single token is a decode step (Attention.Decode), more tokens a
// prefill (Attention.Prefill); a decode step of a [BatchAttention] that
// can join a batch is one step of its Stepper. It returns the logits of the last token,
// or of every token with AllLogits. Bad input (ErrBadInput) and a pass
// over the memory limit change nothing; an error from attn in the middle
// of the layers leaves attn holding some layers' tokens and not others'
// (release it).
func (m *Model) Forward(ctx context.Context, attn Attention, tokens []int, opt ForwardOptions) ([]float32, error) {
	start := time.Now()
	n := len(tokens)
	pos0, err := m.checkPass(attn, tokens)
	if err != nil {
		return nil, err
	}
	a := m.newPass(tokens)
	qd, kvd := a.qd, a.kvd
	var attnTime time.Duration
	// A decode step of a BatchAttention is one step of its Stepper: one
	// Begin, one Layer per layer, one End.
	var g *stepGroup
	if n == 1 {
		if gs, _ := m.groupRows([]Attention{attn}); len(gs) == 1 {
			t0 := time.Now()
			if gs[0].begin(ctx) {
				g = gs[0]
				defer g.end(ctx)
			} // else Begin refused: Decode layer by layer names why
			attnTime += time.Since(t0)
		}
	}
	for li := range m.layers {
		q, k, v := m.attnInAt(a, li, pos0)
		t0 := time.Now()
		var err error
		switch {
		case g != nil:
			err = g.layer(ctx, li, q, k, v, a.o, qd, kvd)
			if err != nil && refusedAhead(err) {
				// Begin's refusal, learnt at the first layer: Decode
				// layer by layer names why, as after a refused Begin.
				g = nil
				err = attn.Decode(ctx, li, q, k, v, a.o)
			}
		default:
			err = m.attend(ctx, attn, a, li, q, k, v)
		}
		attnTime += time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("layer %d attention: %w", li, err)
		}
		m.attnOut(a, li)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	if g != nil {
		t0 := time.Now()
		err := g.end(ctx)
		attnTime += time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("layer %d attention: %w", len(m.layers)-1, err)
		}
	}
	first := 0
	if !opt.AllLogits {
		first = n - 1
	}
	logits := m.head(a, first)
	if opt.Timing != nil {
		opt.Timing.Attention += attnTime
		opt.Timing.Total += time.Since(start)
	}
	return logits, nil
}

// checkPass validates a pass over tokens after attn's tokens and
// returns the position of its first token: bad input (ErrBadInput) and
// a pass over the memory limit change nothing.
func (m *Model) checkPass(attn Attention, tokens []int) (int, error) {
	c := m.Config
	n := len(tokens)
	pos0 := attn.Len()
	if n == 0 {
		return 0, fmt.Errorf("%w: no tokens", ErrBadInput)
	}
	for i, t := range tokens {
		if t < 0 || t >= c.VocabSize {
			return 0, fmt.Errorf("%w: token %d at index %d outside the vocabulary of %d", ErrBadInput, t, i, c.VocabSize)
		}
	}
	if c.MaxPositions > 0 && pos0+n > c.MaxPositions {
		return 0, fmt.Errorf("%w: positions up to %d exceed max_position_embeddings %d", ErrBadInput, pos0+n, c.MaxPositions)
	}
	if err := memlimit.Check(fmt.Sprintf("model: activations of %d tokens", n), c.ActivationBytes(n), m.MemoryLimit); err != nil {
		return 0, err
	}
	return pos0, nil
}

// attnInAt is attnIn with RoPE applied at the rows' positions (the
// first at pos0).
func (m *Model) attnInAt(a *pass, li, pos0 int) (q, k, v []float32) {
	c := m.Config
	q, k, v = m.attnIn(a, li)
	qd, kvd := a.qd, a.kvd
	rows(m.workers, a.n, func(lo, hi int) {
		m.rope.apply(q[lo*qd:hi*qd], hi-lo, c.Heads, pos0+lo)
		m.rope.apply(k[lo*kvd:hi*kvd], hi-lo, c.KVHeads, pos0+lo)
	})
	return q, k, v
}

// attend runs layer li's attention of a pass's rows one layer at a time:
// a decode step for one row, a prefill for more.
func (m *Model) attend(ctx context.Context, attn Attention, a *pass, li int, q, k, v []float32) error {
	if a.n == 1 {
		return attn.Decode(ctx, li, q, k, v, a.o)
	}
	return attn.Prefill(ctx, li, q, k, v, a.o)
}

// Pass is a forward pass whose layers run a few at a time, in separate
// calls (Run), the calls of other sequences in between: the scheduler's
// way of spreading a prompt chunk over the iterations of the sequences
// that decode beside it. Its layers compute what Forward's do, in the
// same order, so that the logits are Forward's bit for bit, except that
// a decode row of a BatchAttention runs Decode layer by layer, never one
// step of its Stepper. Until the last layer has run, the attention holds
// the pass's tokens in its first layers and not in the others; nothing
// else may use it in between. Not safe for concurrent use.
type Pass struct {
	m    *Model
	attn Attention
	a    *pass
	pos0 int
	next int
}

// StartPass checks a forward pass over tokens after attn's tokens, as
// Forward does (bad input and a pass over the memory limit change
// nothing), and returns it with no layer run.
func (m *Model) StartPass(attn Attention, tokens []int) (*Pass, error) {
	pos0, err := m.checkPass(attn, tokens)
	if err != nil {
		return nil, err
	}
	return &Pass{m: m, attn: attn, a: m.newPass(tokens), pos0: pos0}, nil
}

// Tokens returns the tokens the pass runs.
func (p *Pass) Tokens() int { return p.a.n }

// Left returns the layers still to run.
func (p *Pass) Left() int { return len(p.m.layers) - p.next }

// Run runs the next k layers (at most those left). An error leaves the
// attention holding the pass's tokens in some layers and not in others
// (release it), as Forward's.
func (p *Pass) Run(ctx context.Context, k int) error {
	for range min(k, p.Left()) {
		li := p.next
		q, kk, v := p.m.attnInAt(p.a, li, p.pos0)
		if err := p.m.attend(ctx, p.attn, p.a, li, q, kk, v); err != nil {
			return fmt.Errorf("layer %d attention: %w", li, err)
		}
		p.m.attnOut(p.a, li)
		p.next++
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Logits returns the last token's logits once every layer has run.
func (p *Pass) Logits() ([]float32, error) {
	if p.Left() > 0 {
		return nil, fmt.Errorf("model: pass logits with %d layers left", p.Left())
	}
	return p.m.head(p.a, p.a.n-1), nil
}

// pass holds one forward pass's activations over n token rows: the
// residual stream x, its normed copy xn, the projections q, k, v and the
// attention output o, and the MLP's chunk buffers (mlpChunk rows).
type pass struct {
	n, h, qd, kvd, inter, cn int
	x, xn, q, o, k, v        []float32
	gate, up, tmp            []float32
}

// newPass allocates a pass over tokens, x holding their embeddings.
func (m *Model) newPass(tokens []int) *pass {
	c := m.Config
	n, h := len(tokens), c.HiddenSize
	a := &pass{n: n, h: h, qd: c.Heads * c.HeadDim, kvd: c.KVHeads * c.HeadDim, inter: c.IntermediateSize, cn: min(n, mlpChunk)}
	a.x = make([]float32, n*h)
	for i, t := range tokens {
		copy(a.x[i*h:(i+1)*h], m.embed[t*h:(t+1)*h])
	}
	a.xn = make([]float32, n*h)
	a.q = make([]float32, n*a.qd)
	a.o = make([]float32, n*a.qd)
	a.k = make([]float32, n*a.kvd)
	a.v = make([]float32, n*a.kvd)
	a.gate = make([]float32, a.cn*a.inter)
	a.up = make([]float32, a.cn*a.inter)
	a.tmp = make([]float32, a.cn*h)
	return a
}

// attnIn normalizes layer li's input and projects it to q, k and v
// (before RoPE, which the caller applies at its rows' positions).
func (m *Model) attnIn(a *pass, li int) (q, k, v []float32) {
	lw := &m.layers[li]
	m.norm(a.xn, a.x, lw.attnNorm, a.n)
	matmulT(m.workers, a.q, a.xn, lw.wq, a.n, a.h, a.qd)
	matmulT(m.workers, a.k, a.xn, lw.wk, a.n, a.h, a.kvd)
	matmulT(m.workers, a.v, a.xn, lw.wv, a.n, a.h, a.kvd)
	return a.q, a.k, a.v
}

// attnOut adds layer li's output projection of a.o and its MLP to the
// residual stream, mlpChunk rows at a time.
func (m *Model) attnOut(a *pass, li int) {
	lw := &m.layers[li]
	n, h, qd, inter, cn := a.n, a.h, a.qd, a.inter, a.cn
	// x += o @ wo^T, chunked through tmp.
	for c0 := 0; c0 < n; c0 += cn {
		c1 := min(c0+cn, n)
		matmulT(m.workers, a.tmp, a.o[c0*qd:c1*qd], lw.wo, c1-c0, qd, h)
		addTo(a.x[c0*h:c1*h], a.tmp[:(c1-c0)*h])
	}
	m.norm(a.xn, a.x, lw.mlpNorm, n)
	for c0 := 0; c0 < n; c0 += cn {
		c1 := min(c0+cn, n)
		cnt := c1 - c0
		matmulT(m.workers, a.gate, a.xn[c0*h:c1*h], lw.gate, cnt, h, inter)
		matmulT(m.workers, a.up, a.xn[c0*h:c1*h], lw.up, cnt, h, inter)
		rows(m.workers, cnt, func(lo, hi int) { siluMul(a.gate[lo*inter:hi*inter], a.up[lo*inter:hi*inter]) })
		matmulT(m.workers, a.tmp, a.gate[:cnt*inter], lw.down, cnt, inter, h)
		addTo(a.x[c0*h:c1*h], a.tmp[:cnt*h])
	}
}

// head returns the logits of rows first..n-1: the final norm and the LM
// head.
func (m *Model) head(a *pass, first int) []float32 {
	nl, h := a.n-first, a.h
	m.norm(a.xn[:nl*h], a.x[first*h:], m.normW, nl)
	logits := make([]float32, nl*m.Config.VocabSize)
	matmulT(m.workers, logits, a.xn[:nl*h], m.lmHead, nl, h, m.Config.VocabSize)
	return logits
}
