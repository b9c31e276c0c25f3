package completion

// The prompt side of a scheduler iteration: which jobs prefill how many
// tokens within the iteration's time (prefillLimit, the latency budget
// of itlbudget.go), and the chunks whose layers spread over iterations.

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/questrt/questrt/model"
)

// prefillLimit is the time an iteration's prefill may take
// (Config.MaxITLFactor), when on.
type prefillLimit struct {
	on bool
	// seconds is the prefill time left to the iteration: its allowance
	// and the credit of the iterations held before it.
	seconds float64
	// allowance is the iteration's own share of seconds (set whenever
	// the bound is configured: a prompt that starts decoding mid-iteration
	// turns it on).
	allowance float64
	// force makes the first chunk at least one token, whatever it is
	// predicted to cost.
	force bool
}

// prefill runs up to budget prompt tokens of the jobs still
// prefilling, shortest remaining prompt first, a chunk per job; a job
// whose prompt is done moves its keys and values into the engine and
// samples its first token. With lim on, the chunks prefilled on the
// CPU are also cut to what fits lim's time by s.itl's costs; when not
// even one token fits, the iteration prefills nothing (held: the
// caller banks its allowance, so that the token runs once the credit
// covers it) unless lim.force makes its first chunk a token. When no
// whole chunk worth its fixed cost fits itlMaxSpend allowances (a long
// context's), a chunk's layers run over the next iterations instead
// (itlBudget.split, prefillLayers), a layer's share of its time in an
// iteration. A prompt finished here starts decoding: its first token is out, so the chunks
// after it are bounded by lim's allowance even when lim was off. Chunks
// prefilled on the device (Config.Prefiller) keep the token bounds
// alone: their time is mostly per chunk, not per token, which the
// fitted line per token would shrink towards one token per iteration.
// On a cluster a job's prefill starts once its sequence is created
// (startCreate). It reports the prompt tokens it ran (a chunk's when
// its last layer ran), whether it ran a chunk or ended a job, whether a
// prompt waited for want of time, and whether it ran layers of a chunk
// spread over iterations (itlBudget.split) that did not finish it.
func (s *Server) prefill(budget int, lim prefillLimit) (int, bool, bool, bool) {
	worked := false
	ranChunk := false
	held := false
	layered := false
	total := budget
	// Shortest remaining prompt first (the older among equals): a short
	// prompt that arrives while a long one is being prefilled gets the
	// chunks until it is done, so its time to first token is about its
	// own prefill, not the long one's. A long prompt waits while shorter
	// ones keep arriving.
	var pending []*job
	for _, j := range s.live() {
		if j.attn == nil && j.leader == nil { // a fork waits for its leader's prompt
			pending = append(pending, j)
		}
	}
	slices.SortStableFunc(pending, func(a, b *job) int {
		return cmp.Compare(len(a.p.ids)-a.filled, len(b.p.ids)-b.filled)
	})
	for _, j := range pending {
		if j.ended {
			continue
		}
		// With echo and logprobs, every position's logits: the prompt's
		// log-probabilities (the CPU's dense prefill gives them), unless
		// a retry prefills again what was already answered.
		all := j.p.echo && j.p.logprobs && j.tokens == 0
		onDevice := s.cfg.Prefiller != nil && !all
		if j.dense == nil && s.cfg.Cluster != nil && j.cseq == nil && !j.creating {
			// A cached prefix first: a hit forks its sequence on its
			// grid, and the prompt's suffix goes onto the fork (no
			// sequence to create).
			if err := s.prefixHit(j, onDevice, all); err != nil {
				s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
				continue
			}
		}
		if j.dense == nil && s.cfg.Cluster != nil && j.cseq == nil {
			// The sequence first: a cluster without room for its grid
			// fails the request before its prefill runs. Its Create
			// (a grid opening, perhaps) runs off the scheduler.
			if !j.creating {
				s.startCreate(j)
			}
			continue
		}
		if budget == 0 {
			continue // other jobs may still have Creates to start
		}
		worked = true
		if j.dense == nil && j.pre == nil {
			if err := s.prefixHit(j, onDevice, all); err != nil {
				s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
				continue
			}
		}
		if j.dense == nil && j.pre == nil {
			// The first chunk (of the prompt, or of a retry's prefill:
			// j keeps its sampler).
			if onDevice {
				if err := s.create(j); err != nil {
					s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
					continue
				}
			} else {
				j.dense = model.NewDense(s.m.Geometry(), s.cfg.Workers)
			}
		}
		if j.sampler == nil && !s.start(j) {
			continue
		}
		// After the prefix lookup: a hit moves j.filled on.
		rest := min(budget, len(j.p.ids)-j.filled)
		n := rest
		split := false // a chunk whose layers spread over iterations
		if j.pass != nil {
			n = j.pass.Tokens()
		} else if lim.on && j.pre == nil {
			layers := s.m.Config.Layers
			if ns := min(rest, s.itl.split(j.filled, lim.allowance, layers)); ns > 0 && !all {
				// No whole chunk worth its fixed cost fits itlMaxSpend
				// allowances: this one's layers run over the next
				// iterations, once its first fits.
				if s.itl.cost(j.filled, ns)/float64(layers) <= lim.seconds {
					n, split = ns, true
				} else {
					n = 0
				}
			} else {
				n = min(rest, s.itl.tokens(j.filled, lim.seconds))
			}
			if !ranChunk && lim.force {
				n = max(n, min(1, rest)) // progress: a token whatever it costs
			}
			if n == 0 {
				held = true
				continue // its sequence is set up: it goes on in a later iteration
			}
		}
		if split || j.pass != nil {
			done, ok := s.prefillLayers(j, n, split, &lim, ranChunk)
			if !ok {
				continue // ended
			}
			if done == 0 {
				held = true
				continue
			}
			ranChunk = true
			if j.pass.Left() > 0 {
				layered = true
				continue // its next layers in a later iteration
			}
			budget -= n
			logits, err := j.passLogits()
			if err != nil {
				s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
				continue
			}
			j.filled += n
			if j.filled < len(j.p.ids) {
				continue
			}
			s.prompted(j, logits)
			continue
		}
		budget -= n
		ranChunk = true
		var logits []float32
		var err error
		t0 := time.Now()
		if j.pre != nil {
			logits, err = s.cfg.Prefiller.Prefill(j.ctx, j.pre, j.p.ids[j.filled:j.filled+n])
		} else {
			logits, err = s.m.Forward(j.ctx, j.dense, j.p.ids[j.filled:j.filled+n], model.ForwardOptions{AllLogits: all})
		}
		if s.itl != nil && err == nil && j.pre == nil {
			took := time.Since(t0)
			if s.hooks.prefillTook != nil {
				took = s.hooks.prefillTook(j.filled, n)
			}
			s.observeChunk(j, n, took, lim.on, false)
			lim.seconds -= took.Seconds()
		}
		s.count(func(st *Stats) { st.PrefillChunks++; st.PromptTokens += uint64(n) })
		if err != nil {
			s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
			continue
		}
		if all {
			logits = s.promptLogprobs(j, logits, n)
		}
		j.filled += n
		if j.filled < len(j.p.ids) {
			continue
		}
		s.prompted(j, logits)
		if s.itl != nil && !lim.on && j.attn != nil && !j.ended {
			// j's first token is out: the rest of the iteration's
			// prefill is in its first gap, so the bound holds from here
			// (the jobs after j in the order are longer prompts, whose
			// whole chunk would otherwise follow it).
			lim.on, lim.seconds = true, lim.allowance
		}
	}
	return total - budget, worked, held && !ranChunk, layered
}

