package completion

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/model"
)

// loop is the scheduler goroutine: iterations while there is work,
// asleep otherwise, until Close.
func (s *Server) loop() {
	defer close(s.exited)
	defer s.shutdown()
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		if !s.iterate() {
			select {
			case <-s.stop:
				return
			case <-s.wake:
			}
		}
	}
}

// iterate runs one scheduler iteration at a step boundary: jobs whose
// context ended leave, queued jobs join up to MaxRunning, then up to
// ChunkTokens prompt tokens are prefilled and every decoding job runs
// one decode step, together. It reports whether there was work (jobs
// waiting for their cluster sequence are not: their Create wakes the
// scheduler when it returns).
func (s *Server) iterate() bool {
	if s.hooks.iteration != nil {
		s.hooks.iteration(s.ctx)
		if s.ctx.Err() != nil {
			return false // closing: the loop stops
		}
	}
	resized := s.resizePool()
	s.mu.Lock()
	var gone []*job
	s.queue = slices.DeleteFunc(s.queue, func(j *job) bool {
		if j.ctx.Err() != nil {
			gone = append(gone, j)
			return true
		}
		return false
	})
	// In admission order; a request starts when its pages fit the pool
	// beside the running requests' (all its choices' at once), and the
	// queue waits behind it meanwhile (no request overtakes another).
	var dropped []*prefixEntry
	for len(s.running) < s.cfg.MaxRunning && len(s.queue) > 0 {
		j := s.queue[0]
		if g := j.g; !g.reserved {
			// Cached prefixes give way first: they never keep a
			// request that fits the pool waiting.
			dropped = append(dropped, s.evictPrefixes(g.pages)...)
			if s.reserved+g.pages > s.capacity() {
				break // resolve refused requests that never fit: pages free as running ones end
			}
			s.reserved += g.pages
			g.reserved = true
		}
		if j.clock.started.IsZero() { // a preempted job keeps its first start
			j.clock.started = time.Now()
		}
		s.running = append(s.running, j)
		s.queue = s.queue[1:]
	}
	running := slices.Clone(s.running)
	s.mu.Unlock()
	if len(dropped) > 0 {
		s.dropPrefixes(dropped, 0)
	}
	worked := len(gone) > 0 || resized
	for _, j := range gone {
		s.end(j, nil, s.ctxError(j.ctx), "")
	}
	if s.takeCreated() {
		worked = true
	}
	if len(running) == 0 {
		return worked
	}
	for _, j := range running {
		if j.ctx.Err() != nil && !j.ended {
			s.end(j, nil, s.ctxError(j.ctx), "")
			worked = true
		}
	}
	// The iteration's tokens: a decode token for every sequence that
	// decodes as it starts, then prompt tokens up to the rest of
	// MaxBatchedTokens (and at most ChunkTokens). A prompt finished here
	// decodes from the next iteration, so the budget holds.
	var decoding []*job
	for _, j := range running {
		if !j.ended && j.attn != nil {
			decoding = append(decoding, j)
		}
	}
	budget := s.cfg.ChunkTokens
	if b := s.cfg.MaxBatchedTokens; b > 0 {
		budget = max(0, min(budget, b-len(decoding)))
	}
	// Beside decoding sequences, MaxITLFactor bounds the prefill's time
	// too (s.itl): a decode step's worth times factor - 1, plus what the
	// iterations before left unspent when not even a token fitted.
	lim := prefillLimit{}
	if s.itl != nil {
		a, ok := s.itl.allowance()
		lim.allowance = a
		if len(decoding) > 0 {
			lim.on = true
			lim.seconds = a + s.itl.credit
			// A token at least: before a decode step is measured, with
			// factor 1 (no allowance), or after itlMaxHeld iterations
			// held.
			lim.force = !ok || a <= 0 || s.itl.mustRun()
		}
	}
	prefilled, ran, held, layered := s.prefill(budget, lim)
	if ran {
		worked = true
	}
	if lim.on {
		switch {
		case prefilled > 0 || layered:
			s.itl.ran()
		case held:
			s.itl.hold(lim.allowance)
		}
	}
	decoding = s.grow(decoding)
	t0 := time.Now()
	rows := s.decode(decoding)
	if s.itl != nil && rows > 0 {
		took := time.Since(t0)
		if s.hooks.decodeTook != nil {
			took = s.hooks.decodeTook(rows)
		}
		s.itl.observeDecode(took)
	}
	if rows > 0 {
		worked = true
	}
	if s.hooks.batched != nil && (rows > 0 || prefilled > 0) {
		s.hooks.batched(rows, prefilled)
	}
	return worked
}

