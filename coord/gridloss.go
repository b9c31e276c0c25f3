package coord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
)

// The loss and closing of grids: noticing a grid's node gone, marking
// the grid lost, dropping it, and closing it on its nodes while later
// grids wait for the directories it holds.

// aliveLocked returns the grid's loss, noticing one the membership view
// shows: a node of the grid dead, departed, or restarted.
func (c *Coordinator) aliveLocked(g *grid) error {
	if g.lost != nil {
		return g.lost
	}
	v := c.cfg.View()
	for n, inst := range g.members {
		m, ok := v.Member(n)
		if !ok || !m.State.Up() || m.Instance != inst {
			c.loseLocked(g, fmt.Errorf("%w: %w", ErrGridLost, nodeGoneError{n}))
			return g.lost
		}
	}
	return nil
}

// check marks g lost when err says that a node of it is unreachable, no
// longer holds the grid (it swept or restarted it), or holds a step this
// coordinator ended (an EndStep that never arrived): the grid cannot
// serve another step. It returns the error to answer: err itself, or,
// when g is lost, an error naming the loss ([ErrGridLost], UNAVAILABLE
// to a client unless err carries a more specific code, see [Status])
// with err inside. A node's "unknown grid" or "a step is
// open" is about the grid, not the caller's sequence or request: the
// client learns that the grid is gone (its sequence with it), not
// NOT_FOUND or FAILED_PRECONDITION.
func (c *Coordinator) check(g *grid, err error) error {
	if err == nil {
		return nil
	}
	loses := errors.Is(err, remote.ErrUnavailable) || errors.Is(err, remote.ErrUnknownGrid) || errors.Is(err, worker.ErrStepOpen)
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.lost == nil && loses {
		c.loseLocked(g, fmt.Errorf("%w: %w", ErrGridLost, err))
		return g.lost
	}
	if g.lost != nil && !errors.Is(err, ErrGridLost) {
		return fmt.Errorf("%w (%w)", g.lost, err)
	}
	return err
}

// loseLocked records g's loss and closes it on the nodes still reachable;
// its sequences stay known (answering ErrGridLost) until released.
func (c *Coordinator) loseLocked(g *grid, why error) {
	g.lost = why
	g.cancel(why)
	c.log.Warn("grid lost", "grid", g.ref.Grid, "nodes", g.nodes, "err", why)
	c.closeGrid(g)
}

// CheckGrids marks lost every grid with a node the membership view no
// longer shows up (dead, departed or restarted), failing the steps in
// flight on it at once. A node calls it at every change of its view.
func (c *Coordinator) CheckGrids() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	seen := map[*grid]bool{}
	for _, g := range c.grids {
		seen[g] = true
		_ = c.aliveLocked(g)
	}
	for _, s := range c.seqs {
		if !seen[s.g] {
			seen[s.g] = true
			_ = c.aliveLocked(s.g)
		}
	}
}

// dropLocked forgets g (no sequences left) and closes it.
func (c *Coordinator) dropLocked(g *grid) {
	if c.grids[g.key] == g {
		delete(c.grids, g.key)
	}
	if g.lost == nil {
		c.closeGrid(g)
	}
}

// closeGrid closes, in the background (owned by c.wg), g's engine and the
// grid on its nodes (c.mu held; a second call does nothing). A grid in
// use closes its engine first (after the step in flight, which g.cancel
// ends), then on the nodes. A lost grid closes on its nodes at once,
// beside its engine: the engine's close waits for a step its client
// keeps open (up to the step deadline), and its nodes must let go of the
// grid's data directories before the grid that replaces it opens there
// (gridFor waits for g.closed).
func (c *Coordinator) closeGrid(g *grid) {
	if g.cancel != nil {
		g.cancel(ErrClosed)
	}
	if g.closed != nil {
		return
	}
	g.closed = make(chan struct{})
	c.closing[g] = struct{}{}
	eng, clients, lost := g.eng, g.clients, g.lost != nil
	closeEngine := func() {
		if eng != nil {
			eng.Close()
		}
	}
	closeNodes := func() {
		defer func() {
			c.mu.Lock()
			delete(c.closing, g)
			c.mu.Unlock()
			close(g.closed)
		}()
		if len(clients) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = remote.CloseGrid(ctx, clients...) // best effort: a lost node closed its own
	}
	if lost {
		c.wg.Go(closeEngine)
		c.wg.Go(closeNodes)
		return
	}
	c.wg.Go(func() {
		closeEngine()
		closeNodes()
	})
}

// dropParkingLocked closes the grids other than key's that share a node
// with nodes, hold no sequence, are not handed to a Create, and left
// recovered sequences parked (placed on other nodes: opened on a view
// that lacked a node, say), and returns how many (c.mu held). Their
// nodes hold those sequences in the grids' data directories; the grid
// about to open on nodes would find fresh directories past them on the
// shared nodes, recover nothing there, and free the sequences that its
// placement is to adopt. Closed, their directories are free again
// (closingOnLocked waits for that) and the new grid recovers them.
func (c *Coordinator) dropParkingLocked(key string, nodes []string) int {
	n := 0
	for k, g := range c.grids {
		if k == key || g.lost != nil || len(g.parked) == 0 || g.seqs > 0 || g.pending > 0 {
			continue
		}
		if !slices.ContainsFunc(g.nodes, func(n string) bool { return slices.Contains(nodes, n) }) {
			continue
		}
		c.log.Info("closing a grid that holds recovered sequences of another placement", "grid", g.ref.Grid, "nodes", g.nodes, "parked", len(g.parked), "for", nodes)
		if g.idle != nil {
			g.idle.Stop()
		}
		c.dropLocked(g)
		n++
	}
	return n
}

// closingOnLocked marks lost the grids with a node the view no longer
// shows up (as CheckGrids does) and returns the closed channels of the
// grids still closing that share a node with nodes (c.mu held).
func (c *Coordinator) closingOnLocked(nodes []string) []chan struct{} {
	for _, g := range c.grids {
		_ = c.aliveLocked(g)
	}
	var out []chan struct{}
	for g := range c.closing {
		if slices.ContainsFunc(g.nodes, func(n string) bool { return slices.Contains(nodes, n) }) {
			out = append(out, g.closed)
		}
	}
	return out
}
