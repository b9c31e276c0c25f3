package grpctransport

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// Calls that must fail promptly run under promptDeadline and must return
// within promptBound, as in collective's tests: one that waited for its
// deadline cannot pass, a prompt one on a loaded machine cannot miss.
const (
	promptDeadline = 10 * time.Second
	promptBound    = promptDeadline / 2
)

// plaintext is DefaultConfig over plaintext, the tests' base.
func plaintext() Config {
	c := DefaultConfig()
	c.Plaintext = true
	return c
}

// newGroup builds a local group of n members (configure may adjust each
// member's Config) and closes it at cleanup.
func newGroup(t testing.TB, n int, configure func(rank int, c *Config)) []*Transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), promptDeadline)
	defer cancel()
	trs, err := newLocalGroup(ctx, n, plaintext(), configure)
	if err != nil {
		t.Fatalf("local group of %d: %v", n, err)
	}
	t.Cleanup(func() {
		for _, tr := range trs {
			tr.Close()
		}
	})
	return trs
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), promptDeadline)
	t.Cleanup(cancel)
	return ctx
}

// network tracks every TCP connection one member accepts or dials, so a
// test can cut them all at once as the death of the member's process would
// (connections reset, listener gone), without the member's Close.
type network struct {
	mu     sync.Mutex
	lis    net.Listener
	conns  []net.Conn
	killed bool
	frozen chan struct{} // non-nil while frozen; closed to thaw
}

// attach makes c's member listen and dial through nw.
func (nw *network) attach(c *Config) {
	nw.lis = c.Listener
	c.Listener = trackedListener{c.Listener, nw}
	c.DialOptions = append(c.DialOptions, grpc.WithContextDialer(nw.dial))
}

func (nw *network) track(c net.Conn) net.Conn {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.killed {
		reset(c)
	}
	nw.conns = append(nw.conns, c)
	return &trackedConn{c, nw}
}

func (nw *network) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return nw.track(c), nil
}

// freeze makes every read and write of the member block (a hung process:
// connections open, nothing moves) until thaw or kill.
func (nw *network) freeze() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.frozen == nil {
		nw.frozen = make(chan struct{})
	}
}

func (nw *network) thaw() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.frozen != nil {
		close(nw.frozen)
		nw.frozen = nil
	}
}

// gate blocks while the network is frozen.
func (nw *network) gate() {
	nw.mu.Lock()
	ch := nw.frozen
	nw.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

type trackedConn struct {
	net.Conn
	nw *network
}

func (c *trackedConn) Read(b []byte) (int, error) {
	c.nw.gate()
	return c.Conn.Read(b)
}

func (c *trackedConn) Write(b []byte) (int, error) {
	c.nw.gate()
	return c.Conn.Write(b)
}

// kill closes the listener and resets every connection.
func (nw *network) kill() {
	nw.thaw()
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.killed = true
	nw.lis.Close()
	for _, c := range nw.conns {
		reset(c)
	}
}

// reset closes c with an RST rather than a FIN, like a killed process's
// socket with unread data.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

type trackedListener struct {
	net.Listener
	nw *network
}

func (l trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.nw.track(c), nil
}
