package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/internal/buildinfo"
	"github.com/questrt/questrt/node"
)

// metrics are questd's Prometheus metrics, registered on the registry
// main made: the steps the node coordinates and the peers that failed
// them (fed by coord.StepStats through node.Config.Observe), the node's
// state (read from node.Stats at every scrape), memberlist's health
// score, the build, and the Go runtime and process.
type metrics struct {
	phase   *prometheus.HistogramVec // questrt_step_phase_seconds{phase}
	steps   *prometheus.CounterVec   // questrt_steps_total{kind,code}
	read    prometheus.Counter       // questrt_pages_read_total
	total   prometheus.Counter       // questrt_pages_total
	peerErr *prometheus.CounterVec   // questrt_collective_errors_total{peer,kind}
	persist *prometheus.CounterVec   // questrt_persist_errors_total{kind} (persistWatch)
	// quarantined is questrt_data_dir_quarantined_total
	// (node.Config.OnQuarantine).
	quarantined prometheus.Counter
}

// newMetrics registers questd's metrics on reg; st is the readiness whose
// node the state gauges read.
func newMetrics(reg prometheus.Registerer, st *readiness) (*metrics, error) {
	m := &metrics{
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "questrt_step_phase_seconds",
			Help: "Time of the phases of the decode steps this node coordinated, successful ones: score, topk, exchange (the CP selection exchange), attend and merge on CP rank 0 of TP group 0 (summed over the layers of a multi-layer step), total the coordinator's wall time of the step.",
			// 10us to about 5s.
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 20),
		}, []string{"phase"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "questrt_steps_total",
			Help: "Decode steps this node coordinated, by kind (step: one layer; steps: one token through a range of layers with the plan sent once, the Steps stream and the served model's decode steps) and gRPC code of the answer (OK on success).",
		}, []string{"kind", "code"}),
		read: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "questrt_pages_read_total",
			Help: "KV pages read by the decode steps this node coordinated, per KV head (plan reads x KV heads, over items and layers); over questrt_pages_total: the bytes read vs a dense read. The completions API's steps with --serve-layout local or device do not go through the coordinator: questrt_serve_pages_read_total counts them.",
		}),
		total: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "questrt_pages_total",
			Help: "KV pages a dense read of the same decode steps would have read, per KV head (plan pages x KV heads, over items and layers).",
		}),
		peerErr: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "questrt_collective_errors_total",
			Help: "Decode steps this node coordinated that failed because of a peer, by the peer's node name and kind: unavailable (unreachable, its worker or collective transport gone, or declared gone by the membership while the step ran), timeout (its call passed the step's deadline; a stalled node makes its grid's other nodes time out too) or other (another error it answered). A step counts once per peer and kind; nodes that only relayed another's failure (a collective abort or closed peer) are counted only when no node failed by itself.",
		}, []string{"peer", "kind"}),
		persist: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "questrt_persist_errors_total",
			Help: "Failed operations on the files of --data-dir by the grids hosted on this node (page writes, metadata commits, syncs, the periodic flusher's, the saves at a grid's close), by kind: disk_full (ENOSPC or EDQUOT: the client gets RESOURCE_EXHAUSTED), io (another operating system error) or other. The change stays in memory but is not durable; each is logged with the file.",
		}, []string{"kind"}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "questrt_data_dir_quarantined_total",
			Help: "Grid directories of --data-dir found damaged (a metadata file that fails its check) and moved aside (DIR.corrupt-TIME, logged with both paths); the grid opened on a fresh directory, this node's part of its sequences lost.",
		}),
	}
	for _, k := range []string{persistDiskFull, persistIO, persistOther} {
		m.persist.WithLabelValues(k)
	}
	bi := buildinfo.Read()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "questrt_build_info",
		Help:        "Always 1: the questrt version, VCS revision and Go version of this binary.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Rev(), "goversion": bi.GoVersion},
	})
	build.Set(1)
	for _, c := range []prometheus.Collector{
		m.phase, m.steps, m.read, m.total, m.peerErr, m.persist, m.quarantined, build, newStateCollector(st), newHealthScore(),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return m, nil
}

