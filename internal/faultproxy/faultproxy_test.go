package faultproxy_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/questrt/questrt/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo is a TCP echo server on loopback: it copies every connection back
// to itself and half-closes after its peer's EOF. Cleanup stops it.
func echo(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			})
		}
	})
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// start runs a proxy on loopback to target; cleanup closes it.
func start(t *testing.T, target string, f faultproxy.Faults) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Listen(t.Context(), "127.0.0.1:0", faultproxy.Config{Target: target, Faults: f, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *faultproxy.Proxy) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c.(*net.TCPConn)
}

// roundTrip sends msg and reads it back; it returns the time taken.
func roundTrip(t *testing.T, c net.Conn, msg []byte) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("echo differs")
	}
	return time.Since(start)
}

// Without faults the bytes arrive intact and in order, both ways, over
// many reads and chunks; a half-close passes through (the echo server
// sees EOF, finishes and closes; the client reads everything then EOF).
func TestForwardIntact(t *testing.T) {
	p := start(t, echo(t), faultproxy.Faults{})
	c := dial(t, p)
	data := make([]byte, 3<<20+17)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for off := 0; off < len(data); {
			n := min(1+rng.IntN(100000), len(data)-off)
			if _, err := c.Write(data[off : off+n]); err != nil {
				t.Error(err)
				return
			}
			off += n
		}
		c.CloseWrite()
	})
	got, err := io.ReadAll(c)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%d bytes back, want %d, equal %v", len(got), len(data), bytes.Equal(got, data))
	}
	st := p.Stats()
	if st.Accepted != 1 || st.Bytes != 2*int64(len(data)) || st.Chunks < 2*int64(len(data)/faultproxy.DefaultChunkSize) {
		t.Errorf("stats %+v", st)
	}
	// The connection ends once both sides closed.
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Open != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after both ends closed", p.Stats().Open)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Latency delays each direction: a round trip takes at least twice it.
// SetFaults applies to an open connection.
func TestLatency(t *testing.T) {
	p := start(t, echo(t), faultproxy.Faults{Latency: 30 * time.Millisecond})
	c := dial(t, p)
	msg := []byte("ping")
	if d := roundTrip(t, c, msg); d < 60*time.Millisecond || d > 2*time.Second {
		t.Errorf("round trip with 30ms latency took %v, want at least 60ms", d)
	}
	if err := p.SetFaults(faultproxy.Faults{}); err != nil {
		t.Fatal(err)
	}
	// Without latency a round trip is under the 60 ms of the latency
	// (once at least in 50 tries, on a loaded machine: with the latency
	// still on, none would be).
	best := time.Hour
	for i := 0; i < 50 && best >= 60*time.Millisecond; i++ {
		best = min(best, roundTrip(t, c, msg))
	}
	if best >= 60*time.Millisecond {
		t.Errorf("round trip without latency took %v at best", best)
	}
	if err := p.SetFaults(faultproxy.Faults{Latency: 30 * time.Millisecond, SpikeProb: 1, SpikeDelay: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if d := roundTrip(t, c, msg); d < 100*time.Millisecond {
		t.Errorf("round trip with 30ms latency and a 20ms spike on every chunk took %v, want at least 100ms", d)
	}
	if st := p.Stats(); st.Spiked < 2 {
		t.Errorf("spiked %d chunks, want 2", st.Spiked)
	}
}

// Spike windows: a round trip in the window of a period is slow, one
// outside it is not.
func TestSpikeWindows(t *testing.T) {
	p := start(t, echo(t), faultproxy.Faults{SpikeEvery: 400 * time.Millisecond, SpikeFor: 200 * time.Millisecond, SpikeDelay: 40 * time.Millisecond})
	c := dial(t, p)
	var slow, fast int
	// The loop ends once it has seen both; the deadline is ten periods
	// and more, for a loaded machine whose round trips outside the
	// windows are slow too.
	deadline := time.Now().Add(10 * time.Second)
	for (slow == 0 || fast == 0) && time.Now().Before(deadline) {
		if roundTrip(t, c, []byte("x")) >= 40*time.Millisecond {
			slow++
		} else {
			fast++
		}
		time.Sleep(7 * time.Millisecond)
	}
	if slow == 0 || fast == 0 {
		t.Errorf("%d slow and %d fast round trips with spike windows, want both", slow, fast)
	}
}

// LossStall holds a lost chunk and everything behind it: with every
// chunk lost a round trip takes two loss delays; with a third lost, a
// large transfer arrives intact and in order, later.
func TestLossStall(t *testing.T) {
	p := start(t, echo(t), faultproxy.Faults{LossProb: 1, LossDelay: 50 * time.Millisecond})
	c := dial(t, p)
	if d := roundTrip(t, c, []byte("lost")); d < 100*time.Millisecond {
		t.Errorf("round trip with every chunk lost took %v, want at least 2 x 50ms", d)
	}
	if err := p.SetFaults(faultproxy.Faults{LossProb: 0.3, LossDelay: 2 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 kB, about 220 chunks each way
	roundTrip(t, c, data)
	st := p.Stats()
	if st.Stalled < 50 || st.Resets != 0 {
		t.Errorf("stats %+v: want about 130 stalls, no resets", st)
	}
}

// LossReset resets the connection: the client sees it reset (or closed),
// the proxy goes on accepting.
func TestLossReset(t *testing.T) {
	p := start(t, echo(t), faultproxy.Faults{LossProb: 1, Loss: faultproxy.LossReset})
	c := dial(t, p)
	if _, err := c.Write([]byte("doomed")); err != nil {
		t.Fatal(err)
	}
	_, err := io.ReadAll(c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after a reset loss: %v, want ECONNRESET", err)
	}
	if st := p.Stats(); st.Resets != 1 {
		t.Errorf("stats %+v: want 1 reset", st)
	}
	if err := p.SetFaults(faultproxy.Faults{}); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, dial(t, p), []byte("alive"))
}

// A target that refuses: the accepted connection is reset, counted.
func TestDialFailure(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := l.Addr().String()
	l.Close()
	p := start(t, target, faultproxy.Faults{})
	// On loopback the reset can beat the end of connect.
	if c, err := net.DialTimeout("tcp", p.Addr().String(), 5*time.Second); err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		n, err := io.Copy(io.Discard, c)
		c.Close()
		if n != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read through a proxy whose target refuses: %d bytes, %v", n, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for st := p.Stats(); st.DialFailures != 1 || st.Open != 0; st = p.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: want 1 dial failure", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Close ends the open connections (the client's read fails or sees EOF)
// and every goroutine (goleak in TestMain), and refuses new ones; a
// second Close is fine.
func TestClose(t *testing.T) {
	p := start(t, echo(t), faultproxy.Faults{Latency: time.Hour})
	c := dial(t, p)
	if _, err := c.Write([]byte("held for an hour")); err != nil {
		t.Fatal(err)
	}
	// The proxy counts the connection once its accept ran, which a
	// loaded machine may put after a fixed 20 ms.
	for deadline := time.Now().Add(5 * time.Second); p.Stats().Open != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: want 1 open", p.Stats())
		}
	}
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5s with a chunk held for an hour")
	}
	n, _ := c.Read(make([]byte, 1))
	if n != 0 {
		t.Error("read data after Close")
	}
	if _, err := net.DialTimeout("tcp", p.Addr().String(), time.Second); err == nil {
		t.Error("dial after Close succeeded")
	}
	p.Close()
}

// The context given to Listen ending closes the proxy.
func TestContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	p, err := faultproxy.Listen(ctx, "127.0.0.1:0", faultproxy.Config{Target: echo(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	roundTrip(t, dial(t, p), []byte("before"))
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.Addr().String(), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the proxy still accepts 5s after its context ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Close()
}

// Bad configurations are refused, and bad faults by SetFaults (the old
// ones stay).
func TestValidate(t *testing.T) {
	target := echo(t)
	for _, cfg := range []faultproxy.Config{
		{},
		{Target: "nowhere"},
		{Target: target, ChunkSize: -1},
		{Target: target, DialTimeout: -time.Second},
		{Target: target, Faults: faultproxy.Faults{Latency: -1}},
		{Target: target, Faults: faultproxy.Faults{LossProb: 1.5}},
		{Target: target, Faults: faultproxy.Faults{SpikeProb: -0.1}},
		{Target: target, Faults: faultproxy.Faults{SpikeEvery: time.Second, SpikeFor: 2 * time.Second}},
		{Target: target, Faults: faultproxy.Faults{Loss: 7}},
	} {
		if p, err := faultproxy.Listen(t.Context(), "127.0.0.1:0", cfg); err == nil {
			p.Close()
			t.Errorf("config %+v accepted", cfg)
		}
	}
	p := start(t, target, faultproxy.Faults{Latency: time.Millisecond})
	if err := p.SetFaults(faultproxy.Faults{LossProb: 2}); err == nil {
		t.Error("SetFaults accepted loss probability 2")
	}
	if got := p.Faults(); got != (faultproxy.Faults{Latency: time.Millisecond}) {
		t.Errorf("faults after a refused SetFaults: %+v", got)
	}
	if p.Target() != target {
		t.Errorf("Target() = %q, want %q", p.Target(), target)
	}
}
