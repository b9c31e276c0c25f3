package completion

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"

	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// params are a validated request's settings: resolve's hold every
// prompt of the request (prompts, echoes), a job's the one prompt of
// its choice (ids, echoText) and the choice's index and seed.
type params struct {
	ids     []int
	prompts [][]int
	echoes  []string
	n       int // choices per prompt
	index   int // the choice's index in the answer
	// echo prepends echoText (the prompt as given) to the choice's
	// text, and the prompt's log-probabilities to its entries.
	echo        bool
	echoText    string
	maxTokens   int
	temperature float64
	topP        float64
	topK        int     // 0: all tokens
	minP        float64 // 0: no bound
	// repetitionPenalty (1: none), frequencyPenalty and presencePenalty
	// (0: none) are vLLM's penalties (penalties).
	repetitionPenalty, frequencyPenalty, presencePenalty float64
	seed                                                 uint64
	seeded                                               bool
	stops                                                []string
	// stopTokens are the request's stop_token_ids, sorted, without
	// repeats (the model's EOS ids are the server's stopIDs).
	stopTokens   []int
	stream       bool
	includeUsage bool
	// chat answers with chat.completion objects (POST
	// /v1/chat/completions) instead of text_completion ones.
	chat bool
	// logprobs asks for every generated token's log-probability, with
	// topLogprobs alternatives.
	logprobs    bool
	topLogprobs int
	// budget is the token budget of decode steps (0: the policy's);
	// denseLayers the leading dense layers; allDense reads every page.
	budget      int
	denseLayers int
	allDense    bool
	// sel is the request's selection policy: the serving policy with the
	// request's selector, GQA mode, sink and local pages. own says that
	// one of those differs from the engine's, so the request's sequence
	// lives on an engine of its own (see Server.load).
	sel plan.Policy
	own bool
}

