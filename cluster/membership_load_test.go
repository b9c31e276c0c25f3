package cluster

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMembershipBusyIsNotDead loads the process the way questd's compute
// does (goroutines on every P, four per P, running items and yielding
// every 200 us or so as kernels' and model's parallel loops do) with
// the test clusters' fast timings (nodetest.Member: probe 150 ms, 100 ms
// to answer, suspicion x6): no live member may be declared dead in 8 s
// of load, and a member killed under the same load must be declared dead
// by both others within twice the healthy bound. Busy goroutines that
// never yield declared live members dead 15 and 16 times in 20 s on a
// 2-CPU machine (TestMeasureDetectionUnderLoad); QUESTRT_TEST_NO_YIELD=1
// makes this test's goroutines never yield, to see it fail so (6 deaths
// in its 8 s on a run).
func TestMembershipBusyIsNotDead(t *testing.T) {
	// It times the scheduler on this machine, so it runs where asked
	// (QUESTRT_LOAD_TESTS=1), not beside other packages' tests in CI,
	// whose processes load the cores in a way no yield can help.
	if testing.Short() || os.Getenv("QUESTRT_LOAD_TESTS") == "" {
		t.Skip("8 s of load; QUESTRT_LOAD_TESTS=1 runs it")
	}
	leakCheck(t)
	cfg := func(n string) MemberConfig {
		c := fastConfig(t, n)
		c.ProbeInterval, c.ProbeTimeout, c.SuspicionMult = 150*time.Millisecond, 100*time.Millisecond, 6
		c.GossipInterval = 50 * time.Millisecond
		return c
	}
	nodes := startCluster(t, 3, cfg)
	var deaths atomic.Int64
	var wg sync.WaitGroup
	for _, m := range nodes {
		_, sub := m.Subscribe(256)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range sub.Events() {
				if ev.Type == EventDead {
					deaths.Add(1)
				}
			}
		}()
	}
	stop := sync.OnceFunc(saturate(4*runtime.GOMAXPROCS(0), os.Getenv("QUESTRT_TEST_NO_YIELD") == ""))
	t.Cleanup(stop)
	time.Sleep(8 * time.Second)
	time.Sleep(100 * time.Millisecond) // the subscribers take the last events
	falseDeaths := deaths.Load()
	if falseDeaths > 0 {
		t.Errorf("live members declared dead %d times in 8 s of load", falseDeaths)
	}
	if err := nodes[2].Shutdown(); err != nil {
		t.Fatal(err)
	}
	bound := 2 * cfg("x").DetectionBound(3)
	took := waitFor(t, bound, "the killed n2 dead at n0 and n1 under load", func() bool {
		return stateOf(nodes[0], "n2") == StateDead && stateOf(nodes[1], "n2") == StateDead
	})
	stop()
	for _, m := range nodes[:2] {
		_ = m.Shutdown()
	}
	wg.Wait()
	t.Logf("under load: %d deaths of live members; a killed member declared dead by both others in %v (bound %v)",
		falseDeaths, took.Round(10*time.Millisecond), bound)
}
