package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/eval"
	"github.com/questrt/questrt/serve"
)

// Bounds of bench serve's flags.
const (
	serveMaxConcurrency = 1024
	serveMaxPromptLen   = 8 << 20 // bytes
	serveMaxTokens      = 1 << 20
	serveMaxRequests    = 1 << 20
	serveMaxWarmup      = 100
	serveMaxBudget      = 1 << 30 // tokens
	serveMaxTimeout     = 24 * time.Hour
)

// serveBenchConfig is one run of 'questctl bench serve'.
type serveBenchConfig struct {
	addr          string // HOST:PORT of the completions API
	token         string // the API's bearer token (--token-file), or ""
	model         string // "" until asked: the server's model
	concurrency   []int
	selectors     []string
	promptLen     int
	maxTokens     int
	requests      int // per level; 0: max(4, 2 x concurrency)
	budget        int // quest.budget; 0: the server's
	backgroundLen int // bytes of the background prompt; 0: none
	sharedPrefix  int // bytes of each group's shared document; 0: no shared-prefix workload
	prefixGroups  int // documents the requests of a level share (with sharedPrefix)
	warmup        int // unmeasured requests per selector before the first level
	seed          uint64
	timeout       time.Duration
}

// serveBenchResult is one JSON line: one (selector, concurrency) level,
// alone or (background_prompt_len > 0) while one long prompt is prefilled.
type serveBenchResult struct {
	Selector    string `json:"selector"`
	Concurrency int    `json:"concurrency"`
	Requests    int    `json:"requests"`
	Completed   int    `json:"completed"`
	Errors      int    `json:"errors"`
	// Retries429 counts the answers 429 (admission refused) that were
	// retried after their Retry-After.
	Retries429 int `json:"retries_429"`
	// PromptLen is the prompts' nominal bytes; PromptTokens the mean
	// prompt tokens the server counted.
	PromptLen    int     `json:"prompt_len"`
	PromptTokens float64 `json:"prompt_tokens"`
	// CachedTokens is the mean prompt tokens the server took from its
	// prefix cache (usage.prompt_tokens_details.cached_tokens): requests
	// repeat their prompts across levels and selectors, so with the
	// server's prefix cache on (questd's default) later levels prefill
	// less; questd --prefix-caching=false times every prefill.
	CachedTokens float64 `json:"cached_tokens"`
	MaxTokens    int     `json:"max_tokens"`
	Budget       int     `json:"budget"`
	// Time to first token: from sending the request to the first chunk of
	// text; inter-token latency: the gaps between chunks after it (a chunk
	// of k bytes is k tokens, each 1/k of its gap); TPOT: a request's
	// (last chunk - first chunk) / (tokens - 1), mean over requests; E2E:
	// from sending to the end of the stream.
	TTFTP50MS  float64 `json:"ttft_p50_ms"`
	TTFTP99MS  float64 `json:"ttft_p99_ms"`
	TTFTMeanMS float64 `json:"ttft_mean_ms"`
	ITLP50MS   float64 `json:"itl_p50_ms"`
	ITLP99MS   float64 `json:"itl_p99_ms"`
	TPOTMeanMS float64 `json:"tpot_mean_ms"`
	E2EP50MS   float64 `json:"e2e_p50_ms"`
	E2EP99MS   float64 `json:"e2e_p99_ms"`
	// OutputTokens is the completion tokens of the level's requests (the
	// server's usage); OutputTokensPerS them over WallS, the time from the
	// level's first request sent to its last stream's end.
	OutputTokens     int     `json:"output_tokens"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	WallS            float64 `json:"wall_s"`
	// Correct counts the completions that start with the passkey.
	Correct  int     `json:"correct"`
	Accuracy float64 `json:"accuracy"`
	// BytesReadVsDense is the mean of the server's usage.bytes_read_vs_dense.
	BytesReadVsDense float64 `json:"bytes_read_vs_dense"`
	// With a background prompt: its time to first token (its prefill),
	// the requests of the level sent before it (during its prefill), their
	// time to first token, and its median over the median of the same
	// level alone (the line before).
	BackgroundPromptLen    int     `json:"background_prompt_len"`
	BackgroundTTFTMS       float64 `json:"background_ttft_ms"`
	DuringPrefill          int     `json:"during_prefill"`
	TTFTDuringPrefillP50MS float64 `json:"ttft_during_prefill_p50_ms"`
	TTFTDuringPrefillMaxMS float64 `json:"ttft_during_prefill_max_ms"`
	TTFTVsAlone            float64 `json:"ttft_vs_alone"`
	// LoadAvg1 is this machine's 1-minute load average as the level
	// started (/proc/loadavg; -1 where there is none).
	LoadAvg1 float64 `json:"loadavg_1m"`
	// The shared-prefix workload (--shared-prefix-len): each level's
	// requests share PrefixGroups documents of SharedPrefixLen bytes
	// (request i the document i mod PrefixGroups, new ones each level),
	// each followed by its own short question. Hits counts the requests
	// the server's prefix cache served (cached_tokens above 0); the TTFT
	// of those and of the others (misses: a document's first request, or
	// every request with questd --prefix-caching=false); CachedTokensPerRequest
	// is each request's cached_tokens, in request order (-1: failed).
	SharedPrefixLen        int     `json:"shared_prefix_len,omitempty"`
	PrefixGroups           int     `json:"prefix_groups,omitempty"`
	Hits                   int     `json:"hits"`
	TTFTHitP50MS           float64 `json:"ttft_hit_p50_ms"`
	TTFTHitMeanMS          float64 `json:"ttft_hit_mean_ms"`
	TTFTMissP50MS          float64 `json:"ttft_miss_p50_ms"`
	TTFTMissMeanMS         float64 `json:"ttft_miss_mean_ms"`
	CachedTokensPerRequest []int   `json:"cached_tokens_per_request,omitempty"`
}

func runBenchServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, benchServeCommand, args, stdout, stderr)
}

// benchServeCommand builds the flags and the action of
// 'questctl bench serve' without running it (see [runCommand]).
func benchServeCommand() (*flag.FlagSet, action) {
	c := serveBenchConfig{}
	fs := newFlags("bench serve", `Usage: questctl bench serve --addr HOST:PORT [flags]

Load test of a running completions API (questd --model DIR --http-addr
HOST:PORT, package serve): passkey prompts of about --prompt-len bytes
(eval.Passkey; the test models' tokens are bytes) are sent as streaming
requests (server-sent events, greedy, --max-tokens) with --concurrency
of them in flight, for each selector on the same prompts: quest (the
request's quest object {"selector": "quest"}) and dense ({"selector":
"dense"}: every page of every layer read). Each (concurrency, selector)
level runs --requests requests (default max(4, 2 x concurrency), at
least the concurrency) and prints one JSON line with time to first token
(ttft) p50/p99, inter-token latency (itl) p50/p99, the aggregate output
tokens/s over the level's wall time, and the passkey accuracy (the
completion starts with the pass key); the table follows on stderr.
Requests refused with 429 are retried after their Retry-After. Progress
goes to stderr.

