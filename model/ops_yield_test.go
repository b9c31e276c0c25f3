package model

import (
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
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
				parallel(0, 64*runtime.GOMAXPROCS(0), func(_, i int) {
					x := uint64(i + 1)
					for deadline := time.Now().Add(100 * time.Microsecond); time.Now().Before(deadline); {
						for range 256 {
							x ^= x << 13
							x ^= x >> 7
							x ^= x << 17
						}
					}
					sink.Add(x)
				})
			}
		}()
	}
	srv, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		b := make([]byte, 16)
		for {
			n, a, err := srv.ReadFrom(b)
			if err != nil {
				return
			}
			_, _ = srv.WriteTo(b[:n], a)
		}
	}()
	cli, err := net.Dial("udp", srv.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	var rtts []time.Duration
	b := make([]byte, 16)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		t0 := time.Now()
		_ = cli.SetReadDeadline(t0.Add(2 * time.Second))
		if _, err := cli.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Read(b); err != nil {
			rtts = append(rtts, 2*time.Second) // a lost echo counts as slow
			continue
		}
		rtts = append(rtts, time.Since(t0))
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	_ = cli.Close()
	_ = srv.Close()
	<-echoed
	slices.Sort(rtts)
	p50, p90 := rtts[len(rtts)/2], rtts[len(rtts)*9/10]
	t.Logf("%d echoes with 2 parallel loops of %d goroutines busy: p50 %v, p90 %v, max %v",
		len(rtts), runtime.GOMAXPROCS(0), p50, p90, rtts[len(rtts)-1])
	if p50 > 50*time.Millisecond {
		t.Errorf("a loopback UDP echo took %v (median) while the loops ran: network goroutines starve", p50)
	}
}
