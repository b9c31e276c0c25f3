package cluster

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/memberlist"
)

// GossipListener is a node's gossip sockets, TCP and UDP on one port,
// bound before the membership starts ([ListenGossip]), so that a server
// can bind every address it needs before it starts anything and hand
// them on without binding again ([MemberConfig.Listener]).
type GossipListener struct {
	nt   *memberlist.NetTransport
	once sync.Once
}

// gossipBindRetries is how many times ListenGossip tries a free port
// (port 0) whose UDP side turned out taken, as memberlist does.
const gossipBindRetries = 10

// ListenGossip binds the gossip sockets of host:port (TCP and UDP; port
// 0 picks a port free on both). An address in use fails with an error
// that wraps syscall.EADDRINUSE (errors.Is), as do the other bind
// errors of the system that it recognizes (EADDRNOTAVAIL, EACCES), and
// names the protocol. Close it, or hand it to [NewMembership] in
// [MemberConfig.Listener], which takes it over. logger gets the
// transport's logs (nil: none).
func ListenGossip(host string, port int, logger *slog.Logger) (*GossipListener, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	if net.ParseIP(host) == nil {
		return nil, fmt.Errorf("cluster: gossip bind address %q: not an IP address", host)
	}
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port,
		Logger: log.New(&logBridge{log: logger.With("component", "memberlist")}, "", 0)}
	tries := 1
	if port == 0 {
		tries = gossipBindRetries
	}
	var err error
	for range tries {
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			return &GossipListener{nt: nt}, nil
		}
		if !strings.Contains(err.Error(), syscall.EADDRINUSE.Error()) {
			break
		}
	}
	return nil, bindError(err)
}

// bindError turns an error of memberlist.NewNetTransport (text only)
// into one that wraps the system error it names, with the protocol:
// "udp: address already in use".
func bindError(err error) error {
	msg := err.Error()
	proto := "tcp"
	if strings.Contains(msg, "UDP") {
		proto = "udp"
	}
	for _, e := range []syscall.Errno{syscall.EADDRINUSE, syscall.EADDRNOTAVAIL, syscall.EACCES} {
		if strings.HasSuffix(msg, e.Error()) {
			return fmt.Errorf("%s: %w", proto, e)
		}
	}
	return errors.New(msg)
}

// Port is the port the listener is bound to (the one picked for port 0).
func (l *GossipListener) Port() int { return l.nt.GetAutoBindPort() }

// Close closes the sockets and waits for their goroutines. A stream or
// packet that arrived before the membership started is dropped.
// Closing twice, or after the membership that took it over shut down,
// does nothing.
func (l *GossipListener) Close() error {
	l.once.Do(func() {
		// The transport's listeners hand what arrives to channels that
		// only a running memberlist reads: read them until its Shutdown
		// returns, so that a listener blocked on one ends.
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case c := <-l.nt.StreamCh():
					c.Close()
				case <-l.nt.PacketCh():
				case <-done:
					return
				}
			}
		})
		_ = l.nt.Shutdown()
		close(done)
		wg.Wait()
	})
	return nil
}

// taken marks l as owned by a memberlist (its Shutdown closes the
// transport): Close does nothing from then on.
func (l *GossipListener) taken() { l.once.Do(func() {}) }
