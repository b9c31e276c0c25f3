package faultproxy

import (
	"testing"
	"time"
)

// decide: latency always; a spike by draw or by window; a stall adds the
// loss delay (default 200 ms); a reset drops everything else.
func TestDecide(t *testing.T) {
	ms := time.Millisecond
	f := &Faults{Latency: 5 * ms, SpikeDelay: 50 * ms, SpikeProb: 0.1, SpikeEvery: time.Second, SpikeFor: 100 * ms, LossProb: 0.05}
	for _, tc := range []struct {
		since       time.Duration
		spike, loss float64
		want        outcome
		explanation string
	}{
		{500 * ms, 0.5, 0.5, outcome{delay: 5 * ms}, "nothing drawn, outside the window"},
		{500 * ms, 0.05, 0.5, outcome{delay: 55 * ms, spike: true}, "spike drawn"},
		{2050 * ms, 0.5, 0.5, outcome{delay: 55 * ms, spike: true}, "in the third window"},
		{2100 * ms, 0.5, 0.5, outcome{delay: 5 * ms}, "just after the third window"},
		{500 * ms, 0.5, 0.01, outcome{delay: 205 * ms, stall: true}, "lost: the default loss delay"},
		{50 * ms, 0.01, 0.01, outcome{delay: 255 * ms, spike: true, stall: true}, "spiked and lost"},
	} {
		if got := decide(f, tc.since, tc.spike, tc.loss); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.explanation, got, tc.want)
		}
	}
	r := *f
	r.Loss, r.LossDelay = LossReset, time.Second
	if got := decide(&r, 0, 0, 0); got != (outcome{reset: true}) {
		t.Errorf("reset loss: %+v", got)
	}
	s := *f
	s.LossDelay = 30 * ms
	if got := decide(&s, 500*ms, 0.5, 0); got != (outcome{delay: 35 * ms, stall: true}) {
		t.Errorf("loss delay 30ms: %+v", got)
	}
	if got := decide(&Faults{}, 12345*ms, 0, 0); got != (outcome{}) {
		t.Errorf("no faults, zero draws: %+v", got)
	}
}

// The same seed draws the same fates: runs are repeatable.
func TestSeedRepeatable(t *testing.T) {
	fates := func() []time.Duration {
		p := &Proxy{start: time.Now()}
		p.rng = newRand(42)
		p.faults.Store(&Faults{SpikeProb: 0.3, SpikeDelay: time.Millisecond, LossProb: 0.2})
		var d []time.Duration
		for range 100 {
			x, _ := p.fate(p.start)
			d = append(d, x)
		}
		return d
	}
	a, b := fates(), fates()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("fate %d: %v then %v with the same seed", i, a[i], b[i])
		}
	}
}