// live returns the running jobs in admission order.
func (s *Server) live() []*job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.running)
}

// start sets up j's stop strings and sampler before its first token; a
// failure ends j.
func (s *Server) start(j *job) bool {
	j.text = newStopText(j.p.stops)
	sm, err := model.NewSampler(j.p.temperature, j.p.topP, j.p.seed)
	if err != nil { // resolve checked the ranges
		s.end(j, nil, internal(err), "")
		return false
	}
	sm.TopK, sm.MinP = j.p.topK, j.p.minP
	j.sampler = sm
	j.pen = newPenalties(j.p, j.p.ids, s.m.Config.VocabSize)
	return true
}

// prompted runs when j's prompt is prefilled (logits: its last
// position's): it loads the keys and values into j's sequence, forks
// that sequence for j's forks (the other choices of the prompt), each
// of which samples its first token from the same logits with its own
// sampler, and samples j's. With max_tokens 0 (echo) every choice ends
// with its echo instead. A retry's prompt (j has generated tokens)
// only loads: the tokens before j.next replay through decode steps.
func (s *Server) prompted(j *job, logits []float32) {
	if j.tokens > 0 {
		if err := s.load(j); err != nil {
			s.stepFailed(j, fmt.Errorf("load the prompt into the engine again: %w", err))
			return
		}
		j.replay = j.gen[:len(j.gen)-1]
		return
	}
	forks := j.forks
	j.forks = nil
	if j.p.maxTokens == 0 {
		j.dense = nil
		for _, f := range forks {
			if !f.ended {
				f.promptLP = j.promptLP
				s.echo(f)
				s.end(f, nil, nil, "length")
			}
		}
		s.echo(j)
		s.end(j, nil, nil, "length")
		return
	}
	if err := s.load(j); err != nil {
		j.forks = forks // end fails them with j
		s.stepFailed(j, fmt.Errorf("load the prompt into the engine: %w", err))
		return
	}
	for _, f := range forks {
		s.fork(j, f, logits)
	}
	s.echo(j)
	s.token(j, logits)
}

// fork gives f a fork of its leader j's sequence, prefilled with their
// prompt (sealed pages shared, the tail copied on write), and samples
// f's first token from the prompt's logits.
func (s *Server) fork(j, f *job, logits []float32) {
	if f.ended {
		return
	}
	a, err := j.attn.Fork()
	if err != nil {
		s.end(f, nil, s.stepError(f, fmt.Errorf("fork the prompt's sequence: %w", err)), "")
		return
	}
	j.eng.acquire()
	f.eng = j.eng
	f.attn = &jobAttention{EngineAttention: a, denseLayers: f.p.denseLayers, allDense: f.p.allDense}
	f.filled = len(f.p.ids)
	if !s.start(f) {
		return
	}
	f.promptLP = j.promptLP
	s.echo(f)
	s.token(f, logits)
}

// echo posts j's prompt (with echo), and its log-probabilities when
// asked, ahead of the completion.
func (s *Server) echo(j *job) {
	if !j.p.echo {
		return
	}
	j.lpQueue = append(j.lpQueue, j.promptLP...)
	j.post([]byte(j.p.echoText), nil)
}

