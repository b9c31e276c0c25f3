package main

import (
	"slices"
	"sync"
	"sync/atomic"

	gometrics "github.com/hashicorp/go-metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// memberlist's health score (its "awareness") counts this node's recent
// failures to take part in failure detection (probes it could not
// complete, suspicions of itself it had to refute): 0 is healthy, and
// memberlist stretches its own probe timeouts by 1 + score, up to
// AwarenessMaxMultiplier - 1 (7). cluster.Membership does not expose
// memberlist's GetHealthScore; memberlist publishes the score through
// go-metrics' global sink as the gauge memberlist.health.score whenever
// it changes (it starts at 0), so questd installs a sink that keeps it.
// The sink is process-wide, like the membership of a questd process.

// healthKey is memberlist's key of the score.
var healthKey = []string{"memberlist", "health", "score"}

// scoreSink is a go-metrics sink that keeps memberlist's health score
// and drops everything else.
type scoreSink struct {
	gometrics.BlackholeSink
	score atomic.Int64
}

func (s *scoreSink) SetGauge(key []string, val float32) { s.SetGaugeWithLabels(key, val, nil) }

func (s *scoreSink) SetGaugeWithLabels(key []string, val float32, _ []gometrics.Label) {
	if slices.Equal(key, healthKey) {
		s.score.Store(int64(val))
	}
}

// healthSink installs the process's go-metrics sink, once: no service or
// host prefix on the keys, no runtime statistics (no goroutine), every
// key passed on.
var healthSink = sync.OnceValue(func() *scoreSink {
	s := &scoreSink{}
	if _, err := gometrics.NewGlobal(&gometrics.Config{FilterDefault: true}, s); err != nil {
		panic("questd: go-metrics sink: " + err.Error()) // New fails for no config
	}
	return s
})

// newHealthScore is the gauge questrt_memberlist_health_score.
func newHealthScore() prometheus.Collector {
	s := healthSink()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "questrt_memberlist_health_score",
		Help: "memberlist's health score (awareness) of this node: 0 is healthy; each probe it could not complete or suspicion of itself it had to refute raises it, each probe that succeeds lowers it, up to 7; memberlist stretches its probe timeouts by 1 + score. A score above 0 that lasts points at this node's network or CPU, not at its peers.",
	}, func() float64 { return float64(s.score.Load()) })
}
