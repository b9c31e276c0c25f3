package completion

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/questrt/questrt/chat"
	"github.com/questrt/questrt/model"
)

// Server serves one model over the completions API. Its methods are
// safe for concurrent use; ServeHTTP may run on any number of
// goroutines. Everything that touches the model and the engine runs on
// the Server's scheduler goroutine.
type Server struct {
	cfg     Config
	hooks   hooks
	name    string
	m       *model.Model
	tok     model.Tokenizer
	stopIDs []int
	eng     Engine       // nil with Config.Cluster
	main    *engineRef   // eng, for the jobs and replays that hold sequences on it
	pc      *prefixCache // nil: no prefix caching (the scheduler's)
	// itl sizes each iteration's prefill by the measured costs (nil:
	// Config.MaxITLFactor 0; the scheduler's).
	itl *itlBudget
	// clusterSeqs counts the sequences held on Config.Cluster (the
	// requests' and the monitor's forks).
	clusterSeqs atomic.Int64
	maxContext  int // prompt + max_tokens bound (0: none)
	// pool is how the pool was sized (PoolSize), and resized as it
	// follows the cluster's nodes (s.mu); capPages is its Pages, for
	// any goroutine (capacity).
	pool     PoolSize
	capPages atomic.Int64
	// chatErr is why the checkpoint's chat template could not be used
	// (nil: it has none, or Config.ChatTemplate is set).
	chatErr error
	created int64
	log     *slog.Logger
	now     func() time.Time
	// ownModel is closed with the Server (Load's).
	ownModel *model.Model
	// instance tells this server's completion ids from another's.
	instance string

	stop   chan struct{} // closed by Close
	exited chan struct{} // closed when the scheduler returns
	wake   chan struct{} // cap 1: new work for the scheduler
	ctx    context.Context
	cancel context.CancelFunc // ends ctx: the scheduler's steps
	// mon is the quality monitor (nil when off).
	mon *monitor
	// hist keeps the last Config.History finished requests.
	hist history
	// replaying admits one dense replay at a time (cap 1); replays
	// counts those running (Close waits for them before closing the
	// model).
	replaying chan struct{}
	replays   sync.WaitGroup
	// creates owns the goroutines creating cluster sequences (the
	// scheduler starts them and, stopping, waits for them).
	creates sync.WaitGroup
	// ignored is the request field names already logged as ignored.
	ignored ignoredFields
	// follows owns the goroutine that follows the cluster's nodes
	// (follow; Config.ClusterResize).
	follows sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	draining bool
	queue    []*job        // admitted, waiting for a running slot
	running  []*job        // the scheduler's: prefilling or decoding
	reserved int           // pages per shard reserved by the started requests' jobs
	changed  chan struct{} // closed and replaced when a job ends
	seq      uint64        // requests admitted so far
	// grids are the option sets other than Policy's with a grid on
	// Config.Cluster, opened or being opened (PolicyGrids bounds them).
	grids map[gridKey]*policyGrid
	// made are the cluster sequences created for running jobs, not yet
	// taken by the scheduler.
	made []madeSeq
	// resize is the pool size the follower asks the scheduler for (nil:
	// none); mostPages the largest pool the server had.
	resize    *PoolSize
	mostPages int
	stats     Stats
	closeOnce sync.Once
}

