package completion

import (
	"context"
	"sync"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// job is one admitted request. The fields above mu are set before
// admission and read-only after; the scheduler's fields are touched by
// the scheduler goroutine only; the hand-off to the handler is guarded
// by mu.
type job struct {
	id      string
	ctx     context.Context
	cancel  context.CancelFunc
	p       params
	pages   int   // pages reserved per shard (released with g's)
	created int64 // the completion's created time (Unix seconds)
	// g is j's request; leader, for a choice after the first of its
	// prompt, is the prompt's first choice, whose prefilled sequence j
	// forks (j prefills nothing); forks are the leader's (handed their
	// sequence by the scheduler when the prompt is done).
	g      *group
	leader *job
	forks  []*job
	// clock's arrived is set before admission; the rest is the
	// scheduler's.
	clock reqClock

	// The scheduler's.
	sampler *model.Sampler
	// pen are the choice's penalties (nil: none), applied to the logits
	// before the sampler.
	pen    *penalties
	dense  *model.Dense // the prefill's recorder; nil once loaded
	filled int          // prompt tokens prefilled
	// pass is the prompt chunk (after filled) whose layers run over
	// several iterations beside decoding streams (itlBudget.split), nil
	// between chunks; passTook is the time its layers took so far.
	pass     *model.Pass
	passTook time.Duration
	attn     *jobAttention
	// pre is the sequence a device prefill (Config.Prefiller) fills,
	// until the prompt is done and it becomes attn.
	pre *jobAttention
	// base, with a prefix cache hit on the CPU prefill, is the fork of
	// the cached prefix the prompt's suffix is loaded onto (Extend),
	// until load hands it to attn; cached is the prompt tokens the cache
	// gave, from the entry they were forked from.
	base   *jobAttention
	cached int
	from   *prefixEntry
	probed bool       // the prefill looked the prompt up in the cache
	eng    *engineRef // the engine holding attn's (or pre's) sequence (nil on a cluster)
	// cseq, on Config.Cluster, is the sequence created when the prefill
	// starts, until load hands it to attn. creating says that its
	// Create runs (startCreate); stopWake stops the wake-up on the end
	// of ctx meanwhile.
	cseq     model.Sequence
	creating bool
	stopWake func() bool
	next     int // the token the next decode step feeds
	tokens   int // tokens generated
	// With Config.GridRetries on a cluster, or a growing reservation
	// (group.grows): gen is the tokens generated; retries counts the
	// times j ran again after its grid was lost; replay, after a retry's
	// or a preempted job's prefill, is the generated tokens before next
	// still to feed to the new sequence (decode steps whose logits are
	// not used).
	gen     []int
	retries int
	// requeued says that j went back to the queue when the pool that
	// follows the cluster shrank: its new sequence is created as a
	// retry's (while the cluster answers unavailable).
	requeued bool
	replay   []int
	text     *stopText
	ended    bool
	// With a history (Config.History): the tokens generated, the
	// logits' most likely token at each, and the text sent.
	keep        bool
	out, argmax []int
	sent        []byte
	// Decode statistics, as questctl generate totals them.
	pagesRead, pagesTotal int
	readW, denseW         float64

	// Guarded by the Server's mu: grid is the policy grid j's admission
	// counted it on until its sequence is created (holdGrid), left says
	// that j ended (a Create finishing after it releases its sequence).
	grid *policyGrid
	left bool

	// lpQueue (the scheduler's) holds the log-probabilities of tokens
	// recorded since the last post, which moves them to pendingLP.
	lpQueue []tokenLogprob
	// res is how j ended (set by end, for its group's observer).
	res result
	// promptLP (the scheduler's), with echo and logprobs, is the
	// prompt's entries, recorded by the prefill.
	promptLP []tokenLogprob

	mu        sync.Mutex
	notify    chan struct{}  // cap 1, g's: something new under mu
	pending   []byte         // text not yet taken by the handler
	pendingLP []tokenLogprob // log-probabilities not yet taken, in order
	done      bool
	result    result
}

// group is one request's jobs, its choices in index order: admitted
// together (or none), their pages reserved (when the first starts) and
// released (when the last ends) together.
type group struct {
	ctx   context.Context // the request's: each job's is a child
	jobs  []*job
	pages int // reserved per shard by the jobs together
	// notify is the jobs' (cap 1): something new in one of them.
	notify chan struct{}
	// The scheduler's: the jobs not ended yet, the first failure.
	left int
	err  *apiError
	// reserved (the Server's mu) says that the pages are reserved: from
	// the first job's start to the last job's end.
	reserved bool
	// grows says that pages reserves the group's one sequence as it
	// grows (Config.GrowReservations), not its whole context.
	grows bool
}

// result is how a job ended.
type result struct {
	finish string    // "stop" or "length" when err is nil
	err    *apiError // the failure, or nil
	usage  Usage
	// readW and denseW are the job's page weights (Usage's rho).
	readW, denseW float64
}

// usageOf totals the usage of a request's choices (every one ended,
// res[i] jobs[i]'s): each prompt's tokens once, every choice's
// completion tokens and pages.
func usageOf(jobs []*job, res []result) Usage {
	var u Usage
	var readW, denseW float64
	for i, j := range jobs {
		r := res[i].usage
		if j.leader == nil {
			u.PromptTokens += r.PromptTokens
			u.PromptTokensDetails.CachedTokens += r.PromptTokensDetails.CachedTokens
		}
		u.CompletionTokens += r.CompletionTokens
		u.PagesRead += r.PagesRead
		u.PagesTotal += r.PagesTotal
		readW, denseW = readW+res[i].readW, denseW+res[i].denseW
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if denseW > 0 {
		u.BytesReadVsDense = readW / denseW
	}
	return u
}

// post appends text for the handler and, when fin is set, ends the job.
func (j *job) post(text []byte, fin *result) {
	if j.keep {
		j.sent = append(j.sent, text...)
	}
	j.mu.Lock()
	j.pending = append(j.pending, text...)
	j.pendingLP = append(j.pendingLP, j.lpQueue...)
	j.lpQueue = j.lpQueue[:0]
	if fin != nil && !j.done {
		j.done, j.result = true, *fin
	}
	j.mu.Unlock()
	select {
	case j.notify <- struct{}{}:
	default:
	}
}

// take returns the text and log-probabilities posted since the last
// take, and the result once the job is done.
func (j *job) take() (text []byte, lps []tokenLogprob, done bool, res result) {
	j.mu.Lock()
	defer j.mu.Unlock()
	text, j.pending = j.pending, nil
	lps, j.pendingLP = j.pendingLP, nil
	return text, lps, j.done, j.result
}

// jobAttention is a request's engine sequence as the model drives it:
// the layers below denseLayers (every layer with allDense) attend
// densely, the others through the engine's page selection at the
// request's budget.
type jobAttention struct {
	*model.EngineAttention
	denseLayers int
	allDense    bool
	// capture, during a step the quality monitor sampled, takes the
	// sampled layers' inputs.
	capture *replayTask
}

// DecodeRow implements model.BatchAttention: the layers below
// denseLayers (every layer with allDense) of the row are dense.
func (a *jobAttention) DecodeRow() (decode.Stepper, decode.Row, decode.Options, bool) {
	a.Options.ForceDense = a.allDense // Decode sets it per layer
	s, row, opt, ok := a.EngineAttention.DecodeRow()
	if a.allDense {
		row.DenseLayers = len(a.Steps())
	} else {
		row.DenseLayers = max(row.DenseLayers, a.denseLayers)
	}
	return s, row, opt, ok
}

// Decoded implements model.BatchAttention, capturing the sampled
// layers' inputs.
func (a *jobAttention) Decoded(layer int, q, k, v, out []float32, pl plan.Plan, t decode.Times) {
	a.EngineAttention.Decoded(layer, q, k, v, out, pl, t)
	if a.capture != nil {
		a.capture.record(layer, q, k, v)
	}
}

// Decode runs one engine step of layer, dense where the request asks.
func (a *jobAttention) Decode(ctx context.Context, layer int, q, k, v, out []float32) error {
	a.Options.ForceDense = a.allDense || layer < a.denseLayers
	if err := a.EngineAttention.Decode(ctx, layer, q, k, v, out); err != nil {
		return err
	}
	if a.capture != nil {
		a.capture.record(layer, q, k, v)
	}
	return nil
}
