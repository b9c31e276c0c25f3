package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/questrt/questrt/bench"
	"github.com/questrt/questrt/bench/serveload"
)

func runBenchServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, benchServeCommand, args, stdout, stderr)
}

// benchServeCommand builds the flags and the action of
// 'questctl bench serve' without running it (see [runCommand]).
func benchServeCommand() (*flag.FlagSet, action) {
	c := serveload.DefaultConfig()
	fs := newFlags("bench serve", `Usage: questctl bench serve --addr HOST:PORT [flags]

Load test of a running completions API (questd --model DIR --http-addr
HOST:PORT, package completion): passkey prompts of about --prompt-len bytes
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
	fs.StringVar(&c.Addr, "addr", "", "HOST:PORT of the completions API (questd's --http-addr; required)")
	tokenFile := fs.String("token-file", "", "`file` holding the server's bearer token (questd --token-file), sent as \"Authorization: Bearer <token>\"")
	fs.StringVar(&c.Model, "model", "", "model id to request (default: the one GET /v1/models lists first)")
	conc := fs.String("concurrency", "1,4,16", fmt.Sprintf("comma-separated requests in flight, one level each (1..%d)", serveload.MaxConcurrency))
	sels := fs.String("selector", "quest,dense", "comma-separated selectors, each run on the same prompts: quest, dense")
	fs.IntVar(&c.PromptLen, "prompt-len", c.PromptLen, fmt.Sprintf("bytes of each passkey prompt (64..%d)", serveload.MaxPromptLen))
	fs.IntVar(&c.MaxTokens, "max-tokens", c.MaxTokens, fmt.Sprintf("max_tokens of each request (1..%d)", serveload.MaxTokens))
	fs.IntVar(&c.Requests, "requests", c.Requests, fmt.Sprintf("requests per level (0: max(4, 2 x concurrency); a level runs at least its concurrency; at most %d)", serveload.MaxRequests))
	fs.IntVar(&c.Budget, "budget", c.Budget, fmt.Sprintf("quest.budget of the quest requests, tokens per KV head and step (0: the server's policy; at most %d)", serveload.MaxBudget))
	fs.IntVar(&c.BackgroundLen, "background-prompt-len", c.BackgroundLen, fmt.Sprintf("bytes of a background prompt prefilled while each level runs again (0: none; 64..%d)", serveload.MaxPromptLen))
	fs.IntVar(&c.SharedPrefix, "shared-prefix-len", c.SharedPrefix, fmt.Sprintf("bytes of a document that the requests of a level share, each followed by its own short question, as vLLM's prefix-caching workloads (0: off, each request its own --prompt-len passkey prompt; 64..%d); reports the TTFT of prefix-cache hits and misses and each request's cached_tokens", serveload.MaxPromptLen))
	fs.IntVar(&c.PrefixGroups, "prefix-groups", c.PrefixGroups, fmt.Sprintf("with --shared-prefix-len: distinct shared documents per level, request i gets document i mod N (1..%d)", serveload.MaxRequests))
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, fmt.Sprintf("unmeasured requests per selector before the first level, so that no selector absorbs the server's cold start (0..%d)", serveload.MaxWarmup))
	seed := fs.Uint64("seed", c.Seed, "seed of the prompts (request i's prompt is the same for every level and selector)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, fmt.Sprintf("give up on a request after this time (above 0, at most %v)", serveload.MaxTimeout))
	asJSON := fs.Bool("json", false, "no table on stderr: JSON lines on stdout, progress lines on stderr (default also prints a table to stderr)")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		var err error
		if !flagSet(fs, "addr") {
			return usageError{errors.New("--addr is required: the HOST:PORT of the completions API (questd's --http-addr)")}
		}
		token, err := readTokenFile(*tokenFile)
		if err != nil {
			return usageError{fmt.Errorf("--token-file %q: %v", *tokenFile, err)}
		}
		if err := checkHostPort(c.Addr); err != nil {
			return usageError{fmt.Errorf("--addr %q: %v", c.Addr, err)}
		}
		if c.Concurrency, err = parseInts("--concurrency", *conc); err != nil {
			return err
		}
		c.Selectors = nil
		for _, s := range strings.Split(*sels, ",") {
			s = strings.TrimSpace(s)
			switch {
			case s != "quest" && s != "dense":
				return usageError{fmt.Errorf("--selector %q: unknown selector %q (want a comma-separated list of quest, dense)", *sels, s)}
			case slices.Contains(c.Selectors, s):
				return usageError{fmt.Errorf("--selector %q: %s twice", *sels, s)}
			}
			c.Selectors = append(c.Selectors, s)
		}
		c.Seed = *seed
		if err := c.Validate(); err != nil {
			return usageError{err}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var rows []serveload.Result
		start := time.Now()
		tr := serveload.NewTransport()
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: withBearer(tr, token)}
		err = serveload.Run(ctx, c, hc, &syncWriter{w: stderr}, func(r serveload.Result) error {
			rows = append(rows, r)
			return bench.WriteJSONLine(stdout, r)
		})
		if !*asJSON && len(rows) > 0 {
			writeServeTable(stderr, rows)
		}
		if errors.Is(err, serveload.ErrModelNotListed) {
			return usageError{err}
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

// writeServeTable prints the results as a Markdown table.
func writeServeTable(w io.Writer, rows []serveload.Result) {
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
	if !slices.ContainsFunc(rows, func(r serveload.Result) bool { return r.SharedPrefixLen > 0 }) {
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
