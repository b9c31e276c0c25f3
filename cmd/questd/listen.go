package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/worker/remote"
)

// listeners are the sockets questd serves on (and its data directory's
// lock), bound by bindListeners before anything starts (no node, data directory, model or goroutine
// of its own), so that an address in use, or one the host does not
// have, stops questd at once with one line naming the flag, exit 2; the
// servers then take them over (no second bind, no race with another
// process between a check and the bind).
type listeners struct {
	grpc    net.Listener            // --grpc-addr
	gossip  *cluster.GossipListener // --gossip-addr, TCP and UDP
	metrics net.Listener            // --metrics-addr; nil when ""
	http    net.Listener            // --http-addr; nil without --model
	// dataLock is --data-dir's lock (nil without one), taken once every
	// address is bound: a directory another questd holds stops questd
	// as an address in use does.
	dataLock *remote.DataDirLock
}

// bindListeners binds every address of cfg that questd listens on: the
// gRPC API, gossip (TCP and UDP), the metrics server (unless off) and
// the completions API (with --model). On failure it closes those it
// bound and names every one that failed, in one line:
// "--http-addr 127.0.0.1:8000: address already in use", with a hint
// when an address is in use. log gets the gossip transport's logs.
func bindListeners(cfg Config, log *slog.Logger) (_ *listeners, err error) {
	ls := &listeners{}
	defer func() {
		if err != nil {
			ls.close()
		}
	}()
	var errs []error
	tcp := func(l *net.Listener, flag, addr string) {
		var e error
		if *l, e = listenTCP(flag, addr); e != nil {
			errs = append(errs, e)
		}
	}
	tcp(&ls.grpc, "grpc-addr", cfg.Node.GRPCAddr)
	mc := cfg.memberConfig()
	var e error
	if ls.gossip, e = cluster.ListenGossip(mc.BindAddr, mc.BindPort, log.With("node", cfg.Node.Name)); e != nil {
		errs = append(errs, addrError("gossip-addr", cfg.Membership.GossipAddr, e))
	}
	if cfg.Node.MetricsAddr != "" {
		tcp(&ls.metrics, "metrics-addr", cfg.Node.MetricsAddr)
	}
	if cfg.Serve.Model != "" && cfg.Serve.Addr != "" {
		tcp(&ls.http, "http-addr", cfg.Serve.Addr)
	}
	if len(errs) == 0 && cfg.Storage.DataDir != "" {
		// After the addresses: a questd that cannot listen creates no
		// directory.
		if ls.dataLock, e = remote.LockDataDir(cfg.Storage.DataDir); e != nil {
			return nil, fmt.Errorf("--data-dir %s: %w", cfg.Storage.DataDir, e)
		}
	}
	if len(errs) == 0 {
		return ls, nil
	}
	err = bindErrors(errs)
	if len(errs) == 1 {
		err = errs[0]
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		err = fmt.Errorf("%w (another questd on this host? give each node its own ports, or port 0)", err)
	}
	return nil, err
}

// bindErrors is the failed binds, on one line ("; " between them);
// errors.Is sees each.
type bindErrors []error

func (e bindErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e bindErrors) Unwrap() []error { return e }

// listenTCP listens on addr, the value of --flag.
func listenTCP(flag, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, addrError(flag, addr, err)
	}
	return l, nil
}

// addrError is a failed bind of addr, the value of --flag, in one line:
// "--flag ADDR: address already in use" (the system's reason, without
// net's "listen tcp ADDR: bind:" before it).
func addrError(flag, addr string, err error) error {
	var se *os.SyscallError
	if errors.As(err, &se) {
		err = se.Err
	}
	return fmt.Errorf("--%s %s: %w", flag, addr, err)
}

// take hands l over: it returns l and forgets it, so that close leaves
// it to its new owner.
func take[L any](l *L) L {
	v := *l
	var zero L
	*l = zero
	return v
}

// close closes the listeners not handed over.
func (ls *listeners) close() {
	if ls == nil {
		return
	}
	for _, l := range []net.Listener{ls.grpc, ls.metrics, ls.http} {
		if l != nil {
			l.Close()
		}
	}
	if ls.gossip != nil {
		ls.gossip.Close()
	}
	if ls.dataLock != nil {
		ls.dataLock.Close()
	}
	*ls = listeners{}
}
