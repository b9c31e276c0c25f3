package model

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/questrt/questrt/internal/yield/yieldtest"
)

// TestParallelLetsTheNetworkIn checks that busy parallel loops leave room
// for the goroutines the network wakes (memberlist's probes and acks,
// gRPC): two loops of GOMAXPROCS goroutines each (a prefill and a decode
// on one node) run items of about 100 us back to back while a loopback
// UDP echo between two goroutines is timed. Without the loops' yields
// its median was 66-107 ms on 2 CPUs (kernels' TestPoolLetsTheNetworkIn
// measures the same for the kernels' pool); with them about 20 ms.
func TestParallelLetsTheNetworkIn(t *testing.T) {
	// It times the scheduler on this machine, so it runs where asked
	// (QUESTRT_LOAD_TESTS=1), not beside other packages' tests in CI,
	// whose processes load the cores in a way no yield can help.
	if testing.Short() || os.Getenv("QUESTRT_LOAD_TESTS") == "" {
		t.Skip("3 s of load; QUESTRT_LOAD_TESTS=1 runs it")
	}
	defer goleak.VerifyNone(t)
	var stop atomic.Bool
	var sink atomic.Uint64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				parallel(0, 64*runtime.GOMAXPROCS(0), func(_, i int) { sink.Add(yieldtest.Spin(i)) })
			}
		}()
	}
	rtts := yieldtest.EchoRTTs(t, 3*time.Second)
	stop.Store(true)
	wg.Wait()
	p50, p90 := rtts[len(rtts)/2], rtts[len(rtts)*9/10]
	t.Logf("%d echoes with 2 parallel loops of %d goroutines busy: p50 %v, p90 %v, max %v",
		len(rtts), runtime.GOMAXPROCS(0), p50, p90, rtts[len(rtts)-1])
	if p50 > 50*time.Millisecond {
		t.Errorf("a loopback UDP echo took %v (median) while the loops ran: network goroutines starve", p50)
	}
}