// load creates j's engine sequence, on the main engine or, when j's
// selection options are not the main engine's, on an engine of its own,
// and appends the prefill's keys and values to it; on a cluster it
// appends them to the sequence the prefill's start created.
func (s *Server) load(j *job) error {
	if j.pre != nil {
		// Prefilled on the device, in place.
		j.attn, j.pre = j.pre, nil
		s.remember(j, nil)
		return nil
	}
	if j.base != nil {
		// The suffix of a cached prefix, prefilled on the CPU over the
		// prefix's keys: onto the fork of the prefix.
		j.attn, j.base = j.base, nil
		err := j.attn.Extend(j.dense)
		if err == nil {
			s.remember(j, j.dense)
		}
		j.dense = nil
		return err
	}
	if j.cseq != nil {
		ea := model.NewSequenceAttention(j.cseq, s.m.Geometry())
		j.cseq = nil
		ea.Budget = j.p.budget
		j.attn = &jobAttention{EngineAttention: ea, denseLayers: j.p.denseLayers, allDense: j.p.allDense}
		err := ea.Load(j.dense)
		if err == nil {
			s.remember(j, j.dense)
		}
		j.dense = nil
		return err
	}
	a, err := s.newAttention(j)
	if err != nil {
		return err
	}
	j.attn = a
	err = a.Load(j.dense)
	if err == nil {
		s.remember(j, j.dense)
	}
	j.dense = nil
	return err
}

// create makes j's sequence before its prompt, for a device prefill
// into it (j.pre).
func (s *Server) create(j *job) error {
	a, err := s.newAttention(j)
	if err != nil {
		return err
	}
	j.pre = a
	return nil
}

// newAttention creates an empty sequence for j on the main engine or,
// when j's selection options are not the main engine's, on an engine of
// its own, and holds that engine (j.eng).
func (s *Server) newAttention(j *job) (*jobAttention, error) {
	ref := s.main
	if j.p.own {
		var err error
		if ref, err = s.ownEngine(j); err != nil {
			return nil, err
		}
	}
	ref.acquire()
	ea, err := ref.eng.NewAttention(s.ctx, s.m.Geometry())
	if err != nil {
		ref.release()
		return nil, err
	}
	ea.Budget = j.p.budget
	j.eng = ref
	return &jobAttention{EngineAttention: ea, denseLayers: j.p.denseLayers, allDense: j.p.allDense}, nil
}