// resolve checks a decoded request against the model and the engine's
// policy. It changes nothing.
func (s *Server) resolve(req *CompletionRequest) (params, *apiError) {
	var p params
	if err := s.checkModel(req.Model); err != nil {
		return p, err
	}
	p.n = 1
	if req.N != nil {
		if *req.N < 1 || *req.N > MaxChoices {
			return p, badParam("n", "invalid_value", "n %d: want 1..%d choices", *req.N, MaxChoices)
		}
		p.n = *req.N
	}
	if req.bestOf && p.n > 1 {
		return p, badParam("best_of", "invalid_value", "best_of 1 is less than n %d: best_of must be at least n (this server supports only best_of 1)", p.n)
	}
	p.echo = req.Echo
	p.maxTokens = s.cfg.DefaultMaxTokens
	if req.MaxTokens != nil {
		if *req.MaxTokens < 1 && !(p.echo && *req.MaxTokens == 0) {
			if f := req.maxTokensField; f != "" { // a chat's: no echo allows 0
				return p, badParam(f, "invalid_value", "%s %d: want at least 1", f, *req.MaxTokens)
			}
			return p, badParam("max_tokens", "invalid_value", "max_tokens %d: want at least 1 (0 only with echo)", *req.MaxTokens)
		}
		p.maxTokens = *req.MaxTokens
	}
	p.temperature, p.topP = 1, 1
	if d := s.cfg.Sampling; req.Temperature == nil && d.Temperature != nil {
		p.temperature = *d.Temperature
	}
	if d := s.cfg.Sampling; req.TopP == nil && d.TopP != nil {
		p.topP = *d.TopP
		if *d.TopP == 0 {
			p.temperature = 0
		}
	}
	if t := req.Temperature; t != nil {
		if !(*t >= 0 && *t <= 2) {
			return p, badParam("temperature", "invalid_value", "temperature %v: want 0..2", *t)
		}
		p.temperature = *t
	}
	if t := req.TopP; t != nil {
		if !(*t >= 0 && *t <= 1) {
			return p, badParam("top_p", "invalid_value", "top_p %v: want 0..1", *t)
		}
		p.topP = *t
		if *t == 0 {
			p.temperature = 0 // the smallest nucleus: the most likely token
		}
	}
	if k := req.TopK; k != nil {
		if *k < -1 {
			return p, badParam("top_k", "invalid_value", "top_k %d: want at least 1, or 0 or -1 (all tokens)", *k)
		}
		p.topK = max(*k, 0)
	}
	if m := req.MinP; m != nil {
		if !(*m >= 0 && *m <= 1) {
			return p, badParam("min_p", "invalid_value", "min_p %v: want 0..1", *m)
		}
		p.minP = *m
	}
	p.repetitionPenalty = 1
	if r := req.RepetitionPenalty; r != nil {
		if !(*r > 0 && *r <= maxRepetitionPenalty) {
			return p, badParam("repetition_penalty", "invalid_value", "repetition_penalty %v: want more than 0, at most %v (1: none)", *r, maxRepetitionPenalty)
		}
		p.repetitionPenalty = *r
	}
	for _, f := range []struct {
		name string
		v    *float64
		to   *float64
	}{{"frequency_penalty", req.FrequencyPenalty, &p.frequencyPenalty}, {"presence_penalty", req.PresencePenalty, &p.presencePenalty}} {
		if f.v == nil {
			continue
		}
		if !(*f.v >= -maxPenalty && *f.v <= maxPenalty) {
			return p, badParam(f.name, "invalid_value", "%s %v: want -%v..%v (0: none)", f.name, *f.v, maxPenalty, maxPenalty)
		}
		*f.to = *f.v
	}
	if req.Seed != nil {
		p.seed, p.seeded = uint64(*req.Seed), true
	}
	for _, st := range req.Stop {
		if st == "" {
			return p, badParam("stop", "invalid_value", "stop strings must not be empty")
		}
	}
	p.stops = req.Stop
	for i, id := range req.StopTokenIDs {
		if id < 0 || id >= s.m.Config.VocabSize {
			return p, badParam("stop_token_ids", "invalid_value", "stop_token_ids[%d] %d is outside the vocabulary of %d", i, id, s.m.Config.VocabSize)
		}
	}
	if len(req.StopTokenIDs) > 0 {
		p.stopTokens = slices.Compact(slices.Sorted(slices.Values(req.StopTokenIDs)))
	}
	truncate := 0
	if t := req.TruncatePromptTokens; t != nil {
		switch {
		case *t == -1:
			truncate = s.maxContext // 0 (no bound): nothing to cut
		case *t < 1:
			return p, badParam("truncate_prompt_tokens", "invalid_value", "truncate_prompt_tokens %d: want at least 1, or -1 (max_model_len)", *t)
		case s.maxContext > 0 && *t > s.maxContext:
			return p, badParam("truncate_prompt_tokens", "invalid_value", "truncate_prompt_tokens %d is greater than max_model_len %d", *t, s.maxContext)
		default:
			truncate = *t
		}
	}
	if n := req.Logprobs; n != nil {
		if *n < 0 || *n > maxTopLogprobs {
			return p, badParam("logprobs", "invalid_value", "logprobs %d: want 0..%d (null: none)", *n, maxTopLogprobs)
		}
		p.logprobs, p.topLogprobs = true, *n
	}
	p.stream = req.Stream
	if o := req.StreamOptions; o != nil {
		if !req.Stream {
			return p, badParam("stream_options", "invalid_value", "stream_options is only allowed when stream is true")
		}
		p.includeUsage = o.IncludeUsage
	}
	if err := s.questParams(req.Quest, &p); err != nil {
		return p, err
	}
	// The prompts, then their lengths against the context and the pool.
	list := req.Prompts
	if req.Prompt != nil {
		list = []Prompt{*req.Prompt}
	}
	if list == nil {
		return p, badParam("prompt", "missing_required_parameter", "you must provide a prompt parameter")
	}
	if len(list) == 0 {
		return p, badParam("prompt", "invalid_value", "prompt is an empty batch of prompts")
	}
	batch := req.Prompts != nil
	pages := 0
	atBatch := func(i int, err *apiError) *apiError {
		if batch {
			err.message = fmt.Sprintf("prompt[%d]: %s", i, err.message)
		}
		return err
	}
	for i, pr := range list {
		ids, err := s.promptIDs(pr)
		if err != nil {
			return p, atBatch(i, err)
		}
		cut := truncate > 0 && len(ids) > truncate
		if cut {
			ids = ids[len(ids)-truncate:] // the prompt's end, as vLLM keeps it
		}
		text := pr.Text
		if pr.IDs != nil || cut {
			text = s.tok.Decode(ids)
		}
		p.prompts, p.echoes = append(p.prompts, ids), append(p.echoes, text)
	}
	if req.MaxTokens == nil && s.cfg.DefaultMaxTokens == RestOfContext {
		// vLLM's default: the rest of the context after the longest
		// prompt (at least 1, so that a prompt filling the context is
		// refused by checkLength below).
		p.maxTokens = s.maxContext
		for _, ids := range p.prompts {
			p.maxTokens = min(p.maxTokens, s.maxContext-len(ids))
		}
		p.maxTokens = max(p.maxTokens, 1)
	}
	for i, ids := range p.prompts {
		if err := s.checkLength(len(ids), p.maxTokens); err != nil {
			return p, atBatch(i, err)
		}
		pages += s.pagesFor(len(ids)+p.maxTokens) + (p.n-1)*s.forkPages(len(ids), p.maxTokens)
	}
	// All the choices are admitted together, each a sequence of its own
	// counted against the running and queued caps, their pages against
	// the pool: a request that could never fit is refused here.
	param := "n"
	if p.n == 1 {
		param = "prompt"
	}
	if c, most := len(list)*p.n, s.cfg.MaxRunning+s.cfg.MaxQueued; c > most {
		return p, badParam(param, "invalid_value", "%d prompts x n %d = %d choices; the server runs and queues at most %d sequences (questd --max-running, --max-queued)",
			len(list), p.n, c, most)
	}
	if len(list)*p.n > 1 && pages > s.capacity() {
		if e := s.shrunk(pages); e != nil {
			return p, e
		}
		return p, badParam(param, "invalid_value", "%d prompts x n %d choices with max_tokens %d need %d KV pages per shard together; the engine's pool holds %d (questd --serve-capacity-pages)",
			len(list), p.n, p.maxTokens, pages, s.capacity())
	}
	p.ids = p.prompts[0]
	return p, nil
}