// Stats is a snapshot of a Server's counters.
type Stats struct {
	// Running is the sequences (a request's choices, one each)
	// prefilling or decoding; Queued those admitted and waiting for a
	// running slot or for their request's pages. The other request
	// counts count a request once, whatever its choices.
	Running, Queued int
	// Admitted counts the requests admitted; Refused those refused by
	// admission (429) or while draining (503); Invalid those refused for
	// their parameters (4xx).
	Admitted, Refused, Invalid uint64
	// Completed, TimedOut, Cancelled and Failed count the admitted
	// requests that ended with a completion, past their deadline
	// (Config.RequestTimeout, 504), with their client gone, and with an
	// error.
	Completed, TimedOut, Cancelled, Failed uint64
	// PromptTokens and CompletionTokens count the tokens prefilled and
	// generated.
	PromptTokens, CompletionTokens uint64
	// Steps counts decode steps (batches); StepSequences the sequences
	// they decoded, so StepSequences / Steps is the mean batch.
	Steps, StepSequences uint64
	// PrefillChunks counts the prefill chunks run.
	PrefillChunks uint64
	// PagesRead and PagesTotal sum the requests' usage pages_read and
	// pages_total as their decode steps run: (KV head, page) pairs the
	// steps read, and those dense attention would have read.
	PagesRead, PagesTotal uint64
	// ReservedPages is the pages per shard reserved by the requests
	// started (queued ones reserve none yet), CapacityPages the pool's.
	ReservedPages, CapacityPages int
	// EngineSequences and UsedPages are the main engine's own view
	// (shard 0; UsedPages the most of any shard): what no finished
	// request may leave behind (the quality monitor's forks count until
	// their replay is done). With Config.Cluster, EngineSequences is the
	// sequences the server holds on the cluster and UsedPages is 0 (the
	// pages are the workers': see the nodes' stats).
	EngineSequences, UsedPages int
	// OwnEngines counts the requests that ran on an engine of their own
	// (a selector, GQA mode, sink or local pages not the main engine's;
	// with Config.Cluster, on the grid of their policy).
	OwnEngines uint64
	// OwnEnginesOpen is the own engines not closed yet (their request or
	// a monitor replay on them still running); 0 with Config.Cluster.
	OwnEnginesOpen int
	// PolicyGrids, with Config.Cluster, is the option sets other than
	// the policy's whose grid is open or being opened (at most
	// Config.PolicyGrids); PolicyGridsRefused counts the requests
	// refused (429) because theirs would open one more.
	PolicyGrids        int
	PolicyGridsRefused uint64
	// GridRetries counts, with Config.Cluster, the times a request ran
	// again on a new grid after its grid was lost (Config.GridRetries).
	GridRetries uint64
	// Preemptions counts the times a running request gave its pages
	// back to the pool for an older one's next page and went back to the
	// queue (Config.GrowReservations), or because the pool that follows
	// the cluster's nodes shrank (Config.ClusterResize).
	Preemptions uint64
	// PoolResizes counts the times the pool followed the cluster's
	// nodes to another size (Config.ClusterResize).
	PoolResizes uint64
	// The quality monitor's (layer, KV head) samples: taken, dropped
	// because the replay queue was full, replayed, and failed (a fork or
	// replay error, or the request's step failing).
	MonitorSampled, MonitorDropped, MonitorReplayed, MonitorFailed uint64
	// The prefix cache (Config.PrefixCaching): prompts looked up that
	// found a cached prefix (hits) or none (misses), their prompt tokens
	// and those the cache gave; pages per shard evicted for other
	// requests' pages or the bound (PrefixCachePages); and the entries
	// (engine sequences, counted in EngineSequences) and pages per shard
	// it holds now.
	PrefixCacheHits, PrefixCacheMisses           uint64
	PrefixCacheQueryTokens, PrefixCacheHitTokens uint64
	PrefixCacheEvictedPages                      uint64
	PrefixCacheEntries, PrefixCachePages         int
	// PrefixCacheLost counts the prefix cache's entries dropped with
	// their grid (Config.Cluster: a node of it lost).
	PrefixCacheLost uint64
}

// New builds a server for m, whose tokenizer is tok, with an in-process
// engine (cfg.Engines) of m's geometry under cfg.Policy, or with
// cfg.Cluster the same grid for the requests' sequences on the cluster,
// and starts its scheduler. The caller keeps
// m (Close does not close it), and cfg.Cluster: it must outlive the
// server.
func New(m *model.Model, tok model.Tokenizer, cfg Config) (*Server, error) {
	return newServer(m, tok, cfg, hooks{})
}