// decode runs one decode step for the jobs of decoding that are still
// running; it reports how many there were.
func (s *Server) decode(decoding []*job) int {
	var jobs []*job
	var attns []model.Attention
	var toks []int
	var replays []bool // rows that feed a retry's replayed token
	for _, j := range decoding {
		if !j.ended && j.attn != nil {
			tok := j.next
			if len(j.replay) > 0 {
				tok = j.replay[0]
			}
			jobs, attns, toks = append(jobs, j), append(attns, j.attn), append(toks, tok)
			replays = append(replays, len(j.replay) > 0)
		}
	}
	if len(jobs) == 0 {
		return 0
	}
	if s.mon != nil {
		for i, j := range jobs {
			if !replays[i] {
				j.attn.capture = s.sample(j)
			}
		}
	}
	var dec Decoder = s.m
	if s.cfg.Decoder != nil {
		dec = s.cfg.Decoder
	}
	var logits [][]float32
	var ids, greedy []int
	var err error
	if sd, ok := dec.(SamplingDecoder); ok {
		// The tokens picked on the device: no logits cross to the host
		// but those a request's logprobs need.
		params, want := make([]kernels.SampleParams, len(jobs)), make([]bool, len(jobs))
		for i, j := range jobs {
			if !replays[i] { // a replayed token's pick is thrown away: no draw
				params[i], want[i] = j.sampler.Params(), j.p.logprobs || j.p.hostSample()
			}
		}
		ids, greedy, logits, err = sd.DecodeSample(s.ctx, attns, toks, params, want)
		for i, j := range jobs {
			// The device samples without top_k and min_p: the host
			// draws again from the step's logits, with the same u (a
			// failed item has no logits).
			if len(ids) == len(jobs) && len(logits) == len(jobs) && !replays[i] && j.p.hostSample() && logits[i] != nil {
				if pl := j.pen.apply(logits[i]); j.p.temperature == 0 {
					ids[i] = model.Argmax(pl)
				} else {
					ids[i] = j.sampler.SampleU(pl, params[i].U)
				}
			}
		}
	} else {
		logits, err = dec.DecodeBatch(s.ctx, attns, toks)
	}
	if s.mon != nil {
		var be *model.BatchError
		errors.As(err, &be)
		for i, j := range jobs {
			if t := j.attn.capture; t != nil {
				j.attn.capture = nil
				s.submit(t, err == nil || (be != nil && be.Errs[i] == nil))
			}
		}
	}
	s.count(func(st *Stats) { st.Steps++; st.StepSequences += uint64(len(jobs)) })
	var be *model.BatchError
	if err != nil && !errors.As(err, &be) {
		for _, j := range jobs {
			s.stepFailed(j, fmt.Errorf("decode step: %w", err))
		}
		return len(jobs)
	}
	for i, j := range jobs {
		if be != nil && be.Errs[i] != nil {
			s.stepFailed(j, fmt.Errorf("decode step: %w", be.Errs[i]))
			continue
		}
		if replays[i] {
			// A token the lost sequence held, fed again: its logits
			// were used when it was first fed, its pages not counted
			// twice.
			j.replay = j.replay[1:]
			continue
		}
		sm := model.Summarize(j.attn.Steps(), s.cfg.Policy.PageSize)
		j.pagesRead += sm.PagesRead
		j.pagesTotal += sm.PagesTotal
		// Counted before the token goes out: the request's answer may
		// leave with it.
		s.count(func(st *Stats) { st.PagesRead += uint64(sm.PagesRead); st.PagesTotal += uint64(sm.PagesTotal) })
		j.readW += sm.Rho * float64(sm.PagesTotal)
		j.denseW += float64(sm.PagesTotal)
		if ids != nil {
			s.picked(j, ids[i], greedy[i], logits[i])
			continue
		}
		s.token(j, logits[i])
	}
	return len(jobs)
}

// token samples j's next token from logits and hands its text out; it
// ends j on a stop token, a stop string or max_tokens.
func (s *Server) token(j *job, logits []float32) {
	s.picked(j, j.sampler.Sample(j.pen.apply(logits)), model.Argmax(logits), logits)
}

// picked hands out j's next token id (greedy: the argmax it was picked
// beside; logits: the step's, needed only for logprobs) as token does.
func (s *Server) picked(j *job, id, greedy int, logits []float32) {
	if s.cfg.Observe != nil { // the timings are the observer's alone
		j.clock.tokenAt(time.Now())
	}
	stop := slices.Contains(s.stopIDs, id)
	if !stop {
		_, stop = slices.BinarySearch(j.p.stopTokens, id)
	}
	if !stop {
		s.logprob(j, logits, id)
	}
	if j.keep {
		j.out = append(j.out, id)
		j.argmax = append(j.argmax, greedy)
	}
	if s.retries() || j.g.grows {
		j.gen = append(j.gen, id)
	}
	j.tokens++
	j.next = id
	j.pen.add(id)
	s.count(func(st *Stats) { st.CompletionTokens++ })
	if stop {
		s.end(j, j.text.flush(), nil, "stop")
		return
	}
	out, stopped := j.text.add(model.TokenText(s.tok, id))
	switch {
	case stopped:
		s.end(j, out, nil, "stop")
	case j.tokens >= j.p.maxTokens:
		s.end(j, append(out, j.text.flush()...), nil, "length")
	default:
		if len(out) > 0 {
			j.post(out, nil)
		}
	}
}

