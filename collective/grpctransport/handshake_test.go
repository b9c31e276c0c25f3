package grpctransport

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/questrt/questrt/collective"
)

// Members that disagree on the group id or size refuse each other: the
// dialer's New fails with ErrHandshake, the listener's at its deadline.
func TestHandshakeRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tweak func(c *Config)
	}{
		{"group", func(c *Config) { c.Group = "other" }},
		{"size", func(c *Config) { c.Peers = append(c.Peers, "127.0.0.1:1") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The listener's New ends at its deadline; the dialer's must
			// end sooner, refused. A loaded machine (-race, 2 busy cores)
			// can take the whole deadline to connect at all: a dialer
			// that failed with DeadlineExceeded tries again with twice
			// the deadline, up to 4.8 s. One that was never refused still
			// fails at each.
			var errs [2]error
			for deadline := 300 * time.Millisecond; ; deadline *= 2 {
				errs = handshake(t, tc.tweak, deadline)
				if errors.Is(errs[1], ErrHandshake) || !errors.Is(errs[1], context.DeadlineExceeded) || deadline >= 4800*time.Millisecond {
					break
				}
				t.Logf("dialer: %v within %v: trying again", errs[1], deadline)
			}
			if !errors.Is(errs[1], ErrHandshake) {
				t.Errorf("dialer: %v, want ErrHandshake", errs[1])
			}
			if !errors.Is(errs[0], context.DeadlineExceeded) {
				t.Errorf("listener: %v, want DeadlineExceeded", errs[0])
			}
		})
	}
}

// handshake starts a group of two whose rank 1 tweak changes, with a
// deadline d for both News, and returns their errors.
func handshake(t *testing.T, tweak func(c *Config), d time.Duration) [2]error {
	var cfgs [2]Config
	for r := range cfgs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfgs[r] = plaintext()
		cfgs[r].Group, cfgs[r].Rank, cfgs[r].Listener = "g", r, ln
	}
	peers := []string{cfgs[0].Listener.Addr().String(), cfgs[1].Listener.Addr().String()}
	cfgs[0].Peers, cfgs[1].Peers = peers, append([]string(nil), peers...)
	tweak(&cfgs[1])
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var errs [2]error
	var wg sync.WaitGroup
	for r := range cfgs {
		wg.Go(func() {
			tr, err := New(ctx, cfgs[r])
			if err == nil {
				tr.Close()
			}
			errs[r] = err
		})
	}
	wg.Wait()
	return errs
}

// Each pair of members shares exactly one connection and one stream, used
// for all of their traffic: nothing is dialed per message.
func TestOneStreamPerPair(t *testing.T) {
	const n, rounds = 4, 50
	var dials, streams atomic.Int64
	trs := newGroup(t, n, func(_ int, c *Config) {
		c.DialOptions = append(c.DialOptions, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}))
		c.ServerOptions = append(c.ServerOptions, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			streams.Add(1)
			return h(srv, ss)
		}))
	})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			for round := range uint64(rounds) {
				for p := range n {
					if err := trs[r].Send(ctx, p, round, []byte{byte(r)}); err != nil {
						t.Error(err)
						return
					}
				}
				for p := range n {
					if got, err := trs[r].Recv(ctx, p, round); err != nil || got[0] != byte(p) {
						t.Errorf("rank %d round %d from %d: %v %v", r, round, p, got, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if d, s := dials.Load(), streams.Load(); d != n*(n-1)/2 || s != n*(n-1)/2 {
		t.Errorf("%d dials and %d streams after %d rounds, want %d each", d, s, rounds, n*(n-1)/2)
	}
}

// A single member needs no network at all.
func TestSingleMember(t *testing.T) {
	trs := newGroup(t, 1, nil)
	ctx := ctxT(t)
	if err := trs[0].Send(ctx, 0, 1, []byte("me")); err != nil {
		t.Fatal(err)
	}
	if got, err := trs[0].Recv(ctx, 0, 1); err != nil || string(got) != "me" {
		t.Fatalf("%q, %v", got, err)
	}
	trs[0].Close()
	if _, err := trs[0].Recv(ctx, 0, 1); !errors.Is(err, collective.ErrClosed) {
		t.Fatalf("recv after close: %v", err)
	}
}