// observe records one step (node.Config.Observe).
func (m *metrics) observe(s coord.StepStats) {
	m.steps.WithLabelValues(s.Kind, s.Code.String()).Inc()
	m.read.Add(float64(s.PagesRead))
	m.total.Add(float64(s.PagesTotal))
	for _, pe := range s.PeerErrors {
		m.peerErr.WithLabelValues(pe.Node, pe.Kind).Inc()
	}
	if s.Err != nil {
		return // partial phase times would skew the histograms
	}
	for _, p := range []struct {
		name string
		d    time.Duration
	}{
		{"score", s.Time.Score}, {"topk", s.Time.TopK}, {"exchange", s.Time.Select},
		{"attend", s.Time.Attend}, {"merge", s.Time.Merge}, {"total", s.Time.Total},
	} {
		m.phase.WithLabelValues(p.name).Observe(p.d.Seconds())
	}
}

// stateCollector reports the node's state from node.Stats at each scrape
// (nothing before the node started).
type stateCollector struct {
	st                            *readiness
	seqs, grids, pages, membersUp *prometheus.Desc
	tierPages                     *prometheus.Desc
	recSeqs, recLost, recCorrupt  *prometheus.Desc
	recRolledBack                 *prometheus.Desc
	offPages, offWasted, offBytes *prometheus.Desc
	offEvict, offStall            *prometheus.Desc
}