// end takes j out of the server (queue or running), releases its
// sequence and pages, and hands its last text and result to the
// handler: a failure when err is set, else a completion with the
// finish reason.
func (s *Server) end(j *job, text []byte, err *apiError, finish string) {
	if j.ended {
		return
	}
	j.ended = true
	j.from = nil
	for _, a := range []**jobAttention{&j.attn, &j.pre, &j.base} {
		if *a != nil {
			if rerr := (*a).Release(); rerr != nil {
				s.log.Warn("release sequence", "request", j.id, "err", rerr)
			}
			*a = nil
		}
	}
	if j.cseq != nil {
		if rerr := j.cseq.Release(context.Background()); rerr != nil {
			s.log.Warn("release sequence", "request", j.id, "err", rerr)
		}
		j.cseq = nil
	}
	if j.eng != nil {
		j.eng.release()
		j.eng = nil
	}
	j.dense, j.pass = nil, nil
	if j.stopWake != nil {
		j.stopWake()
		j.stopWake = nil
	}
	res := result{err: err, usage: j.usage(), readW: j.readW, denseW: j.denseW}
	if err == nil {
		res.finish = finish
	}
	j.res = res
	g := j.g
	g.left--
	last := g.left == 0
	if err != nil && g.err == nil {
		g.err = err
	}
	s.mu.Lock()
	s.running = slices.DeleteFunc(s.running, func(x *job) bool { return x == j })
	s.queue = slices.DeleteFunc(s.queue, func(x *job) bool { return x == j })
	j.left = true
	if !j.creating {
		// A Create in flight settles its grid itself.
		s.settleGrid(j, false)
	}
	if last {
		// The request's last choice: its pages (forks share their
		// leader's) and its outcome.
		if g.reserved {
			s.reserved -= g.pages
			g.reserved = false
		}
		switch outcome(g.err) {
		case "completed":
			s.stats.Completed++
		case "timeout":
			s.stats.TimedOut++
		case "cancelled":
			s.stats.Cancelled++
		default:
			s.stats.Failed++
		}
	}
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	if j.keep {
		// Before the answer: a client that has it finds the record.
		s.hist.add(s.record(j, res, text))
	}
	// The result first: a handler woken by the context's end finds it.
	j.post(text, &res)
	j.cancel() // the job's context
	// Forks still waiting for j's prompt fail with it.
	forks := j.forks
	j.forks = nil
	for _, f := range forks {
		ferr := err
		if ferr == nil {
			ferr = internal(errors.New("the prompt's first choice ended before its prefill"))
		}
		s.end(f, nil, ferr, "")
	}
	if last {
		s.observe(g) // after the answer: it never waits for the observer
	}
}

// usage is j's token and page counts so far.
func (j *job) usage() Usage {
	u := Usage{PromptTokens: len(j.p.ids), CompletionTokens: j.tokens, TotalTokens: len(j.p.ids) + j.tokens,
		PagesRead: j.pagesRead, PagesTotal: j.pagesTotal, PromptTokensDetails: PromptTokensDetails{CachedTokens: j.cached}}
	if j.denseW > 0 {
		u.BytesReadVsDense = j.readW / j.denseW
	}
	return u
}

// shutdown fails every job left when the scheduler stops.
func (s *Server) shutdown() {
	s.mu.Lock()
	jobs := append(slices.Clone(s.running), s.queue...)
	s.mu.Unlock()
	for _, j := range jobs {
		s.end(j, nil, errStopped, "")
	}
	// Every job ended, so every Create's context is done.
	s.waitCreates()
	if s.pc != nil {
		drop, _ := s.pc.evict(0)
		s.dropPrefixes(drop, 0)
	}
}

// count updates the statistics.
func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

// statusClientGone marks a job whose client went away (no answer is
// written; the code is nginx's "client closed request").
const statusClientGone = 499

// ctxError is the failure of a job whose context ended: past its
// deadline (Config.RequestTimeout) 504 request_timeout naming the limit
// and questd's flag, else its client gone (the request's context
// cancelled).
func (s *Server) ctxError(ctx context.Context) *apiError {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		msg := "The request exceeded the server's request timeout."
		if d := s.cfg.RequestTimeout; d > 0 {
			msg = "The request exceeded the server's request timeout (questd --request-timeout " + d.String() + ", from its arrival to its last token)."
		}
		return &apiError{status: http.StatusGatewayTimeout, typ: typeTimeout, code: "request_timeout", message: msg}
	}
	return &apiError{status: statusClientGone, typ: typeInvalid, code: "client_closed_request", message: "The client closed the request."}
}

