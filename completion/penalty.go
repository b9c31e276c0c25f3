package completion

// Penalty bounds, vLLM's (SamplingParams): repetition_penalty in
// (0, 2], frequency_penalty and presence_penalty in [-2, 2] (OpenAI's).
const (
	maxRepetitionPenalty = 2
	maxPenalty           = 2
)

// penalties are a choice's repetition, frequency and presence
// penalties and the tokens they read, applied to the logits of every
// step before the temperature, top-k, top-p and min-p, with vLLM's
// semantics: a token of the prompt or of the output so far has its
// logit divided by the repetition penalty when positive and multiplied
// by it otherwise; then every token's logit loses frequency x its count
// in the output and presence once if it is in the output. Log
// probabilities stay those of the model's logits (vLLM's default
// raw_logprobs). A penalties is used on the scheduler's goroutine only.
type penalties struct {
	repetition, frequency, presence float64
	// inPrompt marks the prompt's token ids (repetition only); counts
	// are the output's tokens by id.
	inPrompt []bool
	counts   []int32
	// out is the penalized copy of the last logits.
	out []float32
}

// newPenalties returns the penalties of p for a choice of prompt ids in
// a vocabulary of vocab ids, or nil when they are neutral (1, 0, 0).
func newPenalties(p params, prompt []int, vocab int) *penalties {
	if !p.penalized() {
		return nil
	}
	pp := &penalties{repetition: p.repetitionPenalty, frequency: p.frequencyPenalty, presence: p.presencePenalty,
		counts: make([]int32, vocab), out: make([]float32, vocab)}
	if pp.repetition != 1 {
		pp.inPrompt = make([]bool, vocab)
		for _, id := range prompt {
			pp.inPrompt[id] = true
		}
	}
	return pp
}

// add counts the output token id.
func (pp *penalties) add(id int) {
	if pp != nil && id >= 0 && id < len(pp.counts) {
		pp.counts[id]++
	}
}

// apply returns logits penalized (logits itself when pp is nil): a
// copy, so that the log probabilities still read the model's logits.
// The arithmetic is float32, as vLLM's on float32 logits.
func (pp *penalties) apply(logits []float32) []float32 {
	if pp == nil {
		return logits
	}
	out := pp.out[:len(logits)]
	rep, freq, pres := float32(pp.repetition), float32(pp.frequency), float32(pp.presence)
	for i, v := range logits {
		c := int32(0)
		if i < len(pp.counts) {
			c = pp.counts[i]
		}
		if rep != 1 && (c > 0 || (i < len(pp.inPrompt) && pp.inPrompt[i])) {
			if v > 0 {
				v /= rep
			} else {
				v *= rep
			}
		}
		if c > 0 {
			v -= freq*float32(c) + pres
		}
		out[i] = v
	}
	return out
}
