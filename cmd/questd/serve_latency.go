package main

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/questrt/questrt/completion"
)

// serveLatency is the completions API's latency histograms, labelled
// with the model's name as vLLM's are (model_name), and the per-request
// log line: completion.Config.Observe gets every finished request.
type serveLatency struct {
	model                string
	ttft, itl, e2e, wait *prometheus.HistogramVec
	log                  *slog.Logger
}

// Histogram buckets, in seconds: vLLM's, with finer low ends (a GPU
// decodes a token in a few milliseconds).
var (
	ttftBuckets  = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets   = []float64{0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	totalBuckets = []float64{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
)

// newServeLatency registers the histograms on reg.
func newServeLatency(reg prometheus.Registerer, model string, log *slog.Logger) (*serveLatency, error) {
	l := &serveLatency{model: model, log: log}
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, []string{"model_name"})
	}
	l.ttft = hist("questrt_serve_time_to_first_token_seconds", "Completions API: time from a request's arrival (its body read) to its first generated token, per request that generated one.", ttftBuckets)
	l.itl = hist("questrt_serve_inter_token_latency_seconds", "Completions API: time between consecutive generated tokens of a request, per token after the first.", itlBuckets)
	l.e2e = hist("questrt_serve_e2e_request_latency_seconds", "Completions API: time from a request's arrival to its end (completed, cancelled or failed), per admitted request.", totalBuckets)
	l.wait = hist("questrt_serve_request_queue_time_seconds", "Completions API: time from a request's arrival to the scheduler taking it up (--max-running), per admitted request.", totalBuckets)
	for _, c := range []prometheus.Collector{l.ttft, l.itl, l.e2e, l.wait} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// observe records a finished request and logs its line.
func (l *serveLatency) observe(t completion.RequestTiming) {
	if t.FirstToken > 0 {
		l.ttft.WithLabelValues(l.model).Observe(t.FirstToken.Seconds())
	}
	itl := l.itl.WithLabelValues(l.model)
	var sum time.Duration
	for _, d := range t.InterToken {
		itl.Observe(d.Seconds())
		sum += d
	}
	l.e2e.WithLabelValues(l.model).Observe(t.Total.Seconds())
	l.wait.WithLabelValues(l.model).Observe(t.Queue.Seconds())
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	attrs := []any{"id", t.ID, "outcome", t.Outcome, "prompt_tokens", t.Usage.PromptTokens, "completion_tokens", t.Usage.CompletionTokens,
		"ttft_ms", ms(t.FirstToken), "e2e_ms", ms(t.Total), "queue_ms", ms(t.Queue), "pages_read", t.Usage.PagesRead, "pages_total", t.Usage.PagesTotal}
	if n := len(t.InterToken); n > 0 {
		attrs = append(attrs, "itl_mean_ms", ms(sum/time.Duration(n)))
	}
	if t.Finish != "" {
		attrs = append(attrs, "finish", t.Finish)
	}
	if t.Chat {
		attrs = append(attrs, "chat", true)
	}
	l.log.Info("request", attrs...)
}

// apiHandler is the completions API's handler on --http-addr: the API
// behind the token (--token-file, when set), and, as vLLM serves them on
// its API port, /health (no token: a load balancer's probe) and the
// node's /metrics (behind the token too: the API's address is the public
// one, and the registry names peers).
func apiHandler(api http.Handler, token string, reg *prometheus.Registry, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", requireToken(token, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError), Registry: reg,
	})))
	mux.Handle("/health", api)
	mux.Handle("/", requireToken(token, api))
	return mux
}
