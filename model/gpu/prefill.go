package gpu

import (
	"context"
	"fmt"

	"github.com/questrt/questrt/decode"
)

// Prefiller runs the attention of prompt chunks where a sequence's pages
// live, with device tensors: engine.Engine.PrefillTensor (an in-process
// grid of one rank whose pages are on the executor's device).
type Prefiller interface {
	PrefillTensor(ctx context.Context, id decode.SeqID, layer int, q, k, v, o decode.Tensor) error
}

// DefaultPrefillChunk is the prompt tokens one prefill pass runs through
// the layers when Options.PrefillChunk is 0: enough rows for the
// projections to run on the tensor cores near their best (the weights
// stream once a chunk).
const DefaultPrefillChunk = 2048

// PrefillChunk is the most prompt tokens one Prefill pass runs through
// the layers (Options.PrefillChunk, or DefaultPrefillChunk).
func (x *Executor) PrefillChunk() int {
	if x.opt.PrefillChunk > 0 {
		return x.opt.PrefillChunk
	}
	return DefaultPrefillChunk
}

// Prefill runs tokens, the next tokens of sequence seq (which holds pos
// tokens), through every layer on the device, chunk by chunk
// (Options.PrefillChunk): the projections as GEMMs, each layer's keys
// and values appended to the sequence and the chunk's causal attention
// over the whole sequence run by pf where the pages are, nothing copied
// through the host. It returns the last token's logits (a host copy: the
// one synchronisation, besides the cos/sin uploads). Bad input
// (ErrBadInput) changes nothing; an error after the first layer ran
// leaves the sequence with the chunk in some layers: release it.
func (x *Executor) Prefill(ctx context.Context, pf Prefiller, seq decode.SeqID, tokens []int, pos int) ([]float32, error) {
	c := x.cfg
	switch {
	case len(tokens) == 0:
		return nil, fmt.Errorf("%w: prefill of no tokens", ErrBadInput)
	case pos < 0:
		return nil, fmt.Errorf("%w: prefill at position %d", ErrBadInput, pos)
	case c.MaxPositions > 0 && pos+len(tokens) > c.MaxPositions:
		return nil, fmt.Errorf("%w: prefill of %d tokens at position %d: positions up to %d exceed max_position_embeddings %d",
			ErrBadInput, len(tokens), pos, pos+len(tokens), c.MaxPositions)
	}
	for i, t := range tokens {
		if t < 0 || t >= c.VocabSize {
			return nil, fmt.Errorf("%w: prefill token %d at index %d outside the vocabulary of %d", ErrBadInput, t, i, c.VocabSize)
		}
	}
	h, qd, kvd, inter := c.HiddenSize, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.IntermediateSize
	eps := float32(c.RMSNormEps)
	be := x.be
	chunk := x.PrefillChunk()
	ids := make([]int32, 0, chunk)
	cs := make([]float32, 0, chunk*c.HeadDim)
	var last decode.Tensor
	var ph PrefillPhases
	if x.marker != nil {
		// Marks a failed call left queued.
		if _, err := x.marker.PhaseTimes(ctx); err != nil {
			return nil, fmt.Errorf("gpu: prefill phase marks: %w", err)
		}
	}
	for c0 := 0; c0 < len(tokens); c0 += chunk {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := min(chunk, len(tokens)-c0)
		ids, cs = ids[:0], cs[:0]
		for i, t := range tokens[c0 : c0+n] {
			ids = append(ids, int32(t))
			cs = x.rot(cs, pos+c0+i)
		}
		view := func(t decode.Tensor, width int) decode.Tensor { return t.Slice(0, n*width) }
		p := &x.pre
		xx, q, k, v, o := view(p.x, h), view(p.q, qd), view(p.k, kvd), view(p.v, kvd), view(p.o, qd)
		gate, up, csd := view(p.gate, inter), view(p.up, inter), view(p.cs, c.HeadDim)
		if err := be.UploadTensor(csd, cs); err != nil {
			return nil, fmt.Errorf("gpu: prefill rope cos/sin: %w", err)
		}
		if err := be.Embed(ctx, xx, x.embed, ids); err != nil {
			return nil, fmt.Errorf("gpu: prefill embed: %w", err)
		}
		if err := x.mark(ctx); err != nil {
			return nil, fmt.Errorf("gpu: prefill phase mark: %w", err)
		}
		for li := range x.layers {
			l := &x.layers[li]
			err := x.attnIn(ctx, l, xx, q, k, v, csd, n)
			if err == nil {
				err = x.mark(ctx)
			}
			if err == nil {
				err = pf.PrefillTensor(ctx, seq, li, q, k, v, o)
			}
			if err == nil {
				err = x.mark(ctx)
			}
			if err == nil {
				err = x.attnOut(ctx, l, xx, o, gate, up, n)
			}
			if err == nil {
				err = x.mark(ctx)
			}
			if err != nil {
				return nil, fmt.Errorf("gpu: prefill tokens %d..%d layer %d: %w", c0, c0+n-1, li, err)
			}
		}
		if x.marker != nil {
			if err := x.addChunkPhases(ctx, len(x.layers), &ph); err != nil {
				return nil, fmt.Errorf("gpu: prefill phase marks: %w", err)
			}
		}
		last = xx.Slice((n-1)*h, h)
	}
	logits := x.logits.Slice(0, c.VocabSize)
	if err := be.GemvNorm(ctx, x.head, last, x.norm, eps, 1, logits); err != nil {
		return nil, fmt.Errorf("gpu: prefill head: %w", err)
	}
	out, err := be.DownloadTensor(ctx, logits)
	if err != nil {
		return nil, fmt.Errorf("gpu: prefill logits: %w", err)
	}
	x.prePhases = ph
	return out, nil
}