// outcome is how a request that ended with err ended: "completed"
// (nil), "timeout" (past Config.RequestTimeout), "cancelled" (its
// client gone) or "failed".
func outcome(err *apiError) string {
	switch {
	case err == nil:
		return "completed"
	case err.status == http.StatusGatewayTimeout:
		return "timeout"
	case err.status == statusClientGone:
		return "cancelled"
	}
	return "failed"
}

// retries reports whether a job whose grid is lost may run again
// (Config.GridRetries on a cluster): its tokens are kept for that.
func (s *Server) retries() bool { return s.cfg.Cluster != nil && s.cfg.GridRetries > 0 }

// stepFailed handles the failure of j's step (a decode step, or the
// load of its prefilled prompt): a loss of j's grid (ErrGridLost) runs
// j again on a new sequence when retry allows it, anything else ends j
// with the failure (a loss not retried saying why).
func (s *Server) stepFailed(j *job, err error) {
	if errors.Is(err, ErrGridLost) {
		// The cached prefixes of the lost grid went with it.
		s.dropLost()
	}
	retried, why := s.retry(j, err)
	if retried {
		return
	}
	if why != "" {
		err = fmt.Errorf("%w (%s)", err, why)
	}
	s.end(j, nil, s.stepError(j, err), "")
}

// retry, when err is the loss of j's grid, sets j to run again on a new
// sequence (Config.GridRetries) and reports true: the lost sequence
// released, the next iterations create a new one (startCreate), prefill
// the prompt into it and, when j had generated tokens, feed those
// before j.next through decode steps (j.replay) so that it holds what
// the lost one held; then j decodes on from j.next, its sampler, stop
// strings and text where they were. When err is a loss j may not run
// again after, it says why.
func (s *Server) retry(j *job, err error) (bool, string) {
	if s.cfg.Cluster == nil || j.ended || !errors.Is(err, ErrGridLost) || j.ctx.Err() != nil || s.ctx.Err() != nil {
		return false, ""
	}
	switch {
	case s.cfg.GridRetries == 0:
		return false, "not retried: grid retries are off"
	case j.p.n > 1:
		// The forks reserved only the pages they do not share: a new
		// sequence of their own would not fit the reservation.
		return false, fmt.Sprintf("not retried: the request's n = %d choices of a prompt share its pages on the lost grid", j.p.n)
	case j.retries >= s.cfg.GridRetries:
		return false, fmt.Sprintf("retried on a new grid %d times already", j.retries)
	}
	j.retries++
	s.count(func(st *Stats) { st.GridRetries++ })
	s.log.Warn("grid lost; running the request again on a new grid", "request", j.id, "retry", j.retries, "of", s.cfg.GridRetries,
		"tokens", j.tokens, "err", err)
	if j.attn != nil {
		// On a lost grid the release frees nothing but the coordinator's
		// record of the sequence.
		if rerr := j.attn.Release(); rerr != nil {
			s.log.Warn("release sequence", "request", j.id, "err", rerr)
		}
		j.attn = nil
	}
	if j.base != nil {
		if rerr := j.base.Release(); rerr != nil {
			s.log.Warn("release sequence", "request", j.id, "err", rerr)
		}
		j.base = nil
	}
	// The new prefill looks the prompt up again: the lost grid's
	// prefixes are gone (stepFailed), a new grid's may be cached.
	j.cached, j.from, j.probed = 0, nil, false
	j.dense, j.filled, j.replay, j.pass = nil, 0, nil, nil
	if j.tokens == 0 {
		j.promptLP = nil // recorded again by the prefill
	}
	return true, ""
}

// grows reports whether a request of params p reserves its pages as its
// sequence grows (Config.GrowReservations): one sequence (one prompt, n
// = 1) on the main in-process engine.
func (s *Server) grows(p params) bool {
	return s.cfg.GrowReservations && s.cfg.Cluster == nil && !p.own && len(p.prompts) == 1 && p.n == 1
}

