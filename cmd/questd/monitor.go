package main

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/questrt/questrt/completion"
)

// monitorMetrics are the histograms of the completions API's quality
// monitor (--monitor-rate), by layer, fed by completion's MonitorSample on
// the monitor's goroutine, and its sample counts read from the server's
// Stats at every scrape.
type monitorMetrics struct {
	recall *prometheus.HistogramVec // questrt_monitor_page_recall{layer}
	mass   *prometheus.HistogramVec // questrt_monitor_mass_recall{layer}
	outErr *prometheus.HistogramVec // questrt_monitor_output_error{layer}
}

// recallBuckets resolve the top of 0..1, where a good selection lives.
var recallBuckets = []float64{0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1}

// newMonitorMetrics registers the histograms on reg.
func newMonitorMetrics(reg prometheus.Registerer) (*monitorMetrics, error) {
	m := &monitorMetrics{
		recall: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "questrt_monitor_page_recall",
			Help:    "Quality monitor (--monitor-rate), per sampled (decode step, layer, KV head) of the completions API: the fraction of dense attention's top-10 tokens whose pages the step read, averaged over the KV head's query heads.",
			Buckets: recallBuckets,
		}, []string{"layer"}),
		mass: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "questrt_monitor_mass_recall",
			Help:    "Quality monitor (--monitor-rate), per sampled (decode step, layer, KV head): the dense softmax mass inside the pages the step read (1 - eps), averaged over the KV head's query heads.",
			Buckets: recallBuckets,
		}, []string{"layer"}),
		outErr: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "questrt_monitor_output_error",
			Help: "Quality monitor (--monitor-rate), per sampled (decode step, layer, KV head): ||o - o_dense|| / ||o_dense|| of the step's attention output against dense attention over the same pages, averaged over the KV head's query heads.",
			// 1e-6 to about 1.
			Buckets: prometheus.ExponentialBuckets(1e-6, 2, 21),
		}, []string{"layer"}),
	}
	for _, c := range []prometheus.Collector{m.recall, m.mass, m.outErr} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("monitor metrics: %w", err)
		}
	}
	return m, nil
}

// observe records one sample (completion.MonitorConfig.Observe).
func (m *monitorMetrics) observe(s completion.MonitorSample) {
	l := strconv.Itoa(s.Layer)
	m.recall.WithLabelValues(l).Observe(s.PageRecall)
	m.mass.WithLabelValues(l).Observe(s.MassRecall)
	m.outErr.WithLabelValues(l).Observe(s.OutputError)
}

// monitorCounts reports the monitor's sample counts from the server's
// Stats at each scrape.
type monitorCounts struct {
	srv     *completion.Server
	samples *prometheus.Desc
}

func newMonitorCounts(srv *completion.Server) *monitorCounts {
	return &monitorCounts{srv: srv, samples: prometheus.NewDesc("questrt_monitor_samples_total",
		"Quality monitor (--monitor-rate) samples of (decode step, layer, KV head), by outcome: sampled (drawn and forked for a replay), replayed (in the histograms), dropped (not replayed: the replay queue of --monitor-queue was full), failed (a fork or replay error, or the request's step failing).",
		[]string{"outcome"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *monitorCounts) Describe(ch chan<- *prometheus.Desc) { ch <- c.samples }

// Collect implements prometheus.Collector.
func (c *monitorCounts) Collect(ch chan<- prometheus.Metric) {
	st := c.srv.Stats()
	for _, o := range []struct {
		name string
		v    uint64
	}{{"sampled", st.MonitorSampled}, {"replayed", st.MonitorReplayed}, {"dropped", st.MonitorDropped}, {"failed", st.MonitorFailed}} {
		ch <- prometheus.MustNewConstMetric(c.samples, prometheus.CounterValue, float64(o.v), o.name)
	}
}
