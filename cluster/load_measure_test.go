package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMeasureDetectionUnderLoad measures failure detection with CPU
// saturated, for the timings questd might use: three members in this
// process, busy goroutines (QUESTRT_MEASURE_BUSY, default 4 per CPU;
// half of them allocate 1 MiB a round, so the garbage collector runs too) competing with memberlist's for the
// machine's cores during QUESTRT_MEASURE_LOAD (a duration, e.g. 30s);
// it counts how often a live member was suspected or declared dead, then
// kills one member under the same load and times its detection. A
// measurement, not a check: it runs only when QUESTRT_MEASURE_LOAD is
// set, and its figures are in the log (go test ./cluster -run
// TestMeasureDetectionUnderLoad -v).
func TestMeasureDetectionUnderLoad(t *testing.T) {
	env := os.Getenv("QUESTRT_MEASURE_LOAD")
	if env == "" {
		t.Skip("set QUESTRT_MEASURE_LOAD to a duration to measure")
	}
	d, err := time.ParseDuration(env)
	if err != nil {
		t.Fatalf("QUESTRT_MEASURE_LOAD=%q: %v", env, err)
	}
	busy := 4 * runtime.NumCPU()
	if b := os.Getenv("QUESTRT_MEASURE_BUSY"); b != "" {
		if _, err := fmt.Sscan(b, &busy); err != nil || busy < 1 {
			t.Fatalf("QUESTRT_MEASURE_BUSY=%q: want a count of goroutines", b)
		}
	}
	yield := os.Getenv("QUESTRT_MEASURE_YIELD") != ""
	for _, tc := range []struct {
		name           string
		probe, timeout time.Duration
		mult           int
	}{
		{"questd defaults (memberlist LAN)", time.Second, 500 * time.Millisecond, 4},
		{"questd defaults, x3 (confirmations at 3 members)", time.Second, 500 * time.Millisecond, 3},
		{"longer probe timeout", time.Second, 900 * time.Millisecond, 4},
		{"longer suspicion", time.Second, 500 * time.Millisecond, 8},
		{"longer probe timeout and suspicion", time.Second, 900 * time.Millisecond, 8},
		{"test clusters (nodetest.Member)", 150 * time.Millisecond, 100 * time.Millisecond, 6},
		// memberlist expects SuspicionMult-2 confirmations of a suspicion
		// from other members, none when fewer than that can come (n-2 <
		// SuspicionMult-2): at 3 members only x3 keeps Lifeguard's
		// confirmation-scaled suspicion (up to SuspicionMaxTimeoutMult
		// times longer while the other member has not confirmed).
		{"test clusters, x3 (confirmations at 3 members)", 150 * time.Millisecond, 100 * time.Millisecond, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if only := os.Getenv("QUESTRT_MEASURE_ONLY"); only != "" && !strings.Contains(tc.name, only) {
				t.Skip("not in QUESTRT_MEASURE_ONLY")
			}
			leakCheck(t)
			events := newEventLog()
			cfg := func(n string) MemberConfig {
				c := fastConfig(t, n)
				c.Logger = slog.New(events)
				c.ProbeInterval, c.ProbeTimeout, c.SuspicionMult = tc.probe, tc.timeout, tc.mult
				c.GossipInterval, c.PushPullInterval, c.TCPTimeout = min(200*time.Millisecond, tc.probe/3), 30*time.Second, 10*time.Second
				c.DeadNodeReclaimTime = 100 * time.Millisecond
				return c
			}
			nodes := startCluster(t, 3, cfg)
			var suspects, deaths atomic.Int64
			var wg sync.WaitGroup
			for _, m := range nodes {
				_, sub := m.Subscribe(256)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ev := range sub.Events() {
						switch ev.Type {
						case EventSuspect:
							suspects.Add(1)
						case EventDead:
							deaths.Add(1)
						}
					}
				}()
			}
			loadStop := saturate(busy, yield)
			sctx, scancel := context.WithTimeout(t.Context(), d)
			sleepLate, udpRTT := schedLatency(sctx)
			scancel()
			time.Sleep(100 * time.Millisecond) // the subscribers take the last events
			failedPings, refutes := events.count("failedping"), events.count("refute")
			for _, l := range events.dump() {
				t.Log(l)
			}
			events.reset()
			falseSusp, falseDeaths := suspects.Load(), deaths.Load()
			if stateOf(nodes[0], "n2") == StateDead || stateOf(nodes[1], "n2") == StateDead {
				t.Logf("n2 was already declared dead, alive, before it was killed")
			}
			if err := nodes[2].Shutdown(); err != nil {
				t.Fatal(err)
			}
			took := waitFor(t, time.Minute, "n2 dead at n0 and n1 under load", func() bool {
				return stateOf(nodes[0], "n2") == StateDead && stateOf(nodes[1], "n2") == StateDead
			})
			loadStop()
			for _, m := range nodes[:2] {
				_ = m.Shutdown()
			}
			wg.Wait()
			t.Logf("%s (probe %v, timeout %v, suspicion x%d) on %d CPUs, %d busy goroutines, %v: "+
				"yield %v: %d suspicions and %d deaths of live members; a killed member declared dead by both others after %v (bound when healthy %v)",
				tc.name, tc.probe, tc.timeout, tc.mult, runtime.NumCPU(), busy, d, yield,
				falseSusp, falseDeaths, took.Round(10*time.Millisecond), cfg("x").DetectionBound(3))
			s50, s99, smax := quantiles(sleepLate)
			u50, u99, umax := quantiles(udpRTT)
			t.Logf("under load: %d failed direct probes, %d refutations; a 2ms sleep woke late by p50 %v p99 %v max %v; "+
				"a loopback UDP echo took p50 %v p99 %v max %v",
				failedPings, refutes, s50, s99, smax, u50, u99, umax)
		})
	}
}

// saturate starts n goroutines that keep the CPUs busy (every other one
// allocating) until the returned function is called, which waits for
// them.
func saturate(n int, yield bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var sink atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := uint64(i + 1)
			for {
				select {
				case <-done:
					return
				default:
				}
				for range 1 << 16 {
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
				}
				if yield {
					runtime.Gosched()
				}
				if i%2 == 1 {
					b := make([]byte, 1<<20)
					b[0] = byte(x)
					sink.Add(int64(b[0]))
				}
			}
		}()
	}
	return func() {
		close(done)
		wg.Wait()
	}
}
