package grpctransport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
)

// A member whose process dies (connections reset, listener gone, no Close)
// fails its peers' pending Recvs at once with ErrPeerClosed, after what it
// had already sent was delivered; later calls to it fail the same way, and
// the other members are unaffected.
func TestPeerKilled(t *testing.T) {
	const n, victim = 3, 1
	var nw network
	trs := newGroup(t, n, func(r int, c *Config) {
		if r == victim {
			nw.attach(c)
		}
	})
	ctx := ctxT(t)
	if err := trs[victim].Send(ctx, 0, 7, []byte("last words")); err != nil {
		t.Fatal(err)
	}
	for trs[0].Pending() == 0 { // the reader has filed it
		time.Sleep(time.Millisecond)
	}

	errc := make(chan error, 2)
	for _, r := range []int{0, 2} {
		go func() {
			_, err := trs[r].Recv(ctx, victim, 5)
			errc <- fmt.Errorf("rank %d: %w", r, err)
		}()
	}
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	nw.kill()
	for range 2 {
		if err := <-errc; !errors.Is(err, collective.ErrPeerClosed) {
			t.Errorf("pending recv from the killed rank: %v, want ErrPeerClosed", err)
		}
	}
	if el := time.Since(start); el > promptBound {
		t.Errorf("pending recvs failed after %v, want < %v", el, promptBound)
	}
	t.Logf("pending recvs failed %v after the kill", time.Since(start))

	got, err := trs[0].Recv(ctx, victim, 7)
	if err != nil || string(got) != "last words" {
		t.Errorf("recv of a message received before the kill: %q, %v", got, err)
	}
	if _, err := trs[0].Recv(ctx, victim, 7); !errors.Is(err, collective.ErrPeerClosed) {
		t.Errorf("later recv from the killed rank: %v, want ErrPeerClosed", err)
	}
	for _, r := range []int{0, 2} {
		if err := trs[r].Send(ctx, victim, 5, []byte("x")); !errors.Is(err, collective.ErrPeerClosed) {
			t.Errorf("rank %d send to the killed rank: %v, want ErrPeerClosed", r, err)
		}
	}
	// The killed member lost its peers too.
	if _, err := trs[victim].Recv(ctx, 0, 5); !errors.Is(err, collective.ErrPeerClosed) {
		t.Errorf("killed rank's recv: %v, want ErrPeerClosed", err)
	}
	// The survivors still talk.
	if err := trs[2].Send(ctx, 0, 9, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	if got, err := trs[0].Recv(ctx, 2, 9); err != nil || string(got) != "still here" {
		t.Errorf("survivors: %q, %v", got, err)
	}
}

// Close delivers everything sent before it, in order, then the peers see
// ErrPeerClosed.
func TestCloseFlushes(t *testing.T) {
	const msgs = 2000
	trs := newGroup(t, 2, func(_ int, c *Config) { c.SendQueue = 16 })
	ctx := ctxT(t)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range msgs {
			if err := trs[1].Send(ctx, 0, 3, fmt.Appendf(nil, "%d", i)); err != nil {
				t.Errorf("send %d: %v", i, err)
				return
			}
		}
		trs[1].Close()
	})
	for i := range msgs {
		got, err := trs[0].Recv(ctx, 1, 3)
		if err != nil || string(got) != fmt.Sprint(i) {
			t.Fatalf("recv %d: %q, %v", i, got, err)
		}
	}
	wg.Wait()
	if _, err := trs[0].Recv(ctx, 1, 3); !errors.Is(err, collective.ErrPeerClosed) {
		t.Errorf("recv after the drained messages: %v, want ErrPeerClosed", err)
	}
}

// New with a peer that accepts connections and never answers fails at its
// ctx's deadline.
func TestNewSilentPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A raw TCP server that accepts and never speaks HTTP/2.
	var conns []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	defer func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	c := plaintext()
	c.Group, c.Rank, c.Peers, c.ListenAddr = "hung", 1, []string{ln.Addr().String(), ""}, "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := New(ctx, c); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("New with a peer that never answers: %v, want DeadlineExceeded", err)
	}
	if el := time.Since(start); el > promptBound {
		t.Errorf("New took %v past a 200ms deadline", el)
	}
}

// A member whose peer hangs (connections open, nothing moves) still closes
// within about CloseTimeout, and its pending calls fail at once.
func TestCloseFrozenPeer(t *testing.T) {
	const closeTimeout = 200 * time.Millisecond
	var nw network
	trs := newGroup(t, 2, func(r int, c *Config) {
		c.CloseTimeout = closeTimeout
		if r == 1 {
			nw.attach(c)
		}
	})
	defer nw.kill()
	ctx := ctxT(t)
	nw.freeze()
	errc := make(chan error, 1)
	go func() {
		_, err := trs[0].Recv(ctx, 1, 1)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	trs[0].Close()
	if el := time.Since(start); el < closeTimeout || el > closeTimeout+promptBound {
		t.Errorf("close with a frozen peer took %v, want about %v", el, closeTimeout)
	}
	if err := <-errc; !errors.Is(err, collective.ErrClosed) {
		t.Errorf("pending recv: %v, want ErrClosed", err)
	}
}