// hostSample says that p's tokens must be drawn on the host: a device
// samples without penalties, top_k and min_p (kernels.SampleParams).
func (p *params) hostSample() bool {
	return p.penalized() || (p.temperature != 0 && (p.topK > 0 || p.minP > 0))
}

// penalized says that p has a penalty (repetition, frequency or
// presence) that changes the logits.
func (p *params) penalized() bool {
	return p.repetitionPenalty != 1 || p.frequencyPenalty != 0 || p.presencePenalty != 0
}

// MaxChoices bounds a request's n.
const MaxChoices = 16

// promptIDs is the ids of one prompt: its ids checked against the
// vocabulary, or its text tokenized.
func (s *Server) promptIDs(pr Prompt) ([]int, *apiError) {
	vocab := s.m.Config.VocabSize
	if pr.IDs != nil {
		if len(pr.IDs) == 0 {
			return nil, badParam("prompt", "invalid_value", "prompt has no tokens")
		}
		for i, id := range pr.IDs {
			if id < 0 || id >= vocab {
				return nil, badParam("prompt", "invalid_value", "prompt token %d at index %d is outside the vocabulary of %d", id, i, vocab)
			}
		}
		return pr.IDs, nil
	}
	ids := model.PromptIDs(s.tok, pr.Text)
	if len(ids) == 0 {
		return nil, badParam("prompt", "invalid_value", "prompt has no tokens")
	}
	return ids, nil
}

// checkLength checks a prompt of n tokens and maxTokens against the
// context and the pool.
func (s *Server) checkLength(n, maxTokens int) *apiError {
	if c := s.maxContext; c > 0 && n+maxTokens > c {
		param := "max_tokens"
		if n >= c {
			param = "prompt"
		}
		return badParam(param, "context_length_exceeded",
			"This model's maximum context length is %d tokens, however you requested %d tokens (%d in your prompt; %d for the completion). Please reduce your prompt or completion length.",
			c, n+maxTokens, n, maxTokens)
	}
	if need := s.pagesFor(n + maxTokens); need > s.capacity() {
		if e := s.shrunk(need); e != nil {
			return e
		}
		param := "max_tokens"
		if s.pagesFor(n) > s.capacity() {
			param = "prompt" // the prompt alone does not fit
		}
		return badParam(param, "context_length_exceeded",
			"the prompt's %d tokens plus max_tokens %d need %d pages per shard; the engine's pool holds %d (questd --serve-capacity-pages). Please reduce your prompt or completion length.",
			n, maxTokens, need, s.capacity())
	}
	return nil
}

// checkModel checks a request's model name against the server's; an
// empty or absent one is the server's one model, as vLLM and llama.cpp's
// server take it (OpenAI's API requires the field).
func (s *Server) checkModel(name string) *apiError {
	switch {
	case name == "":
		return nil
	case name != s.name:
		return &apiError{status: http.StatusNotFound, typ: typeInvalid, param: "model", code: "model_not_found",
			message: fmt.Sprintf("The model `%s` does not exist; this server serves `%s`.", name, s.name)}
	}
	return nil
}