func newStateCollector(st *readiness) *stateCollector {
	return &stateCollector{
		st:            st,
		seqs:          prometheus.NewDesc("questrt_sequences", "Sequences this node coordinates.", nil, nil),
		grids:         prometheus.NewDesc("questrt_grids", "Grids this node's coordinator drives (coordinated) and grids with ranks on this node (hosted).", []string{"role"}, nil),
		pages:         prometheus.NewDesc("questrt_pages", "KV pages of the grids hosted on this node (used) and left of --max-pages (free).", []string{"state"}, nil),
		membersUp:     prometheus.NewDesc("questrt_members_up", "Members this node's view shows up (alive or suspect), itself included.", nil, nil),
		tierPages:     prometheus.NewDesc("questrt_tier_pages", "KV pages in use in the shards hosted on this node, by tier: in a device pool (device) or offloaded to the host tier (host; --device-budget-pages). Without offload every used page is on the device.", []string{"tier"}, nil),
		recSeqs:       prometheus.NewDesc("questrt_recovery_sequences", "Sequences the grids hosted on this node found in --data-dir since the process started, by state: recovered (their sealed pages, and the tails a graceful shutdown wrote, came back), damaged (a checksum or check failed: not used), and parked now (recovered, not claimed by a coordinator yet: their pages count against the grid's pool).", []string{"state"}, nil),
		recLost:       prometheus.NewDesc("questrt_recovery_lost_tokens", "Tokens the recovered sequences had past their recovered lengths when the node stopped (the tail tokens a crash lost; 0 after a graceful shutdown), summed since the process started: re-append them.", nil, nil),
		recRolledBack: prometheus.NewDesc("questrt_recovery_rolled_back_tokens_total", "Tokens (summed over layers) that recovery cut from the sequences found in --data-dir because the decode step that appended them had not ended when the node stopped (a crash or stop inside a step: never acknowledged, counted in questrt_recovery_lost_tokens as well), since the process started.", nil, nil),
		recCorrupt:    prometheus.NewDesc("questrt_recovery_corrupt_slots", "Slab slots of --data-dir whose payload or record failed its checksum at recovery, since the process started.", nil, nil),
		offPages:      prometheus.NewDesc("questrt_offload_recall_pages_total", "Pages the steps of the offloading shards hosted here wanted (--device-budget-pages), by result: hit (resident), miss (brought in from the host tier), prefetch_hit (resident because a prefetch brought it; also counted as hit). Sums over the open grids: a closing grid's counts leave them (a counter reset).", []string{"result"}, nil),
		offWasted:     prometheus.NewDesc("questrt_offload_prefetch_wasted_pages_total", "Prefetched pages that left the device before any step used them, in the offloading shards hosted here (sums over the open grids).", nil, nil),
		offBytes:      prometheus.NewDesc("questrt_offload_bytes_total", "Page payload bytes moved by the offloading shards hosted here, by direction: in (host tier to device pool, prefetch included), out (device pool to host tier: write-backs). Sums over the open grids.", []string{"direction"}, nil),
		offEvict:      prometheus.NewDesc("questrt_offload_evictions_total", "Pages evicted from the device pools of the offloading shards hosted here, by whether they were written back to the tier first (dirty) or not (clean). Sums over the open grids.", []string{"kind"}, nil),
		offStall:      prometheus.NewDesc("questrt_offload_stall_seconds_total", "Time the steps of the offloading shards hosted here spent bringing pages in (tier reads, write-backs, waits for prefetches). Sums over the open grids.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.seqs
	ch <- c.grids
	ch <- c.pages
	ch <- c.membersUp
	ch <- c.tierPages
	ch <- c.recSeqs
	ch <- c.recLost
	ch <- c.recRolledBack
	ch <- c.recCorrupt
	ch <- c.offPages
	ch <- c.offWasted
	ch <- c.offBytes
	ch <- c.offEvict
	ch <- c.offStall
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.st.node()
	if n == nil {
		return
	}
	s := n.Stats()
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	gauge(c.seqs, s.Sequences)
	gauge(c.grids, s.GridsCoordinated, "coordinated")
	gauge(c.grids, s.GridsHosted, "hosted")
	gauge(c.pages, s.PagesUsed, "used")
	gauge(c.pages, s.PagesFree, "free")
	gauge(c.tierPages, s.PagesDevice, "device")
	gauge(c.tierPages, s.PagesHost, "host")
	gauge(c.membersUp, s.MembersUp)
	gauge(c.recSeqs, s.Recovery.Sequences, "recovered")
	gauge(c.recSeqs, s.Recovery.Damaged, "damaged")
	gauge(c.recSeqs, s.Recovery.Parked, "parked")
	gauge(c.recLost, s.Recovery.LostTokens)
	gauge(c.recCorrupt, s.Recovery.CorruptSlots)
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	counter(c.recRolledBack, float64(s.Recovery.RolledBack))
	o := s.Offload
	counter(c.offPages, float64(o.Hits), "hit")
	counter(c.offPages, float64(o.Misses), "miss")
	counter(c.offPages, float64(o.PrefetchHits), "prefetch_hit")
	counter(c.offWasted, float64(o.PrefetchWasted))
	counter(c.offBytes, float64(o.BytesIn), "in")
	counter(c.offBytes, float64(o.BytesOut), "out")
	counter(c.offEvict, float64(o.WriteBacks), "dirty")
	counter(c.offEvict, float64(o.Evictions-o.WriteBacks), "clean")
	counter(c.offStall, o.Stall.Seconds())
}

// readiness is what /readyz answers: ready once the node started (it
// has joined and serves) until the drain begins.
type readiness struct {
	n        atomic.Pointer[node.Node]
	draining atomic.Bool
}

// set records the started node.
func (r *readiness) set(n *node.Node) { r.n.Store(n) }

// drain records that the drain began.
func (r *readiness) drain() { r.draining.Store(true) }

// node is the started node, nil before.
func (r *readiness) node() *node.Node { return r.n.Load() }

// ready reports whether the node serves, has joined and is not draining.
func (r *readiness) ready() bool {
	n := r.node()
	return n != nil && n.Serving() && !r.draining.Load()
}

// httpHandler serves /metrics (reg's metrics), /healthz (200 while the
// process runs) and /readyz (200 while ready reports true, 503 otherwise).
func httpHandler(reg *prometheus.Registry, ready func() bool, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError), Registry: reg,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}
