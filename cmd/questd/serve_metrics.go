package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/questrt/questrt/completion"
)

// serveCounts exports the completions API's counters (completion.Stats) on
// /metrics: sequences by state (one per choice of a request), requests
// by outcome, tokens, decode steps and batch, prefill chunks, and the
// pages the started requests reserved.
type serveCounts struct {
	srv                                  *completion.Server
	reqs, outcomes, tokens, steps, pages *prometheus.Desc
	prefill, policyRefused, retries      *prometheus.Desc
	prefixReqs, prefixTokens             *prometheus.Desc
	prefixEvicted, prefixHeld            *prometheus.Desc
	prefixLost                           *prometheus.Desc
	pagesRead                            *prometheus.Desc
	poolResizes                          *prometheus.Desc
}

func newServeCounts(srv *completion.Server) *serveCounts {
	return &serveCounts{
		srv:           srv,
		reqs:          prometheus.NewDesc("questrt_serve_requests", "Completions API sequences now (one per choice of a request: n x prompts), by state: running (prefilling or decoding, at most --max-running) and queued (admitted, waiting for a running slot or for their request's pages; running plus queued at most --max-running + --max-queued).", []string{"state"}, nil),
		outcomes:      prometheus.NewDesc("questrt_serve_requests_total", "Completions API requests by outcome: admitted; refused (429 by admission, or 503 while draining); invalid (4xx for their parameters); and of the admitted: completed, timeout (past --request-timeout: 504 request_timeout), cancelled (the client gone), failed (an error).", []string{"outcome"}, nil),
		tokens:        prometheus.NewDesc("questrt_serve_tokens_total", "Tokens of the completions API, by kind: prompt (prefilled) and completion (generated).", []string{"kind"}, nil),
		steps:         prometheus.NewDesc("questrt_serve_decode_total", "Decode steps of the completions API (kind=steps, batches) and the sequences they decoded (kind=sequences): their ratio is the mean decode batch.", []string{"kind"}, nil),
		prefill:       prometheus.NewDesc("questrt_serve_prefill_chunks_total", "Prefill chunks (--prefill-chunk-tokens) the completions API ran.", nil, nil),
		pages:         prometheus.NewDesc("questrt_serve_pages", "Pages per shard of the completions API's pool, by state: reserved (by the running requests, all of a request's choices' pages when it starts; queued requests reserve none) and capacity (--serve-capacity-pages; with --serve-layout cluster and a pool sized from the nodes, as it follows them now: --serve-cluster-resize).", []string{"state"}, nil),
		prefixReqs:    prometheus.NewDesc("questrt_prefix_cache_requests_total", "Prompts looked up in the prefix cache (--prefix-caching), by result: hit (a cached prefix of full pages forked) or miss (prefilled from the start).", []string{"result"}, nil),
		prefixTokens:  prometheus.NewDesc("questrt_prefix_cache_tokens_total", "Prompt tokens of the prefix cache's lookups, by kind: queries (the prompts' tokens) and hits (the tokens the cache gave, not prefilled); hits / queries is the hit rate (vLLM's prefix_cache_queries and prefix_cache_hits).", []string{"kind"}, nil),
		prefixEvicted: prometheus.NewDesc("questrt_prefix_cache_evicted_pages_total", "Pages per shard the prefix cache gave up, least recently used first: for a request's pages (the cache never keeps a request waiting) or to stay within --prefix-cache-pages.", nil, nil),
		prefixHeld:    prometheus.NewDesc("questrt_prefix_cache", "The prefix cache now, by kind: entries (engine sequences, or cluster sequences with --serve-layout cluster) and pages (per shard, of --serve-capacity-pages; pages running requests share count here too).", []string{"kind"}, nil),
		prefixLost:    prometheus.NewDesc("questrt_prefix_cache_lost_entries_total", "Prefix cache entries dropped with their grid (--serve-layout cluster: a node of the grid lost); requests run again after the loss prefill anew.", nil, nil),
		pagesRead:     prometheus.NewDesc("questrt_serve_pages_read_total", "KV pages the completions API's decode steps read, per KV head (the requests' usage pages_read summed), by kind: read, and dense (what dense attention would have read: usage pages_total); read over dense is the bytes read vs a dense read. Counted here whatever --serve-layout (questrt_pages_read_total counts the steps of the node's coordinator, which the local and device layouts do not use).", []string{"kind"}, nil),
		retries:       prometheus.NewDesc("questrt_request_retries_total", "Times a completions request ran again, by reason: grid_lost (--serve-layout cluster: its grid lost a node; run again on a new grid from its prompt and the tokens already generated, at most --serve-grid-retries times a request) and preempted (--grow-reservations: the pool had no page for an older request's next token, so the newest gave its pages back and ran again from its prompt and the tokens already generated once the pool had room, or the pool sized from the cluster's nodes shrank as nodes left, --serve-cluster-resize; vLLM's num_preemptions).", []string{"reason"}, nil),
		poolResizes:   prometheus.NewDesc("questrt_serve_pool_resizes_total", "Times the completions API's pool, sized from the cluster's nodes (--serve-layout cluster, --serve-capacity-pages 0), took another size as nodes joined or left (--serve-cluster-resize); questrt_serve_pages{state=\"capacity\"} is its size now.", nil, nil),
		policyRefused: prometheus.NewDesc("questrt_serve_policy_grid_refusals_total", "Requests refused (429) because their quest options would open one grid more than --serve-policy-grids (--serve-layout cluster).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *serveCounts) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.reqs, c.outcomes, c.tokens, c.steps, c.prefill, c.pages, c.policyRefused, c.retries, c.poolResizes, c.prefixReqs, c.prefixTokens, c.prefixEvicted, c.prefixHeld, c.prefixLost, c.pagesRead} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *serveCounts) Collect(ch chan<- prometheus.Metric) {
	st := c.srv.Stats()
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.reqs, st.Running, "running")
	gauge(c.reqs, st.Queued, "queued")
	for _, o := range []struct {
		name string
		v    uint64
	}{{"admitted", st.Admitted}, {"refused", st.Refused}, {"invalid", st.Invalid}, {"completed", st.Completed}, {"timeout", st.TimedOut}, {"cancelled", st.Cancelled}, {"failed", st.Failed}} {
		counter(c.outcomes, o.v, o.name)
	}
	counter(c.tokens, st.PromptTokens, "prompt")
	counter(c.tokens, st.CompletionTokens, "completion")
	counter(c.steps, st.Steps, "steps")
	counter(c.steps, st.StepSequences, "sequences")
	counter(c.prefill, st.PrefillChunks)
	counter(c.pagesRead, st.PagesRead, "read")
	counter(c.pagesRead, st.PagesTotal, "dense")
	gauge(c.pages, st.ReservedPages, "reserved")
	gauge(c.pages, st.CapacityPages, "capacity")
	counter(c.policyRefused, st.PolicyGridsRefused)
	counter(c.retries, st.GridRetries, "grid_lost")
	counter(c.retries, st.Preemptions, "preempted")
	counter(c.poolResizes, st.PoolResizes)
	counter(c.prefixReqs, st.PrefixCacheHits, "hit")
	counter(c.prefixReqs, st.PrefixCacheMisses, "miss")
	counter(c.prefixTokens, st.PrefixCacheQueryTokens, "queries")
	counter(c.prefixTokens, st.PrefixCacheHitTokens, "hits")
	counter(c.prefixEvicted, st.PrefixCacheEvictedPages)
	counter(c.prefixLost, st.PrefixCacheLost)
	gauge(c.prefixHeld, st.PrefixCacheEntries, "entries")
	gauge(c.prefixHeld, st.PrefixCachePages, "pages")
}