// hooks let tests hold the scheduler; production servers have none.
type hooks struct {
	// iteration, when set, runs on the scheduler goroutine before every
	// iteration; ctx ends when the server closes.
	iteration func(ctx context.Context)
	// batched, when set, gets every iteration's decode rows and prompt
	// tokens (one that ran either) on the scheduler goroutine.
	batched func(rows, prompt int)
	// prefillTook and decodeTook, when set, replace the measured times
	// that the latency budget (Config.MaxITLFactor) learns from: a
	// prefill chunk of n tokens at context c, a decode step of rows.
	// perTokenOnly, when set, leaves the per-chunk fixed cost out of
	// the ITL budget (the per-token line alone, as before 2026-12-07's
	// fixed cost), for the benchmark that compares the two.
	perTokenOnly bool
	prefillTook  func(c, n int) time.Duration
	decodeTook   func(rows int) time.Duration
}

func newServer(m *model.Model, tok model.Tokenizer, cfg Config, hk hooks) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ModelName == "" {
		return nil, errNoName
	}
	if tok.VocabSize() > m.Config.VocabSize {
		return nil, fmt.Errorf("serve: the tokenizer's %d ids exceed the model's vocabulary of %d", tok.VocabSize(), m.Config.VocabSize)
	}
	stopIDs := model.StopIDs(tok, m.Config)
	for _, id := range cfg.Sampling.EOS {
		if id >= m.Config.VocabSize {
			return nil, fmt.Errorf("serve: generation_config.json's eos_token_id %d is outside the model's vocabulary of %d", id, m.Config.VocabSize)
		}
		if !slices.Contains(stopIDs, id) {
			stopIDs = append(stopIDs, id)
		}
	}
	// The engine's policy attends densely on no layer of its own: dense
	// layers are per request (the serving policy's by default), run as
	// forced-dense steps, which read every page as a dense plan does.
	s := &Server{cfg: cfg, m: m}
	if kv := m.Config.KVHeads; kv%cfg.TP != 0 {
		return nil, fmt.Errorf("serve config: tp %d does not divide the model's %d KV heads", cfg.TP, kv)
	}
	if cfg.Engines == nil {
		return nil, errNoEngines
	}
	maxContext := m.Config.MaxPositions
	if cfg.MaxContext > 0 && (maxContext == 0 || cfg.MaxContext < maxContext) {
		maxContext = cfg.MaxContext
	}
	if cfg.DefaultMaxTokens == RestOfContext && maxContext == 0 {
		return nil, errors.New("serve config: default max tokens -1 (the rest of the context) with no context bound: set MaxContext (questd --max-model-len), the model has no max_position_embeddings")
	}
	pool := PoolSize{Pages: cfg.CapacityPages}
	if cfg.CapacityPages == 0 {
		var err error
		if pool, err = s.sizePool(cfg, maxContext); err != nil {
			return nil, err
		}
		cfg.CapacityPages = pool.Pages
		s.cfg = cfg
		if cfg.PrefixCachePages > cfg.CapacityPages {
			from := "memory"
			if pool.Cluster {
				from = "the nodes' free pages"
			}
			return nil, fmt.Errorf("serve config: prefix cache %d pages: more than the %d pages of the pool sized from %s", cfg.PrefixCachePages, cfg.CapacityPages, from)
		}
	}
	gs := s.gridSpec(cfg.Policy, cfg.CapacityPages+s.monitorSlack())
	var eng Engine
	var main *engineRef
	if cfg.Cluster == nil {
		var err error
		if eng, err = cfg.Engines.New(gs); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
		main = &engineRef{eng: eng}
	} else if err := cfg.Engines.Validate(gs); err != nil {
		// The cluster's grids get this config: refuse it here rather
		// than on every request.
		return nil, fmt.Errorf("serve: grid of the cluster's sequences: %w", err)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	*s = Server{cfg: cfg, hooks: hk, name: cfg.ModelName, m: m, tok: tok, stopIDs: stopIDs, eng: eng,
		main: main, maxContext: maxContext, pool: pool, log: log, now: now,
		stop: make(chan struct{}), exited: make(chan struct{}), wake: make(chan struct{}, 1), changed: make(chan struct{}),
		grids: map[gridKey]*policyGrid{}}
	if cfg.MaxITLFactor > 0 {
		s.itl = newITLBudget(cfg.MaxITLFactor)
		s.itl.perTokenOnly = hk.perTokenOnly
	}
	t := now()
	s.created = t.Unix()
	s.instance = strconv.FormatInt(t.UnixNano(), 36)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.stats.CapacityPages = cfg.CapacityPages
	s.capPages.Store(int64(cfg.CapacityPages))
	s.mostPages = cfg.CapacityPages
	s.hist.max = cfg.History
	s.replaying = make(chan struct{}, 1)
	if cfg.PrefixCaching {
		bound := cfg.PrefixCachePages
		if bound == 0 && cfg.Prefiller == nil {
			// The CPU prefill's keys and values stay in host memory
			// beside the cached pages: at most a quarter of the pool's
			// worth by default.
			bound = max(cfg.CapacityPages/4, 1)
		}
		s.pc = newPrefixCache(cfg.Policy.PageSize, cfg.CP, bound)
	}
	if cfg.Monitor.Rate > 0 {
		s.mon = newMonitor(cfg.Monitor, m.Geometry(), cfg.Seed, s.replay)
	}
	go s.loop()
	if cc, ok := cfg.Cluster.(ClusterCapacity); ok && pool.Cluster && cfg.ClusterResize > 0 {
		need := 0
		if maxContext > 0 {
			need = s.pagesFor(maxContext)
		}
		s.follows.Add(1)
		go s.follow(cc, need)
	}
	return s, nil
}

