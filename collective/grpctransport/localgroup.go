package grpctransport

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
)

// NewLocalGroup builds all n members of a group in this process, over real
// gRPC streams on 127.0.0.1: it first listens on an ephemeral port per
// member, then hands every member all the addresses and runs the n New
// calls concurrently (each waits for the others), bounded by ctx. base
// gives the settings (set Plaintext or TLS); its Rank, Peers, ListenAddr
// and Listener are replaced, and an empty Group gets a random id. Member i
// has rank i; the caller closes them. For tests and benchmarks.
func NewLocalGroup(ctx context.Context, n int, base Config) ([]*Transport, error) {
	return newLocalGroup(ctx, n, base, nil)
}

// newLocalGroup is NewLocalGroup with a hook that adjusts each member's
// Config (a wrapped Listener, another limit) before New.
func newLocalGroup(ctx context.Context, n int, base Config, configure func(rank int, cfg *Config)) ([]*Transport, error) {
	if n < 1 {
		return nil, fmt.Errorf("grpctransport: local group of %d members", n)
	}
	if base.Group == "" {
		base.Group = "local-" + rand.Text()
	}
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	closeAll := func() {
		for _, ln := range lns {
			if ln != nil {
				ln.Close()
			}
		}
	}
	for r := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("grpctransport: local group: %w", err)
		}
		lns[r], addrs[r] = ln, ln.Addr().String()
	}
	cfgs := make([]Config, n)
	for r := range n {
		c := base
		c.Rank, c.Peers, c.ListenAddr, c.Listener = r, slices.Clone(addrs), "", lns[r]
		if configure != nil {
			configure(r, &c)
		}
		if err := c.Validate(); err != nil {
			closeAll()
			return nil, fmt.Errorf("grpctransport: local group rank %d: %w", r, err)
		}
		cfgs[r] = c
	}
	out := make([]*Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { out[r], errs[r] = New(ctx, cfgs[r]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, t := range out {
			if t != nil {
				t.Close()
			}
		}
		return nil, err
	}
	return out, nil
}
