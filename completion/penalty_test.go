package completion

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// penaltyRef is the penalties of vLLM's sampler in float64, written
// from its definition: a token of the prompt or the output has its logit
// divided by rep when positive, else multiplied by it; then every token
// loses freq x its count in the output, and pres once if it is there.
func penaltyRef(logits []float32, prompt, output []int, rep, freq, pres float64) []float64 {
	count := map[int]int{}
	for _, id := range output {
		count[id]++
	}
	out := make([]float64, len(logits))
	for i, l := range logits {
		x := float64(l)
		if slices.Contains(prompt, i) || count[i] > 0 {
			if x > 0 {
				x /= rep
			} else {
				x *= rep
			}
		}
		x -= freq * float64(count[i])
		if count[i] > 0 {
			x -= pres
		}
		out[i] = x
	}
	return out
}

// applied runs newPenalties over a prompt and an output history.
func applied(logits []float32, prompt, output []int, rep, freq, pres float64) []float32 {
	p := params{repetitionPenalty: rep, frequencyPenalty: freq, presencePenalty: pres}
	pp := newPenalties(p, prompt, len(logits))
	for _, id := range output {
		pp.add(id)
	}
	return pp.apply(logits)
}

// TestPenaltiesByHand: one case worked by hand. Logits [2, -1, 0.5, 3],
// prompt {0}, output 1, 1, 3; repetition 2, frequency 0.5, presence 0.25:
// token 0 (prompt) 2/2 = 1; token 1 (twice, negative) -1*2 - 0.5*2 -
// 0.25 = -3.25; token 2 unseen 0.5; token 3 (once) 3/2 - 0.5 - 0.25 =
// 0.75. The logits passed in are not changed.
func TestPenaltiesByHand(t *testing.T) {
	logits := []float32{2, -1, 0.5, 3}
	got := applied(logits, []int{0}, []int{1, 1, 3}, 2, 0.5, 0.25)
	if want := []float32{1, -3.25, 0.5, 0.75}; !slices.Equal(got, want) {
		t.Errorf("penalized %v, want %v", got, want)
	}
	if !slices.Equal(logits, []float32{2, -1, 0.5, 3}) {
		t.Errorf("the logits changed: %v", logits)
	}
	// Neutral values: no penalties at all.
	if pp := newPenalties(params{repetitionPenalty: 1}, []int{0}, 4); pp != nil {
		t.Errorf("neutral penalties: %+v, want nil", pp)
	}
}

// TestPenaltiesReference: random logits, prompts, outputs and penalties
// over their whole ranges against the float64 reference.
func TestPenaltiesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	for trial := range 300 {
		vocab := 1 + rng.IntN(64)
		logits := make([]float32, vocab)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 8)
			if rng.IntN(10) == 0 {
				logits[i] = 0
			}
		}
		var prompt, output []int
		for range rng.IntN(20) {
			prompt = append(prompt, rng.IntN(vocab))
		}
		for range rng.IntN(30) {
			output = append(output, rng.IntN(vocab))
		}
		rep := 0.01 + rng.Float64()*(maxRepetitionPenalty-0.01)
		freq, pres := (rng.Float64()*2-1)*maxPenalty, (rng.Float64()*2-1)*maxPenalty
		switch trial % 4 { // each penalty alone too
		case 1:
			freq, pres = 0, 0
		case 2:
			rep, pres = 1, 0
		case 3:
			rep, freq = 1, 0
		}
		got := applied(logits, prompt, output, rep, freq, pres)
		want := penaltyRef(logits, prompt, output, rep, freq, pres)
		for i := range want {
			if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5*math.Max(1, math.Abs(want[i])) {
				t.Fatalf("trial %d (rep %v freq %v pres %v), token %d: %v, reference %v", trial, rep, freq, pres, i, got[i], want[i])
			}
		}
	}
}

// TestPenaltiesServed: a greedy completion of the passkey prompt with
// frequency and presence penalties picks, at every step, the token whose
// model log-probability (the logprobs stay the model's) less the
// penalties of the tokens generated before it is the largest among the
// step's returned alternatives; without them the greedy text repeats
// tokens, with them it differs. A repetition penalty changes the greedy
// text too; the bad values are refused (TestBadRequests).
func TestPenaltiesServed(t *testing.T) {
	m, tok, dir := passkeyModel(t)
	s, ts := startServer(t, m, tok, testConfig("passkey"))
	prompt, _ := passkeyPrompt(t, dir)
	req := func(extra map[string]any) Completion {
		r := map[string]any{"model": "passkey", "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 5}
		for k, v := range extra {
			r[k] = v
		}
		return complete(t, ts.URL, r)
	}
	plain := req(nil)
	const freq, pres = 1.5, 0.5
	pen := req(map[string]any{"frequency_penalty": freq, "presence_penalty": pres})
	rep := req(map[string]any{"repetition_penalty": 1.8})
	if plain.Choices[0].Text == pen.Choices[0].Text || plain.Choices[0].Text == rep.Choices[0].Text {
		t.Errorf("greedy %q; with frequency/presence penalties %q, with a repetition penalty %q: want both changed", plain.Choices[0].Text, pen.Choices[0].Text, rep.Choices[0].Text)
	}
	lp := pen.Choices[0].Logprobs
	if lp == nil || len(lp.Tokens) != 24 {
		t.Fatalf("penalized logprobs %+v, want 24 tokens", lp)
	}
	lps := make([]float64, len(lp.Tokens))
	for i, l := range lp.TokenLogprobs {
		lps[i] = *l
	}
	checkPenalizedPicks(t, "completion", lp.Tokens, lps, lp.TopLogprobs, freq, pres)
	plainCount := map[string]int{}
	repeats := false
	for _, token := range plain.Choices[0].Logprobs.Tokens {
		plainCount[token]++
		repeats = repeats || plainCount[token] > 1
	}
	if !repeats {
		t.Errorf("the greedy text %q repeats no token: the test shows nothing", plain.Choices[0].Text)
	}
	waitStats(t, s, "the requests done", func(st Stats) bool { return st.Running+st.Queued == 0 })
}

// checkPenalizedPicks checks greedy picks against frequency and presence
// penalties from the outside: at step i the picked token's model
// log-probability less freq x its count in the tokens before and pres
// once if it is among them must be the largest such score among the
// step's alternatives (penalties on logits shift log-probabilities
// alike, the normalization being the same for every token of a step).
func checkPenalizedPicks(t *testing.T, what string, tokens []string, lps []float64, tops []map[string]float64, freq, pres float64) {
	t.Helper()
	if len(lps) != len(tokens) || len(tops) != len(tokens) {
		t.Fatalf("%s: %d tokens, %d logprobs, %d alternatives", what, len(tokens), len(lps), len(tops))
	}
	count := map[string]int{}
	score := func(token string, l float64) float64 {
		s := l - freq*float64(count[token])
		if count[token] > 0 {
			s -= pres
		}
		return s
	}
	for i, token := range tokens {
		picked := score(token, lps[i])
		for alt, l := range tops[i] {
			if a := score(alt, l); a > picked+1e-4 {
				t.Errorf("%s step %d: picked %q (penalized %.4f), but %q scores %.4f", what, i, token, picked, alt, a)
			}
		}
		count[token]++
	}
}