// observeChunk records a CPU prompt chunk of n tokens after j.filled
// that took took (its layers' times together, for a chunk spread over
// iterations: spread) in the latency budget, and logs it.
func (s *Server) observeChunk(j *job, n int, took time.Duration, decoding, spread bool) {
	s.itl.observePrefill(j.filled, n, took)
	s.log.Debug("prefill chunk", "request", j.id, "context", j.filled, "tokens", n, "took", took, "decoding", decoding, "spread", spread,
		"fixed_cost", time.Duration(s.itl.fixedCost()*1e9), "decode_step", time.Duration(s.itl.decode*1e9))
}

// prefillLayers runs layers of j's chunk of n tokens after j.filled
// whose layers spread over iterations (itlBudget.split): a new one when
// start (j.pass nil), else j.pass's next. Beside decoding streams it
// runs the layers whose share of the chunk's predicted time fits
// lim.seconds (one, forced, when none does and no chunk ran yet in the
// iteration; none, and the prompt holds, otherwise); with no stream
// decoding, all that are left. It returns the layers it ran and false
// when j ended (a failed layer). Once the last layer has run, j.pass
// stays for passLogits, the chunk is observed, and counted.
func (s *Server) prefillLayers(j *job, n int, start bool, lim *prefillLimit, ranChunk bool) (int, bool) {
	if start {
		p, err := s.m.StartPass(j.dense, j.p.ids[j.filled:j.filled+n])
		if err != nil {
			s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
			return 0, false
		}
		j.pass, j.passTook = p, 0
	}
	layers := s.m.Config.Layers
	k := j.pass.Left()
	if lim.on {
		per := s.itl.cost(j.filled, n) / float64(layers)
		if per > 0 {
			k = min(k, int(lim.seconds/per))
		}
		if k <= 0 && !ranChunk && lim.force {
			k = 1 // progress
		}
		if k <= 0 {
			return 0, true
		}
	}
	t0 := time.Now()
	err := j.pass.Run(j.ctx, k)
	took := time.Since(t0)
	if err != nil {
		s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
		return k, false
	}
	if s.hooks.prefillTook != nil {
		took = s.hooks.prefillTook(j.filled, n) * time.Duration(k) / time.Duration(layers)
	}
	j.passTook += took
	lim.seconds -= took.Seconds()
	if j.pass.Left() == 0 {
		s.observeChunk(j, n, j.passTook, lim.on, true)
		s.count(func(st *Stats) { st.PrefillChunks++; st.PromptTokens += uint64(n) })
	}
	return k, true
}

// passLogits returns the logits of j's chunk spread over iterations once
// its last layer has run, and clears it.
func (j *job) passLogits() ([]float32, error) {
	p := j.pass
	j.pass, j.passTook = nil, 0
	return p.Logits()
}