Chunked prefill: with --background-prompt-len L, each level runs twice,
first alone, then while one background request of an L-byte prompt
(max_tokens 1) is prefilled: the level's requests start once the
background request is admitted (its stream opened), and the line adds
the background's time to first token, the requests sent before it
(during_prefill), their ttft and its median over the median alone
(ttft_vs_alone). For example, short requests alone and during a 32K-byte
prefill:

  questctl bench serve --addr 127.0.0.1:8000 --prompt-len 2048 --concurrency 1 \
    --requests 4 --max-tokens 16 --background-prompt-len 32768

The server must be up: one that does not answer GET /v1/models is a
one-line error (exit 1).`)
	fs.StringVar(&c.addr, "addr", "", "HOST:PORT of the completions API (questd's --http-addr; required)")
	tokenFile := fs.String("token-file", "", "`file` holding the server's bearer token (questd --token-file), sent as \"Authorization: Bearer <token>\"")
	fs.StringVar(&c.model, "model", "", "model id to request (default: the one GET /v1/models lists first)")
	conc := fs.String("concurrency", "1,4,16", fmt.Sprintf("comma-separated requests in flight, one level each (1..%d)", serveMaxConcurrency))
	sels := fs.String("selector", "quest,dense", "comma-separated selectors, each run on the same prompts: quest, dense")
	fs.IntVar(&c.promptLen, "prompt-len", 8192, fmt.Sprintf("bytes of each passkey prompt (64..%d)", serveMaxPromptLen))
	fs.IntVar(&c.maxTokens, "max-tokens", 64, fmt.Sprintf("max_tokens of each request (1..%d)", serveMaxTokens))
	fs.IntVar(&c.requests, "requests", 0, fmt.Sprintf("requests per level (0: max(4, 2 x concurrency); a level runs at least its concurrency; at most %d)", serveMaxRequests))
	fs.IntVar(&c.budget, "budget", 0, fmt.Sprintf("quest.budget of the quest requests, tokens per KV head and step (0: the server's policy; at most %d)", serveMaxBudget))
	fs.IntVar(&c.backgroundLen, "background-prompt-len", 0, fmt.Sprintf("bytes of a background prompt prefilled while each level runs again (0: none; 64..%d)", serveMaxPromptLen))
	fs.IntVar(&c.sharedPrefix, "shared-prefix-len", 0, fmt.Sprintf("bytes of a document that the requests of a level share, each followed by its own short question, as vLLM's prefix-caching workloads (0: off, each request its own --prompt-len passkey prompt; 64..%d); reports the TTFT of prefix-cache hits and misses and each request's cached_tokens", serveMaxPromptLen))
	fs.IntVar(&c.prefixGroups, "prefix-groups", 1, fmt.Sprintf("with --shared-prefix-len: distinct shared documents per level, request i gets document i mod N (1..%d)", serveMaxRequests))
	fs.IntVar(&c.warmup, "warmup", 1, fmt.Sprintf("unmeasured requests per selector before the first level, so that no selector absorbs the server's cold start (0..%d)", serveMaxWarmup))
	seed := fs.Uint64("seed", 1, "seed of the prompts (request i's prompt is the same for every level and selector)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, fmt.Sprintf("give up on a request after this time (above 0, at most %v)", serveMaxTimeout))
	asJSON := fs.Bool("json", false, "no table on stderr: JSON lines on stdout, progress lines on stderr (default also prints a table to stderr)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		if !flagSet(fs, "addr") {
			return usageError{errors.New("--addr is required: the HOST:PORT of the completions API (questd's --http-addr)")}
		}
		if c.token, err = readTokenFile(*tokenFile); err != nil {
			return usageError{fmt.Errorf("--token-file %q: %v", *tokenFile, err)}
		}
		if err := checkHostPort(c.addr); err != nil {
			return usageError{fmt.Errorf("--addr %q: %v", c.addr, err)}
		}
		if c.concurrency, err = parseInts("--concurrency", *conc); err != nil {
			return err
		}
		for _, s := range strings.Split(*sels, ",") {
			s = strings.TrimSpace(s)
			switch {
			case s != "quest" && s != "dense":
				return usageError{fmt.Errorf("--selector %q: unknown selector %q (want a comma-separated list of quest, dense)", *sels, s)}
			case slices.Contains(c.selectors, s):
				return usageError{fmt.Errorf("--selector %q: %s twice", *sels, s)}
			}
			c.selectors = append(c.selectors, s)
		}
		c.seed = *seed
		if err := c.validate(); err != nil {
			return usageError{err}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var rows []serveBenchResult
		start := time.Now()
		err = benchServe(ctx, c, stderr, func(r serveBenchResult) error {
			rows = append(rows, r)
			return bench.WriteJSONLine(stdout, r)
		})
		if !*asJSON && len(rows) > 0 {
			writeServeTable(stderr, rows)
		}
		if err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintf(stderr, "done in %.1fs\n", time.Since(start).Seconds())
		}
		return nil
	}
}

// validate reports the first setting outside its range, naming its flag.
func (c serveBenchConfig) validate() error {
	for _, n := range c.concurrency {
		if n < 1 || n > serveMaxConcurrency {
			return fmt.Errorf("--concurrency %d: want 1..%d", n, serveMaxConcurrency)
		}
	}
	switch {
	case c.promptLen < 64 || c.promptLen > serveMaxPromptLen:
		return fmt.Errorf("--prompt-len %d: want 64..%d bytes", c.promptLen, serveMaxPromptLen)
	case c.maxTokens < 1 || c.maxTokens > serveMaxTokens:
		return fmt.Errorf("--max-tokens %d: want 1..%d", c.maxTokens, serveMaxTokens)
	case c.requests < 0 || c.requests > serveMaxRequests:
		return fmt.Errorf("--requests %d: want 0 (the default) or 1..%d", c.requests, serveMaxRequests)
	case c.warmup < 0 || c.warmup > serveMaxWarmup:
		return fmt.Errorf("--warmup %d: want 0..%d", c.warmup, serveMaxWarmup)
	case c.budget < 0 || c.budget > serveMaxBudget:
		return fmt.Errorf("--budget %d: want 0 (the server's) or a token budget up to %d", c.budget, serveMaxBudget)
	case c.backgroundLen != 0 && (c.backgroundLen < 64 || c.backgroundLen > serveMaxPromptLen):
		return fmt.Errorf("--background-prompt-len %d: want 0 (none) or 64..%d bytes", c.backgroundLen, serveMaxPromptLen)
	case c.sharedPrefix != 0 && (c.sharedPrefix < 64 || c.sharedPrefix > serveMaxPromptLen):
		return fmt.Errorf("--shared-prefix-len %d: want 0 (off) or 64..%d bytes", c.sharedPrefix, serveMaxPromptLen)
	case c.prefixGroups < 1 || c.prefixGroups > serveMaxRequests:
		return fmt.Errorf("--prefix-groups %d: want 1..%d", c.prefixGroups, serveMaxRequests)
	case c.sharedPrefix > 0 && c.backgroundLen > 0:
		return fmt.Errorf("--shared-prefix-len with --background-prompt-len: run the two workloads separately")
	case c.timeout <= 0 || c.timeout > serveMaxTimeout:
		return fmt.Errorf("--timeout %v: want above 0 and at most %v", c.timeout, serveMaxTimeout)
	}
	return nil
}

// levelRequests is the requests of a level of concurrency n.
func (c serveBenchConfig) levelRequests(n int) int {
	if c.requests == 0 {
		return max(4, 2*n)
	}
	return max(c.requests, n)
}

// servePrompt is one request's prompt and the answer it should get.
type servePrompt struct {
	text, answer string
}

// servePrompts makes n passkey prompts of about length bytes; prompt i
// depends on seed, i and length only.
func servePrompts(seed uint64, stream uint64, n, length int) ([]servePrompt, error) {
	out := make([]servePrompt, n)
	for i := range out {
		p, err := eval.Passkey(rand.New(rand.NewPCG(seed, stream+uint64(i))), length, eval.PasskeyOptions{})
		if err != nil {
			return nil, err
		}
		out[i] = servePrompt{text: p.Text(), answer: p.Answer}
	}
	return out, nil
}

// sharedPrompts makes the n prompts of a shared-prefix level: groups
// passkey documents of about length bytes (document g depends on seed,
// stream + g and length only, and starts with its own "Document" line),
// prompt i document i mod groups followed by its own question, whose
// answer is that document's passkey.
func sharedPrompts(seed, stream uint64, n, groups, length int) ([]servePrompt, error) {
	docs := make([]eval.Prompt, min(groups, n))
	for g := range docs {
		p, err := eval.Passkey(rand.New(rand.NewPCG(seed, stream+uint64(g))), length, eval.PasskeyOptions{})
		if err != nil {
			return nil, err
		}
		docs[g] = p
	}
	out := make([]servePrompt, n)
	for i := range out {
		d := docs[i%len(docs)]
		// The documents' heads differ: passkey contexts share their
		// intro and filler up to the fact, which a prefix cache would
		// serve across documents.
		g := i % len(docs)
		out[i] = servePrompt{text: fmt.Sprintf("Document %d.%d. %sQuestion %d. %s", stream>>32, g, d.Context, i, d.Question), answer: d.Answer}
	}
	return out, nil
}

// serveClient talks to one completions API.
type serveClient struct {
	base   string // http://HOST:PORT
	http   *http.Client
	cfg    serveBenchConfig
	errOut io.Writer
}

// benchServe runs every level of c, calling emit with each result as
// soon as it is measured.
func benchServe(ctx context.Context, c serveBenchConfig, progress io.Writer, emit func(serveBenchResult) error) error {
	// The level's requests report from their own goroutines.
	progress = &syncWriter{w: progress}
	tr := &http.Transport{MaxIdleConns: 4 * serveMaxConcurrency, MaxIdleConnsPerHost: 2 * serveMaxConcurrency, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &serveClient{base: "http://" + c.addr, http: &http.Client{Transport: withBearer(tr, c.token)}, cfg: c, errOut: progress}
	model, err := cl.modelID(ctx)
	if err != nil {
		return err
	}
	cl.cfg.model = model
	most := 0
	for _, n := range c.concurrency {
		most = max(most, c.levelRequests(n))
	}
	prompts, err := servePrompts(c.seed, 0, most, c.promptLen)
	if err != nil {
		return err
	}
	var bg servePrompt
	if c.backgroundLen > 0 {
		ps, err := servePrompts(c.seed, 1<<40, 1, c.backgroundLen)
		if err != nil {
			return err
		}
		bg = ps[0]
	}
	warm := prompts[0]
	if c.sharedPrefix > 0 {
		// A prompt of its own: the warm-up caches no level's document.
		ps, err := servePrompts(c.seed, 1<<41, 1, c.promptLen)
		if err != nil {
			return err
		}
		warm = ps[0]
		fmt.Fprintf(progress, "bench serve: %s, model %s: shared prefixes of %d bytes (%d per level), max_tokens %d, selectors %s, concurrency %v\n",
			cl.base, model, c.sharedPrefix, c.prefixGroups, c.maxTokens, strings.Join(c.selectors, ","), c.concurrency)
	} else {
		fmt.Fprintf(progress, "bench serve: %s, model %s: prompts of %d bytes, max_tokens %d, selectors %s, concurrency %v\n",
			cl.base, model, c.promptLen, c.maxTokens, strings.Join(c.selectors, ","), c.concurrency)
	}
	// Warm-up, selector by selector, before any level: the server's cold
	// start (the first prefill, its pools growing) lands on no level.
	for _, sel := range c.selectors {
		for i := range c.warmup {
			fmt.Fprintf(progress, "bench serve: warm-up %d of %d (%s)\n", i+1, c.warmup, sel)
			if w := cl.stream(ctx, cl.body(warm, sel, 1), "", nil); w.err != nil {
				return fmt.Errorf("warm-up request (%s): %v", sel, w.err)
			}
		}
	}
	level := uint64(0)
	for _, n := range c.concurrency {
		for _, sel := range c.selectors {
			ps := prompts[:c.levelRequests(n)]
			if c.sharedPrefix > 0 {
				// New documents each level: its first request of each
				// misses whatever the levels before cached.
				level++
				if ps, err = sharedPrompts(c.seed, level<<32, c.levelRequests(n), c.prefixGroups, c.sharedPrefix); err != nil {
					return err
				}
			}
			alone, err := cl.level(ctx, sel, n, ps, nil)
			if err != nil {
				return err
			}
			if err := emit(alone); err != nil {
				return err
			}
			if c.backgroundLen == 0 {
				continue
			}
			r, err := cl.level(ctx, sel, n, ps, &bg)
			if err != nil {
				return err
			}
			if alone.TTFTP50MS > 0 {
				r.TTFTVsAlone = r.TTFTDuringPrefillP50MS / alone.TTFTP50MS
			}
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// modelID asks GET /v1/models, which also tells an unreachable server
// or one that is not a completions API; it returns --model or the first
// model listed.
func (cl *serveClient) modelID(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cl.base+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	resp, err := cl.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("the server at %s is unreachable (is questd up with --http-addr %s?): %v", cl.base, cl.cfg.addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("GET %s/v1/models: %v", cl.base, err)
	}
	var list serve.ModelList
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &list) != nil || list.Object != "list" {
		return "", fmt.Errorf("GET %s/v1/models: HTTP %d, %s: not a completions API (--addr is questd's --http-addr)", cl.base, resp.StatusCode, errorMessage(body))
	}
	if cl.cfg.model != "" {
		for _, m := range list.Data {
			if m.ID == cl.cfg.model {
				return m.ID, nil
			}
		}
		return "", usageError{fmt.Errorf("--model %q: the server at %s does not list it (it lists %s)", cl.cfg.model, cl.base, modelIDs(list))}
	}
	if len(list.Data) == 0 {
		return "", fmt.Errorf("GET %s/v1/models: the server lists no model", cl.base)
	}
	return list.Data[0].ID, nil
}

func modelIDs(l serve.ModelList) string {
	var ids []string
	for _, m := range l.Data {
		ids = append(ids, m.ID)
	}
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// errorMessage is an error answer's message, or the start of the body.
func errorMessage(body []byte) string {
	var e serve.ErrorBody
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		return "empty body"
	}
	return strconv.Quote(s)
}

// serveSample is one request's measurement.
type serveSample struct {
	err          error
	sent, first  time.Time // the request sent; its first text (zero: none)
	last, end    time.Time // its last text; the stream's end
	itl          []float64 // ms
	tokens       int       // completion tokens (usage)
	promptTokens int
	cachedTokens int
	text         string
	correct      bool
	retries      int
	rho          float64
}

// body is the JSON request of prompt p with selector sel.
func (cl *serveClient) body(p servePrompt, sel string, maxTokens int) []byte {
	q := map[string]any{"selector": sel}
	if sel == "quest" && cl.cfg.budget > 0 {
		q["budget"] = cl.cfg.budget
	}
	b, _ := json.Marshal(map[string]any{
		"model": cl.cfg.model, "prompt": p.text, "max_tokens": maxTokens, "temperature": 0, "stream": true,
		"stream_options": map[string]bool{"include_usage": true}, "quest": q,
	})
	return b
}

// streamChunk is what bench serve reads of a stream's event.
type streamChunk struct {
	Choices []serve.Choice     `json:"choices"`
	Usage   *serve.Usage       `json:"usage"`
	Error   *serve.ErrorDetail `json:"error"`
}

// stream sends one streaming request and measures it; opened, when set,
// is called once the server has admitted it (its stream's headers).
func (cl *serveClient) stream(ctx context.Context, body []byte, answer string, opened func()) serveSample {
	ctx, cancel := context.WithTimeout(ctx, cl.cfg.timeout)
	defer cancel()
	s := serveSample{sent: time.Now()}
	var resp *http.Response
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cl.base+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			s.err = err
			return s
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		resp, err = cl.http.Do(req)
		if err != nil {
			s.err = fmt.Errorf("POST %s/v1/completions: %v", cl.base, err)
			return s
		}
		if resp.StatusCode == http.StatusOK {
			break
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			s.err = fmt.Errorf("POST %s/v1/completions: HTTP %d: %s", cl.base, resp.StatusCode, errorMessage(b))
			return s
		}
		s.retries++
		wait := time.Second
		if v, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && v > 0 {
			wait = time.Duration(v) * time.Second
		}
		select {
		case <-ctx.Done():
			s.err = fmt.Errorf("refused with 429 until the request's --timeout: %s", errorMessage(b))
			return s
		case <-time.After(wait):
		}
	}
	defer resp.Body.Close()
	if opened != nil {
		opened()
	}
	var text strings.Builder
	done := false
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	for !done {
		line, err := rd.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the stream ended without [DONE]")
			}
			s.err = fmt.Errorf("stream: %v", err)
			return s
		}
		line = strings.TrimRight(line, "\r\n")
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue // blank lines between events, comments
		}
		now := time.Now()
		if data == "[DONE]" {
			done = true
			break
		}
		var ch streamChunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			s.err = fmt.Errorf("stream: event %.80q: %v", data, err)
			return s
		}
		if ch.Error != nil {
			s.err = fmt.Errorf("stream: error event: %s", ch.Error.Message)
			return s
		}
		if ch.Usage != nil {
			s.tokens, s.promptTokens, s.rho = ch.Usage.CompletionTokens, ch.Usage.PromptTokens, ch.Usage.BytesReadVsDense
			s.cachedTokens = ch.Usage.PromptTokensDetails.CachedTokens
		}
		if len(ch.Choices) == 0 {
			continue
		}
		t := ch.Choices[0].Text
		switch {
		case t == "":
			if s.first.IsZero() && ch.Choices[0].FinishReason != nil { // no text at all: the end is the first token
				s.first, s.last = now, now
			}
		case s.first.IsZero():
			s.first, s.last = now, now
		default:
			gap := float64(now.Sub(s.last).Nanoseconds()) / 1e6 / float64(len(t))
			for range len(t) {
				s.itl = append(s.itl, gap)
			}
			s.last = now
		}
		text.WriteString(t)
	}
	s.end = time.Now()
	s.text = text.String()
	s.correct = strings.HasPrefix(strings.TrimLeft(s.text, " "), answer)
	return s
}

// level runs one level: len(ps) requests with n in flight, each with
// selector sel; with bg, while bg's request is prefilled.
func (cl *serveClient) level(ctx context.Context, sel string, n int, ps []servePrompt, bg *servePrompt) (serveBenchResult, error) {
	c := cl.cfg
	r := serveBenchResult{Selector: sel, Concurrency: n, Requests: len(ps), PromptLen: c.promptLen, MaxTokens: c.maxTokens, LoadAvg1: loadAvg1()}
	if c.sharedPrefix > 0 {
		r.PromptLen, r.SharedPrefixLen, r.PrefixGroups = 0, c.sharedPrefix, min(c.prefixGroups, len(ps))
	}
	if sel == "quest" {
		r.Budget = c.budget
	}
	what := fmt.Sprintf("%s concurrency %d", sel, n)
	var bgSample serveSample
	bgDone := make(chan struct{})
	if bg != nil {
		r.BackgroundPromptLen = c.backgroundLen
		what += fmt.Sprintf(" during a %d-byte prefill", c.backgroundLen)
		fmt.Fprintf(cl.errOut, "bench serve: %s: the background request\n", what)
		opened := make(chan struct{})
		var once sync.Once
		go func() {
			defer close(bgDone)
			bgSample = cl.stream(ctx, cl.body(*bg, sel, 1), bg.answer, func() { once.Do(func() { close(opened) }) })
		}()
		select {
		case <-opened:
		case <-bgDone:
			return r, fmt.Errorf("%s: the background request: %v", what, bgSample.err)
		}
	} else {
		close(bgDone)
	}
	if c.sharedPrefix > 0 {
		fmt.Fprintf(cl.errOut, "bench serve: %s: %d requests sharing %d documents of %d bytes\n", what, len(ps), r.PrefixGroups, c.sharedPrefix)
	} else {
		fmt.Fprintf(cl.errOut, "bench serve: %s: %d requests of %d bytes\n", what, len(ps), c.promptLen)
	}
	samples := make([]serveSample, len(ps))
	var next, finished atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range min(n, len(ps)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ps) || ctx.Err() != nil {
					return
				}
				s := cl.stream(ctx, cl.body(ps[i], sel, c.maxTokens), ps[i].answer, nil)
				samples[i] = s
				k := finished.Add(1)
				if s.err != nil {
					fmt.Fprintf(cl.errOut, "bench serve: %s: request %d/%d failed: %v\n", what, k, len(ps), s.err)
					continue
				}
				fmt.Fprintf(cl.errOut, "bench serve: %s: request %d/%d: ttft %.0f ms, %d tokens in %.0f ms, %d prompt tokens cached, correct %v\n",
					what, k, len(ps), ms(s.first.Sub(s.sent)), s.tokens, ms(s.end.Sub(s.sent)), s.cachedTokens, s.correct)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	<-bgDone
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if bg != nil {
		if bgSample.err != nil {
			return r, fmt.Errorf("%s: the background request: %v", what, bgSample.err)
		}
		r.BackgroundTTFTMS = ms(bgSample.first.Sub(bgSample.sent))
	}
	var ttft, itl, e2e, during, hit, miss []float64
	var tpot, rho float64
	var firstErr error
	for _, s := range samples {
		if c.sharedPrefix > 0 {
			n := s.cachedTokens
			if s.err != nil {
				n = -1
			}
			r.CachedTokensPerRequest = append(r.CachedTokensPerRequest, n)
		}
		if s.err != nil {
			r.Errors++
			if firstErr == nil {
				firstErr = s.err
			}
			continue
		}
		r.Completed++
		r.Retries429 += s.retries
		r.OutputTokens += s.tokens
		r.PromptTokens += float64(s.promptTokens)
		r.CachedTokens += float64(s.cachedTokens)
		rho += s.rho
		if s.correct {
			r.Correct++
		}
		ttft = append(ttft, ms(s.first.Sub(s.sent)))
		if s.cachedTokens > 0 {
			hit = append(hit, ms(s.first.Sub(s.sent)))
		} else {
			miss = append(miss, ms(s.first.Sub(s.sent)))
		}
		e2e = append(e2e, ms(s.end.Sub(s.sent)))
		itl = append(itl, s.itl...)
		if s.tokens > 1 {
			tpot += ms(s.last.Sub(s.first)) / float64(s.tokens-1)
		}
		if bg != nil && s.sent.Before(bgSample.first) {
			during = append(during, ms(s.first.Sub(s.sent)))
		}
	}
	if r.Completed == 0 {
		return r, fmt.Errorf("%s: every request failed, the first: %v", what, firstErr)
	}
	done := float64(r.Completed)
	r.PromptTokens /= done
	r.CachedTokens /= done
	r.BytesReadVsDense = rho / done
	r.TTFTP50MS, r.TTFTP99MS, r.TTFTMeanMS = percentile(ttft, 0.5), percentile(ttft, 0.99), mean(ttft)
	r.Hits = len(hit)
	r.TTFTHitP50MS, r.TTFTHitMeanMS = percentile(hit, 0.5), mean(hit)
	r.TTFTMissP50MS, r.TTFTMissMeanMS = percentile(miss, 0.5), mean(miss)
	r.ITLP50MS, r.ITLP99MS = percentile(itl, 0.5), percentile(itl, 0.99)
	r.TPOTMeanMS = tpot / done
	r.E2EP50MS, r.E2EP99MS = percentile(e2e, 0.5), percentile(e2e, 0.99)
	r.WallS = wall.Seconds()
	r.OutputTokensPerS = float64(r.OutputTokens) / r.WallS
	r.RequestsPerS = done / r.WallS
	r.Accuracy = float64(r.Correct) / done
	r.DuringPrefill = len(during)
	if len(during) > 0 {
		r.TTFTDuringPrefillP50MS, r.TTFTDuringPrefillMaxMS = percentile(during, 0.5), slices.Max(during)
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// percentile is the nearest-rank p-quantile of xs (0 for none).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// loadAvg1 is the 1-minute load average, -1 where /proc/loadavg is not.
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// writeServeTable prints the results as a Markdown table.
func writeServeTable(w io.Writer, rows []serveBenchResult) {
	fmt.Fprintln(w, "| selector | concurrency | background | requests | ok | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s | accuracy | wall s | TTFT during prefill p50 ms (n) | vs alone | load 1m |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		bg, during, vs := "-", "-", "-"
		if r.BackgroundPromptLen > 0 {
			bg = fmt.Sprintf("%d B (ttft %.0f ms)", r.BackgroundPromptLen, r.BackgroundTTFTMS)
			during = fmt.Sprintf("%.0f (%d)", r.TTFTDuringPrefillP50MS, r.DuringPrefill)
			if r.DuringPrefill > 0 {
				vs = fmt.Sprintf("%.2fx", r.TTFTVsAlone)
			}
		}
		fmt.Fprintf(w, "| %s | %d | %s | %d | %d | %.0f | %.0f | %.1f | %.1f | %.2f | %d/%d | %.1f | %s | %s | %.2f |\n",
			r.Selector, r.Concurrency, bg, r.Requests, r.Completed, r.TTFTP50MS, r.TTFTP99MS, r.ITLP50MS, r.ITLP99MS,
			r.OutputTokensPerS, r.Correct, r.Completed, r.WallS, during, vs, r.LoadAvg1)
	}
	if !slices.ContainsFunc(rows, func(r serveBenchResult) bool { return r.SharedPrefixLen > 0 }) {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| selector | concurrency | shared prefix | requests | hits | TTFT hit p50 ms | TTFT miss p50 ms | hit / miss | prompt tokens | cached tokens per request |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		ratio := "-"
		if r.Hits > 0 && r.Hits < r.Completed && r.TTFTMissP50MS > 0 {
			ratio = fmt.Sprintf("%.3f", r.TTFTHitP50MS/r.TTFTMissP50MS)
		}
		fmt.Fprintf(w, "| %s | %d | %d B x %d | %d | %d | %.0f | %.0f | %s | %.0f | %v |\n",
			r.Selector, r.Concurrency, r.SharedPrefixLen, r.PrefixGroups, r.Requests, r.Hits, r.TTFTHitP50MS, r.TTFTMissP50MS, ratio, r.PromptTokens, r.CachedTokensPerRequest)
	}
}

// bearer adds "Authorization: Bearer <token>" to every request it sends.
type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// withBearer returns rt sending token as a bearer token (rt itself
// when token is "").
func withBearer(rt http.RoundTripper, token string) http.RoundTripper {
	if token == "" {
		return rt
	}
	return bearer{token: token, rt: rt}
}