// Load opens the checkpoint in dir and its tokenizer (model.Load,
// model.LoadTokenizer) and serves it; the model is named after dir's
// base name unless cfg.ModelName is set, its weights are checked against
// cfg.MemoryLimit too, and Close closes it.
func Load(dir string, cfg Config) (*Server, error) {
	m, err := model.Load(dir, model.LoadOptions{MemoryLimit: cfg.MemoryLimit})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	tok, err := model.LoadTokenizer(dir, m.Config)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	if cfg.ModelName == "" {
		cfg.ModelName = filepath.Base(filepath.Clean(dir))
	}
	if cfg.Sampling.zero() {
		if cfg.Sampling, err = LoadSampling(dir); err != nil {
			m.Close()
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	var chatErr error
	if cfg.ChatTemplate == nil {
		// Completions serve without a chat template; a chat request is
		// then told why there is none.
		cfg.ChatTemplate, chatErr = chat.Load(dir)
		if errors.Is(chatErr, chat.ErrNoTemplate) {
			chatErr = nil
		}
	}
	s, err := New(m, tok, cfg)
	if err != nil {
		m.Close()
		return nil, err
	}
	s.ownModel, s.chatErr = m, chatErr
	return s, nil
}

// Name returns the model's id.
func (s *Server) Name() string { return s.name }

// MaxModelLen returns the most tokens of a request's prompt plus
// max_tokens (Config.MaxContext under the model's positions; /v1/models
// reports it); 0 when unbounded.
func (s *Server) MaxModelLen() int { return s.maxContext }

// PoolSize says how the page pool was sized: Config.CapacityPages as
// given, or from memory when it was 0; a pool sized from the cluster's
// nodes as it follows them now (Config.ClusterResize).
func (s *Server) PoolSize() PoolSize {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pool
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	st := s.stats
	st.Running, st.Queued, st.ReservedPages = len(s.running), len(s.queue), s.reserved
	st.PolicyGrids = len(s.grids)
	s.mu.Unlock()
	if mo := s.mon; mo != nil {
		st.MonitorSampled, st.MonitorDropped = mo.sampled.Load(), mo.dropped.Load()
		st.MonitorReplayed, st.MonitorFailed = mo.replayed.Load(), mo.failed.Load()
	}
	if s.eng == nil {
		st.EngineSequences = int(s.clusterSeqs.Load())
		return st
	}
	u := s.eng.Usage()
	st.EngineSequences, st.UsedPages = u.Sequences, u.UsedPages
	return st
}

// errDraining and errClosed answer requests the server no longer takes.
var (
	errDraining = &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "server_draining",
		message: "The server is draining: it finishes the requests it has and admits no new ones."}
	errClosed = &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "server_shutting_down",
		message: "The server is shutting down."}
	// errStopped fails the requests still running or queued when the
	// server closes: those its drain did not finish.
	errStopped = &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "server_shutting_down",
		message: "The server shut down before the request finished: it did not end within the server's drain (questd --drain-timeout); retry it."}
)