// grow reserves, with Config.GrowReservations, the page that the decode
// step about to run opens for each job of decoding whose group grows,
// the oldest first. A page the pool does not have, once the prefix
// cache gave way, preempts the newest running job that grows (preempt),
// which may be the job itself. It returns the jobs of decoding still
// running.
func (s *Server) grow(decoding []*job) []*job {
	if !s.cfg.GrowReservations {
		return decoding
	}
	out := decoding[:0:0]
	for _, j := range decoding {
		for !j.ended && j.attn != nil && j.g.grows {
			d := s.pagesFor(j.attn.Len()+1) - j.g.pages
			if d <= 0 {
				break
			}
			s.mu.Lock()
			drop := s.evictPrefixes(d)
			fits := s.reserved+d <= s.capacity()
			var v *job
			if fits {
				s.reserved += d
				j.g.pages += d
				j.pages += d
			} else {
				v = s.requeueNewest()
			}
			s.mu.Unlock()
			if len(drop) > 0 {
				s.dropPrefixes(drop, 0)
			}
			if v != nil {
				s.preempt(v)
			}
		}
		if !j.ended && j.attn != nil {
			out = append(out, j)
		}
	}
	return out
}

// requeueNewest takes the newest running job that grows out of the
// running ones, returns its pages to the pool and puts it at the front
// of the queue, reserving there the pages its prompt and generated
// tokens fill after the first decode step it will run (the caller
// releases its sequence: preempt). Called under s.mu; a job of
// decoding's that grows is running, so there is one.
func (s *Server) requeueNewest() *job {
	i := len(s.running) - 1
	for !s.running[i].g.grows {
		i--
	}
	v := s.running[i]
	s.running = slices.Delete(s.running, i, i+1)
	if v.g.reserved {
		s.reserved -= v.g.pages
		v.g.reserved = false
	}
	v.pages = s.pagesFor(len(v.p.ids) + max(v.tokens, min(v.p.maxTokens, 1)))
	v.g.pages = v.pages
	s.queue = slices.Insert(s.queue, 0, v)
	s.stats.Preemptions++
	return v
}

// preempt releases the sequence of j, just requeued (requeueNewest), and
// sets it to run again from its prompt, as retry does for a lost grid:
// its next prefill looks the prompt up in the prefix cache again, and
// when j had generated tokens they are fed through decode steps
// (j.replay) before j decodes on from j.next, its sampler, penalties,
// stop strings and text where they were.
func (s *Server) preempt(j *job) {
	s.log.Info("pool full: preempting the newest request (it runs again from its prompt)", "request", j.id, "tokens", j.tokens)
	for _, a := range []**jobAttention{&j.attn, &j.pre, &j.base} {
		if *a != nil {
			if err := (*a).Release(); err != nil {
				s.log.Warn("release sequence", "request", j.id, "err", err)
			}
			*a = nil
		}
	}
	if j.eng != nil {
		j.eng.release()
		j.eng = nil
	}
	j.cached, j.from, j.probed = 0, nil, false
	j.dense, j.filled, j.replay, j.pass = nil, 0, nil, nil
	if j.tokens == 0 {
		j.promptLP = nil // recorded again by the prefill
	}
}

// stepError is the failure of j's step: its context's end when that is
// what stopped it, the server's when closing, else an internal error.
func (s *Server) stepError(j *job, err error) *apiError {
	switch {
	case j.ctx.Err() != nil && isCtxErr(err):
		return s.ctxError(j.ctx)
	case s.ctx.Err() != nil:
		return errClosed
	case errors.Is(err, ErrClusterUnavailable):
		return s.clusterUnavailable(err)
	}
	s.log.Error("request failed", "request", j.id, "err", err)
	return internal(err)
}

// internal is a 500 for a failure of the server's own.
func internal(err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: typeServer, code: "internal_error", message: "The server failed the request: " + err.Error()}
}