// questParams checks the quest object against the model and the
// serving policy. A selector, GQA mode, sink or local pages other than
// the engine's make the request's sequence run on an engine of its own
// (params.own); the dense selector reads every page of the main engine.
func (s *Server) questParams(q *QuestOptions, p *params) *apiError {
	pol := s.cfg.Policy
	p.denseLayers = pol.DenseLayers
	p.sel = pol
	if q != nil {
		if q.Budget != nil {
			if *q.Budget < pol.PageSize {
				return badParam("quest.budget", "invalid_value", "quest.budget %d: want at least one page (%d tokens)", *q.Budget, pol.PageSize)
			}
			p.budget = *q.Budget
		}
		if q.Selector != "" {
			sel, err := plan.ParseSelector(q.Selector)
			if err != nil {
				return badParam("quest.selector", "invalid_value", "quest.selector: %v", err)
			}
			p.sel.Selector = sel
		}
		if q.GQA != "" {
			m, err := plan.ParseGQAMode(q.GQA)
			if err != nil {
				return badParam("quest.gqa", "invalid_value", "quest.gqa: %v", err)
			}
			p.sel.GQA = m
		}
		for _, f := range []struct {
			name string
			v    *int
			dst  *int
		}{{"sink", q.Sink, &p.sel.SinkPages}, {"local", q.Local, &p.sel.LocalPages}} {
			switch {
			case f.v == nil:
			case *f.v < 0 || *f.v > maxForcedPages:
				return badParam("quest."+f.name, "invalid_value", "quest.%s %d: want 0..%d pages", f.name, *f.v, maxForcedPages)
			default:
				*f.dst = *f.v
			}
		}
		if d := q.DenseLayers; d != nil {
			if *d < 0 || *d > s.m.Config.Layers {
				return badParam("quest.dense_layers", "invalid_value", "quest.dense_layers %d: want 0..%d (the model's layers)", *d, s.m.Config.Layers)
			}
			p.denseLayers = *d
		}
	}
	p.allDense = p.sel.Selector == plan.Dense
	if !p.allDense && q != nil && (q.Sink != nil || q.Local != nil || q.Budget != nil) {
		// Only what the request sets is checked: the server's own policy
		// is the operator's (questd checks its flags).
		budget := cmp.Or(p.budget, pol.BudgetTokens)
		if k, forced := budget/pol.PageSize, p.sel.SinkPages+p.sel.LocalPages; forced > k {
			field := "quest.budget"
			switch {
			case q.Sink != nil:
				field = "quest.sink"
			case q.Local != nil:
				field = "quest.local"
			}
			return badParam(field, "invalid_value", "quest.sink %d + quest.local %d forced pages exceed the page budget K = %d (budget %d tokens / page size %d, forced pages included)",
				p.sel.SinkPages, p.sel.LocalPages, k, budget, pol.PageSize)
		}
	}
	if p.allDense {
		// Every page of every layer: the main engine's forced-dense steps,
		// whatever the other settings.
		p.sel = pol
		return nil
	}
	if s.cfg.Decoder != nil && p.sel.Selector != pol.Selector {
		return badParam("quest.selector", "invalid_value", "quest.selector %s: this server decodes on the GPU, which runs %s (or dense)", p.sel.Selector, pol.Selector)
	}
	p.own = p.sel.Selector != pol.Selector || p.sel.GQA != pol.GQA ||
		p.sel.SinkPages != pol.SinkPages || p.sel.LocalPages != pol.LocalPages
	if p.own && s.pool.Device {
		// Its own engine would allocate a pool of its own on the GPU
		// beside the main one, which already takes what the memory
		// fraction leaves: refuse before anything is allocated.
		return badParam("quest", "invalid_value", "quest.gqa, quest.sink and quest.local other than the server's need an engine of their own on the GPU, and this server's pool was sized from the GPU's memory (questd --gpu-memory-utilization); give --serve-capacity-pages to size it and leave room, or drop the options")
	}
	return nil
}

// maxForcedPages bounds a request's sink and local pages.
const maxForcedPages = 1 << 20

// pagesFor is the pages per shard a sequence of n tokens fills at most
// (striped placement: page g on CP rank g mod CP).
func (s *Server) pagesFor(n int) int {
	pages := (n + s.cfg.Policy.PageSize - 1) / s.cfg.Policy.PageSize
	return (pages + s.cfg.CP - 1) / s.cfg.CP
}

// forkPages is the pages per shard a fork of a prompt of n tokens adds
// at most generating maxTokens: its copy of the shared partial tail
// page and the pages after it (sealed pages stay shared). Whichever
// branch writes a shared tail first copies it, so the pages of a group
// of forks stay within their sum, though not each within its own: the
// reservation of a request's choices is released together.
func (s *Server) forkPages(n, maxTokens int) int {
	ps := s.cfg.Policy.PageSize
	pages := (n+maxTokens+ps-1)/ps - n/ps
	return (pages + s.cfg.CP - 1) / s.cfg.CP
}