// Accepting reports whether the server admits requests: not draining
// and not closed (GET /health answers 200 then, 503 otherwise).
func (s *Server) Accepting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.draining && !s.closed
}

// Drain stops admitting requests (new ones get 503) and waits until the
// admitted ones have finished, or ctx is done (then it returns ctx's
// error and the requests still running go on; Close ends them). A
// draining server does not go back to admitting.
func (s *Server) Drain(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	for {
		s.mu.Lock()
		n, ch := len(s.queue)+len(s.running), s.changed
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("serve: drain with %d requests left: %w", n, ctx.Err())
		case <-ch:
		}
	}
}

// Close stops the scheduler, fails the requests it still has (503),
// releases their sequences and closes the engine (and the model, for a
// server made by Load; not Config.Cluster, which is the caller's). It waits for the scheduler to return.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.stop)
		s.cancel()
		<-s.exited
		s.follows.Wait() // s.stop is closed: it returns
		s.replays.Wait() // s.ctx is done: they end
		if s.mon != nil {
			s.mon.stop()
		}
		if s.eng != nil {
			s.eng.Close()
		}
		if s.ownModel != nil {
			s.ownModel.Close()
		}
	})
	return nil
}

// admit queues g's jobs, or refuses them all (429 when the queue has no
// room for them, 503 when draining or closed) and changes nothing. Their
// pages are reserved when they leave the queue (iterate).
func (s *Server) admit(g *group) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	refuse := func(e *apiError) *apiError {
		s.stats.Refused++
		return e
	}
	n := len(g.jobs)
	switch {
	case s.closed:
		return refuse(errClosed)
	case s.draining:
		return refuse(errDraining)
	case len(s.running)+len(s.queue)+n > s.cfg.MaxRunning+s.cfg.MaxQueued:
		return refuse(&apiError{status: http.StatusTooManyRequests, typ: typeRateLimit, code: "rate_limit_exceeded", retry: s.cfg.RetryAfter,
			message: fmt.Sprintf("The server's queue is full: %d running and %d queued sequences at most (raise questd --max-queued, or --max-running; each choice of a request is one); retry later.", s.cfg.MaxRunning, s.cfg.MaxQueued)})
	}
	// The jobs share their options: the first holds the grid or none
	// does (nothing changed), and the others join the one it holds.
	if aerr := s.holdGrid(g.jobs[0]); aerr != nil {
		s.stats.PolicyGridsRefused++
		return refuse(aerr)
	}
	for _, j := range g.jobs[1:] {
		_ = s.holdGrid(j) // the first's grid: never refused
	}
	g.left = n
	s.seq++
	s.stats.Admitted++
	id := fmt.Sprintf("cmpl-%s-%d", s.instance, s.seq)
	created := s.now().Unix()
	// Choice i samples with the request's seed (the server's when it
	// gives none) plus i.
	seed := s.cfg.Seed ^ (s.seq * 0x9e3779b97f4a7c15)
	for _, j := range g.jobs {
		j.keep = s.cfg.History > 0
		j.id, j.created = id, created
		if !j.p.seeded {
			j.p.seed = seed
		}
		j.p.seed += uint64(j.p.index)
	}
	s.queue = append(s.queue, g.jobs...)
	s.poke()
	return nil
}

