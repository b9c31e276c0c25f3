package model

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/questrt/questrt/kernels"
)

// Sampler picks the next token from logits: greedy (Temperature 0) or
// softmax sampling at a temperature, restricted to the TopK most likely
// tokens, then to the smallest set of the most likely whose probability
// (among those) reaches TopP, then to the tokens at least MinP times as
// likely as the most likely one (vLLM's order). A sampler is
// deterministic for a seed; it is not safe for concurrent use.
type Sampler struct {
	Temperature float64 // 0: greedy
	TopP        float64 // (0, 1]; 0 or 1: no nucleus restriction
	// TopK keeps the K most likely tokens; 0: all. MinP, in [0, 1],
	// drops the tokens less likely than MinP times the most likely; 0:
	// none. A device samples without them (Params): set them only where
	// the host samples.
	TopK int
	MinP float64
	rng  *rand.Rand
	idx  []int
	p    []float64
}

// NewSampler returns a sampler seeded with seed.
func NewSampler(temperature, topP float64, seed uint64) (*Sampler, error) {
	if !(temperature >= 0) || math.IsInf(temperature, 0) {
		return nil, fmt.Errorf("sampler: temperature %v (want >= 0)", temperature)
	}
	if !(topP >= 0 && topP <= 1) {
		return nil, fmt.Errorf("sampler: top-p %v (want 0..1)", topP)
	}
	return &Sampler{Temperature: temperature, TopP: topP, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, nil
}

// Argmax returns the index of the largest logit (the lowest index among
// ties).
func Argmax(logits []float32) int {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return best
}

// Sample returns the next token.
func (s *Sampler) Sample(logits []float32) int {
	if s.Temperature == 0 {
		return Argmax(logits)
	}
	return s.SampleU(logits, s.rng.Float64())
}

// Params advances the sampler's stream as Sample would and returns the
// parameters with which a device samples the token Sample would have
// returned (kernels.ModelDevice.Sample; kernels.SampleRow states the
// rule): U is the draw Sample would have used (0, and nothing drawn,
// when greedy).
func (s *Sampler) Params() kernels.SampleParams {
	p := kernels.SampleParams{Temperature: s.Temperature, TopP: s.TopP}
	if s.Temperature != 0 {
		p.U = s.rng.Float64()
	}
	return p
}

// SampleU is Sample with the uniform draw u in [0, 1) given instead of
// taken from the stream (Temperature must not be 0).
func (s *Sampler) SampleU(logits []float32, u float64) int {
	n := len(logits)
	s.idx = s.idx[:0]
	for i := range n {
		s.idx = append(s.idx, i)
	}
	// Most likely first; ties by lower id, so the order is deterministic.
	slices.SortFunc(s.idx, func(a, b int) int {
		switch {
		case logits[a] > logits[b]:
			return -1
		case logits[a] < logits[b]:
			return 1
		}
		return a - b
	})
	m := float64(logits[s.idx[0]])
	s.p = s.p[:0]
	var sum float64
	for _, i := range s.idx {
		e := math.Exp((float64(logits[i]) - m) / s.Temperature)
		s.p = append(s.p, e)
		sum += e
	}
	keep := n
	if s.TopK > 0 && s.TopK < keep {
		keep = s.TopK
		sum = 0
		for _, e := range s.p[:keep] {
			sum += e
		}
	}
	if s.TopP > 0 && s.TopP < 1 {
		var c float64
		for j, e := range s.p[:keep] {
			c += e / sum
			if c >= s.TopP {
				keep = j + 1
				break
			}
		}
		sum = 0
		for _, e := range s.p[:keep] {
			sum += e
		}
	}
	if s.MinP > 0 {
		// s.p[0] is the most likely token's (unnormalized) probability.
		for j := 1; j < keep; j++ {
			if s.p[j] < s.MinP*s.p[0] {
				keep = j
				break
			}
		}
		sum = 0
		for _, e := range s.p[:keep] {
			sum += e
		}
	}
	u *= sum
	for j, e := range s.p[:keep] {
		u -= e
		if u < 0 {
			return s.idx[j]
		}
	}
	return s.idx[keep-1]
}

// GenerateOptions tune Generate.
type GenerateOptions struct {
	// MaxTokens is the most tokens generated (at least 1).
	MaxTokens int
	// Sampler picks tokens (nil: greedy).
	Sampler *Sampler
	// StopTokens end generation when produced (the stop token is
	// returned).
	StopTokens []int
	// OnToken, when set, is called after every token with its index (0
	// for the token the prefill's logits gave; token i > 0 came from
	// decode step i, whose Attention statistics are current) and id; an
	// error stops generation and is returned.
	OnToken func(i, id int) error
	// Prefill and Decode, when set, accumulate the prefill's and the
	// decode steps' times.
	Prefill, Decode *Timing
}

// Generate prefills prompt (after the tokens attn already holds) and
// generates up to MaxTokens tokens with decode steps, returning them.
func (m *Model) Generate(ctx context.Context, attn Attention, prompt []int, opt GenerateOptions) ([]int, error) {
	if opt.MaxTokens < 1 {
		return nil, fmt.Errorf("%w: max tokens %d (want at least 1)", ErrBadInput, opt.MaxTokens)
	}
	logits, err := m.Forward(ctx, attn, prompt, ForwardOptions{Timing: opt.Prefill})
	if err != nil {
		return nil, fmt.Errorf("prefill: %w", err)
	}
	return m.Continue(ctx, attn, logits, opt)
}

// Continue generates up to MaxTokens tokens after a prefill whose last
// logits are given: the first token is sampled from them, each later one
// from a decode step on the token before. Forks of one prefilled
// sequence can so continue with different attention settings.
func (m *Model) Continue(ctx context.Context, attn Attention, logits []float32, opt GenerateOptions) ([]int, error) {
	if opt.MaxTokens < 1 {
		return nil, fmt.Errorf("%w: max tokens %d (want at least 1)", ErrBadInput, opt.MaxTokens)
	}
	s := opt.Sampler
	if s == nil {
		s = &Sampler{}
	}
	var out []int
	for i := range opt.MaxTokens {
		id := s.Sample(logits)
		out = append(out, id)
		if opt.OnToken != nil {
			if err := opt.OnToken(i, id); err != nil {
				return out, err
			}
		}
		if slices.Contains(opt.StopTokens, id) || i == opt.MaxTokens-1 {
			break
		}
		var err error
		if logits, err = m.Forward(ctx, attn, []int{id}, ForwardOptions{Timing: opt.Decode}); err != nil {
			return out, fmt.Errorf("decode step %d: %w", i+1, err)
		}
	}
	return out, nil
}
