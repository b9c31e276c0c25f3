package cluster

import (
	"context"
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestListenGossip: a membership gossips on the sockets ListenGossip
// bound (two members join through them), an address in use fails
// naming the protocol and wrapping EADDRINUSE, and a listener closed
// unused ends its goroutines even with a stream and packets that
// arrived before any membership read them.
func TestListenGossip(t *testing.T) {
	l, err := ListenGossip("127.0.0.1", 0, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	port := l.Port()
	if _, err := ListenGossip("127.0.0.1", port, nil); !errors.Is(err, syscall.EADDRINUSE) || err.Error() != "tcp: address already in use" {
		t.Errorf("a second bind of port %d: %v", port, err)
	}
	cfg := fastConfig(t, "a")
	cfg.Listener = l
	a := start(t, cfg)
	if got := a.Addr().Port(); int(got) != port {
		t.Errorf("membership on port %d, the listener's is %d", got, port)
	}
	b := fastConfig(t, "b")
	b.Join = []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	start(t, b)
	waitFor(t, 5*time.Second, "a sees b", func() bool { return len(a.View().Up()) == 2 })

	// The UDP port taken, the TCP one free.
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := ListenGossip("127.0.0.1", u.LocalAddr().(*net.UDPAddr).Port, nil); !errors.Is(err, syscall.EADDRINUSE) || err.Error() != "udp: address already in use" {
		t.Errorf("a bind whose UDP port is taken: %v", err)
	}

	// Closed before any membership took it: what arrived is dropped.
	l2, err := ListenGossip("127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(l2.Port()))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Write([]byte("x"))
	p.Write([]byte("y"))
	time.Sleep(50 * time.Millisecond) // the accept and the packets in
	closed := make(chan struct{})
	go func() { l2.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close of an unused listener with a pending stream did not return")
	}
	l2.Close() // twice: nothing

	// A membership that fails to start closes the listener it took.
	l3, err := ListenGossip("127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := fastConfig(t, "")
	bad.Listener = l3
	if _, err := NewMembership(context.Background(), bad); err == nil {
		t.Fatal("a membership without a name started")
	}
	again, err := ListenGossip("127.0.0.1", l3.Port(), nil)
	if err != nil {
		t.Fatalf("the port of a failed membership's listener: %v", err)
	}
	again.Close()
}
