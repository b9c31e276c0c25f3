package node

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/questrt/questrt/collective/grpctransport"
)

// startLimited serves the health service on a loopback gRPC server
// under l (plaintext); the cleanup stops it.
func startLimited(t *testing.T, l connLimits) (string, *health.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(insecure.NewCredentials())}, l.serverOptions()...)...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(lis) })
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
	return lis.Addr().String(), hs
}

// TestConnLimitsClose: the node's gRPC server closes a connection that
// says nothing after Handshake, and one with no RPC in flight after
// MaxIdle (its client reconnects at the next call), but not one with a
// stream open however long it is quiet; MaxStreams RPCs in flight on one
// connection hold the next one back until one ends.
func TestConnLimitsClose(t *testing.T) {
	l := defaultConnLimits()
	l.Handshake, l.MaxIdle, l.MaxStreams = 300*time.Millisecond, 400*time.Millisecond, 3
	addr, hs := startLimited(t, l)

	t.Run("silent", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		c.SetReadDeadline(start.Add(5 * time.Second))
		_, err = io.Copy(io.Discard, c)
		if took := time.Since(start); err != nil || took < 200*time.Millisecond || took > 3*time.Second {
			t.Errorf("silent connection: closed after %v (%v), want about the handshake timeout %v", took, err, l.Handshake)
		}
	})

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	check := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}

	t.Run("idle", func(t *testing.T) {
		// On a loaded machine (CI under -race) the server may already
		// have closed the connection for idleness between the call's
		// end and GetState; try a few calls for one that leaves it READY.
		// The idle time is measured from before the call: the server's
		// MaxIdle starts after the call ended there, which is after this
		// start, so the close cannot come sooner than MaxIdle after it
		// however late the client sees the call's end (a start taken
		// after GetState, on a loaded machine, could be 100 ms or more
		// past the server's end and read a close at MaxIdle as early).
		ready := false
		var s connectivity.State
		var start time.Time
		for try := 0; try < 5 && !ready; try++ {
			start = time.Now()
			if err := check(5 * time.Second); err != nil {
				t.Fatal(err)
			}
			s = cc.GetState()
			ready = s == connectivity.Ready
		}
		if !ready {
			t.Fatalf("state %v after each of 5 calls, want READY", s)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if !cc.WaitForStateChange(ctx, connectivity.Ready) {
			t.Fatal("the idle connection was not closed within 5s")
		}
		if took := time.Since(start); took < 300*time.Millisecond {
			t.Errorf("idle connection closed %v after its last call began, before MaxIdle %v", took, l.MaxIdle)
		}
		if err := check(5 * time.Second); err != nil {
			t.Errorf("call after the idle close: %v", err)
		}
	})

	t.Run("stream open", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("watch: %v, %v", r, err)
		}
		time.Sleep(3 * l.MaxIdle)
		hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		defer hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("watch after %v quiet: %v, %v; want the update on the same stream", 3*l.MaxIdle, r, err)
		}
	})

	t.Run("max streams", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cancels := make([]context.CancelFunc, l.MaxStreams)
		for i := range cancels {
			sctx, scancel := context.WithCancel(ctx)
			cancels[i] = scancel
			w, err := hc.Watch(sctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				_, err = w.Recv()
			}
			if err != nil {
				t.Fatalf("watch %d: %v", i, err)
			}
		}
		if err := check(300 * time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("call with %d streams open: %v, want it held back (DeadlineExceeded)", l.MaxStreams, err)
		}
		cancels[0]()
		if err := check(5 * time.Second); err != nil {
			t.Errorf("call once a stream ended: %v", err)
		}
	})
}

// pingEvents are what a raw HTTP/2 client saw of the server's answers
// to its pings.
type pingEvents struct {
	acks   int
	goAway http2.ErrCode // 0 if none
	debug  string
}

// pingServer opens a raw HTTP/2 connection to the gRPC server at addr
// (no stream, no RPC) and sends n pings every interval, stopping at a
// GOAWAY.
func pingServer(t *testing.T, addr string, n int, interval time.Duration) pingEvents {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	var mu sync.Mutex // the framer's writes
	fr := http2.NewFramer(c, c)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var ev pingEvents
	var evMu sync.Mutex
	done := make(chan struct{})
	go func() { // ends when the connection closes
		defer close(done)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					mu.Lock()
					fr.WriteSettingsAck()
					mu.Unlock()
				}
			case *http2.PingFrame:
				if f.IsAck() {
					evMu.Lock()
					ev.acks++
					evMu.Unlock()
				}
			case *http2.GoAwayFrame:
				evMu.Lock()
				ev.goAway, ev.debug = f.ErrCode, string(f.DebugData())
				evMu.Unlock()
			}
		}
	}()
	for i := range n {
		evMu.Lock()
		gone := ev.goAway != 0
		evMu.Unlock()
		if gone {
			break
		}
		mu.Lock()
		err := fr.WritePing(false, [8]byte{byte(i)})
		mu.Unlock()
		if err != nil {
			break
		}
		time.Sleep(interval)
	}
	time.Sleep(100 * time.Millisecond) // the last answers
	c.Close()
	<-done
	evMu.Lock()
	defer evMu.Unlock()
	return ev
}

// TestConnLimitsPings: the server accepts a client's pings on a
// connection without RPCs (PermitWithoutStream) as long as they come at
// least MinPingInterval apart, and answers pings that come faster with
// GOAWAY "too_many_pings"; the default interval is within what every
// keepalive client of questrt may send: grpc-go's shortest client
// keepalive and the collective transport's (whose members ping their own
// listeners, not the node's).
func TestConnLimitsPings(t *testing.T) {
	d := defaultConnLimits()
	if d.MinPingInterval > grpctransport.MinKeepaliveTime || d.MinPingInterval > grpctransport.DefaultKeepaliveMinTime {
		t.Errorf("MinPingInterval %v: above grpc-go's shortest client keepalive %v or the collective transport's enforcement %v",
			d.MinPingInterval, grpctransport.MinKeepaliveTime, grpctransport.DefaultKeepaliveMinTime)
	}
	l := d
	l.MinPingInterval = 200 * time.Millisecond
	addr, _ := startLimited(t, l)
	if ev := pingServer(t, addr, 6, 300*time.Millisecond); ev.goAway != 0 || ev.acks != 6 {
		t.Errorf("6 pings 300ms apart without a stream: %d acks, GOAWAY %v %q; want 6 acks and no GOAWAY", ev.acks, ev.goAway, ev.debug)
	}
	if ev := pingServer(t, addr, 20, 10*time.Millisecond); ev.goAway != http2.ErrCodeEnhanceYourCalm || ev.debug != "too_many_pings" {
		t.Errorf("pings 10ms apart: GOAWAY %v %q after %d acks, want ENHANCE_YOUR_CALM too_many_pings", ev.goAway, ev.debug, ev.acks)
	}
}