// invalid counts a request refused for its parameters.
func (s *Server) invalid() {
	s.mu.Lock()
	s.stats.Invalid++
	s.mu.Unlock()
}

// notResolved counts a request that resolve refused: for its parameters
// (Invalid), or because the pool that follows the cluster does not hold
// it now (Refused: 503 pool_shrunk).
func (s *Server) notResolved(e *apiError) {
	if e.code != "pool_shrunk" {
		s.invalid()
		return
	}
	s.mu.Lock()
	s.stats.Refused++
	s.mu.Unlock()
}

// ServeHTTP routes the API: POST /v1/completions, GET /v1/models and
// GET /v1/models/{id}, and the request history (Config.History): GET
// /admin/requests, GET /admin/requests/{id} and POST
// /admin/requests/{id}/replay (see ReplayReport); any other path is
// 404, any other method 405. The admin paths show the kept requests'
// prompts and outputs: expose the listener accordingly.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	switch {
	case path == "/v1/completions":
		if r.Method != http.MethodPost {
			s.notAllowed(w, r, "POST")
			return
		}
		s.completions(w, r)
	case path == "/v1/chat/completions":
		if r.Method != http.MethodPost {
			s.notAllowed(w, r, "POST")
			return
		}
		s.chatCompletions(w, r)
	case path == "/tokenize" || path == "/detokenize":
		if r.Method != http.MethodPost {
			s.notAllowed(w, r, "POST")
			return
		}
		if path == "/tokenize" {
			s.tokenize(w, r)
		} else {
			s.detokenize(w, r)
		}
	case path == "/health":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.notAllowed(w, r, "GET, HEAD")
			return
		}
		if !s.Accepting() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	case path == "/v1/models":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.notAllowed(w, r, "GET, HEAD")
			return
		}
		writeJSON(w, http.StatusOK, ModelList{Object: "list", Data: []ModelInfo{s.modelInfo()}})
	case strings.HasPrefix(path, "/v1/models/"):
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.notAllowed(w, r, "GET, HEAD")
			return
		}
		if id := strings.TrimPrefix(path, "/v1/models/"); id != s.name {
			s.invalid()
			(&apiError{status: http.StatusNotFound, typ: typeInvalid, param: "model", code: "model_not_found",
				message: fmt.Sprintf("The model `%s` does not exist; this server serves `%s`.", id, s.name)}).write(w)
			return
		}
		writeJSON(w, http.StatusOK, s.modelInfo())
	case path == "/admin/requests" || strings.HasPrefix(path, "/admin/requests/"):
		s.admin(w, r)
	default:
		s.invalid()
		(&apiError{status: http.StatusNotFound, typ: typeInvalid, code: "unknown_url",
			message: fmt.Sprintf("Invalid URL (%s %s)", r.Method, path)}).write(w)
	}
}

func (s *Server) notAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	s.invalid()
	w.Header().Set("Allow", allow)
	(&apiError{status: http.StatusMethodNotAllowed, typ: typeInvalid, code: "method_not_allowed",
		message: fmt.Sprintf("Method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow)}).write(w)
}

// ModelList is the answer of GET /v1/models.
type ModelList struct {
	Object string      `json:"object"`
	Data   []ModelInfo `json:"data"`
}

// ModelInfo is OpenAI's model object, with vLLM's max_model_len (the
// bound on a request's prompt plus max_tokens; omitted when there is
// none).
type ModelInfo struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
}

func (s *Server) modelInfo() ModelInfo {
	return ModelInfo{ID: s.name, Object: "model", Created: s.created, OwnedBy: "questrt", MaxModelLen: s.maxContext}
}

// isCtxErr reports a context's end.
func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
