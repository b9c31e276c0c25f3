package serve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

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
			if s.reserved+g.pages > s.cfg.CapacityPages {
				break // resolve refused requests that never fit: pages free as running ones end
			}
			s.reserved += g.pages
			g.reserved = true
		}
		j.clock.started = time.Now()
		s.running = append(s.running, j)
		s.queue = s.queue[1:]
	}
	running := slices.Clone(s.running)
	s.mu.Unlock()
	if len(dropped) > 0 {
		s.dropPrefixes(dropped, 0)
	}
	worked := len(gone) > 0
	for _, j := range gone {
		s.end(j, nil, ctxError(j.ctx), "")
	}
	if s.takeCreated() {
		worked = true
	}
	if len(running) == 0 {
		return worked
	}
	for _, j := range running {
		if j.ctx.Err() != nil && !j.ended {
			s.end(j, nil, ctxError(j.ctx), "")
			worked = true
		}
	}
	if s.prefill() {
		worked = true
	}
	if s.decode() {
		worked = true
	}
	return worked
}

// live returns the running jobs in admission order.
func (s *Server) live() []*job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.running)
}

// prefill runs up to ChunkTokens prompt tokens of the jobs still
// prefilling, shortest remaining prompt first, a chunk per job; a job whose prompt is done moves its keys
// and values into the engine and samples its first token. On a cluster
// a job's prefill starts once its sequence is created (startCreate). It
// reports whether it ran a chunk or ended a job.
func (s *Server) prefill() bool {
	worked := false
	budget := s.cfg.ChunkTokens
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
		// With echo and logprobs, every position's logits: the prompt's
		// log-probabilities (the CPU's dense prefill gives them).
		all := j.p.echo && j.p.logprobs
		onDevice := s.cfg.Prefiller != nil && !all
		if j.dense == nil && j.pre == nil {
			if err := s.prefixHit(j, onDevice, all); err != nil {
				s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
				continue
			}
		}
		if j.sampler == nil {
			if j.dense == nil && j.pre == nil {
				if onDevice {
					if err := s.create(j); err != nil {
						s.end(j, nil, s.stepError(j, fmt.Errorf("prefill: %w", err)), "")
						continue
					}
				} else {
					j.dense = model.NewDense(s.m.Geometry(), s.cfg.Workers)
				}
			}
			if !s.start(j) {
				continue
			}
		}
		n := min(budget, len(j.p.ids)-j.filled)
		budget -= n
		var logits []float32
		var err error
		if j.pre != nil {
			logits, err = s.cfg.Prefiller.Prefill(j.ctx, j.pre, j.p.ids[j.filled:j.filled+n])
		} else {
			logits, err = s.m.Forward(j.ctx, j.dense, j.p.ids[j.filled:j.filled+n], model.ForwardOptions{AllLogits: all})
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
	}
	return worked
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
	j.sampler = sm
	return true
}

// prompted runs when j's prompt is prefilled (logits: its last
// position's): it loads the keys and values into j's sequence, forks
// that sequence for j's forks (the other choices of the prompt), each
// of which samples its first token from the same logits with its own
// sampler, and samples j's. With max_tokens 0 (echo) every choice ends
// with its echo instead.
func (s *Server) prompted(j *job, logits []float32) {
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
		s.end(j, nil, s.stepError(j, fmt.Errorf("load the prompt into the engine: %w", err)), "")
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
	ea, err := model.NewEngineAttention(ref.eng, s.m.Geometry())
	if err != nil {
		ref.release()
		return nil, err
	}
	ea.Budget = j.p.budget
	j.eng = ref
	return &jobAttention{EngineAttention: ea, denseLayers: j.p.denseLayers, allDense: j.p.allDense}, nil
}

// decode runs one decode step for every job that has prefilled; it
// reports whether there was one.
func (s *Server) decode() bool {
	var jobs []*job
	var attns []model.Attention
	var toks []int
	for _, j := range s.live() {
		if j.attn != nil {
			jobs, attns, toks = append(jobs, j), append(attns, j.attn), append(toks, j.next)
		}
	}
	if len(jobs) == 0 {
		return false
	}
	if s.mon != nil {
		for _, j := range jobs {
			j.attn.capture = s.sample(j)
		}
	}
	var dec Decoder = s.m
	if s.cfg.Decoder != nil {
		dec = s.cfg.Decoder
	}
	logits, err := dec.DecodeBatch(s.ctx, attns, toks)
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
			s.end(j, nil, s.stepError(j, fmt.Errorf("decode step: %w", err)), "")
		}
		return true
	}
	for i, j := range jobs {
		if be != nil && be.Errs[i] != nil {
			s.end(j, nil, s.stepError(j, fmt.Errorf("decode step: %w", be.Errs[i])), "")
			continue
		}
		sm := model.Summarize(j.attn.Steps(), s.cfg.Policy.PageSize)
		j.pagesRead += sm.PagesRead
		j.pagesTotal += sm.PagesTotal
		j.readW += sm.Rho * float64(sm.PagesTotal)
		j.denseW += float64(sm.PagesTotal)
		s.token(j, logits[i])
	}
	return true
}

// token samples j's next token from logits and hands its text out; it
// ends j on a stop token, a stop string or max_tokens.
func (s *Server) token(j *job, logits []float32) {
	id := j.sampler.Sample(logits)
	if s.cfg.Observe != nil { // the timings are the observer's alone
		j.clock.tokenAt(time.Now())
	}
	if !slices.Contains(s.stopIDs, id) {
		s.logprob(j, logits, id)
	}
	if j.keep {
		j.out = append(j.out, id)
		j.argmax = append(j.argmax, model.Argmax(logits))
	}
	j.tokens++
	j.next = id
	s.count(func(st *Stats) { st.CompletionTokens++ })
	if slices.Contains(s.stopIDs, id) {
		s.end(j, j.text.flush(), nil, "stop")
		return
	}
	out, stopped := j.text.add(s.tok.Decode([]int{id}))
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
	j.dense = nil
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
		switch err := g.err; {
		case err == nil:
			s.stats.Completed++
		case err.status == http.StatusGatewayTimeout || err.status == statusClientGone:
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
		s.end(j, nil, errClosed, "")
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

// ctxError is the failure of a job whose context ended.
func ctxError(ctx context.Context) *apiError {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &apiError{status: http.StatusGatewayTimeout, typ: typeTimeout, code: "request_timeout",
			message: "The request ran past the server's request timeout."}
	}
	return &apiError{status: statusClientGone, typ: typeInvalid, code: "client_closed_request", message: "The client closed the request."}
}

// stepError is the failure of j's step: its context's end when that is
// what stopped it, the server's when closing, else an internal error.
func (s *Server) stepError(j *job, err error) *apiError {
	switch {
	case j.ctx.Err() != nil && isCtxErr(err):
		return ctxError(j.ctx)
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
