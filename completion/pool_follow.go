package completion

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// capacity is the pool per shard now (Config.CapacityPages once
// resolved; a pool that follows the cluster's nodes changes with them:
// Config.ClusterResize). Any goroutine may read it; the scheduler
// changes it, under s.mu.
func (s *Server) capacity() int { return int(s.capPages.Load()) }

// followLookTimeout bounds one look at the cluster's nodes.
const followLookTimeout = 5 * time.Second

// followSettle is how long the looks at the nodes must agree on a new
// pool size before the pool takes it: longer than a node takes to
// gossip its free pages after a grid opened or closed on it (its
// metadata interval, 1s by default, and a gossip round), during which
// a look counts the grid's pools twice or not at all.
const followSettle = 2 * time.Second

// follow looks at the cluster's nodes every Config.ClusterResize until
// the server closes, and hands the scheduler a new pool size once the
// looks agreed on it for followSettle and two looks at least
// (followSize); need is the pages of one request of the longest context
// (0: no bound). It runs on a goroutine of its own, owned by s.follows.
func (s *Server) follow(cc ClusterCapacity, need int) {
	defer s.follows.Done()
	t := time.NewTicker(s.cfg.ClusterResize)
	defer t.Stop()
	last := -1 // the size the looks since first want (-1: none)
	var first time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, followLookTimeout)
		nc, err := cc.RankPages(ctx, s.pool.Ranks)
		cancel()
		if err != nil {
			s.log.Debug("serving pool: looking at the cluster's nodes", "err", err)
			last = -1
			continue
		}
		ps, ok := s.followSize(nc, need)
		switch {
		case !ok:
			last = -1
		case ps.Pages != last:
			last, first = ps.Pages, time.Now()
		case time.Since(first) >= followSettle:
			last = -1
			s.mu.Lock()
			s.resize = &ps
			s.mu.Unlock()
			s.poke()
		}
	}
}

// followSize is the pool that a look at the nodes, nc, asks for, and
// whether it differs from the pool now: the pool New would size from
// nc when smaller (it shrinks), unless a grid of the server's of the
// pool now is still open (nc.Held: its pages are the server's, whoever
// took the rest); when larger, as large as ranks of the server's grids
// can reserve beside those open now (nc.Open) allows, so that the grid
// of the new size can be placed.
func (s *Server) followSize(nc NodeCapacity, need int) (PoolSize, bool) {
	cur := s.capacity()
	ps := PoolSize{Cluster: true, Nodes: nc.Nodes, NodePages: nc.FreePages, Ranks: s.pool.Ranks}
	ps.Pages, ps.Bound = s.clusterPages(nc.PerRank, need, s.cfg.MaxRunning)
	if ps.Pages < cur && nc.Held >= uint64(cur+s.monitorSlack()) {
		return ps, false
	}
	if ps.Pages > cur {
		open, bound := s.clusterPages(min(nc.Open, nc.PerRank), need, s.cfg.MaxRunning)
		if open < ps.Pages {
			ps.Pages, ps.Bound = open, bound+" (beside the grids open now)"
		}
	}
	return ps, ps.Pages != cur
}

// resizePool applies the size the follower asked for (s.resize), on
// the scheduler goroutine at an iteration boundary: new requests and
// new sequences get the new pool. When it shrank below the pages the
// started requests reserve, the newest give theirs back until the rest
// fit: one that can run again from its prompt (a single choice, with
// Config.GridRetries, no Create in flight) goes back to the front of
// the queue, as a preempted request does; any other fails with 503
// (errShrunk). Queued requests that will never fit fail alike. The
// prefix cache's entries, on grids of the old size, are dropped. It
// reports whether it resized.
func (s *Server) resizePool() bool {
	s.mu.Lock()
	ps := s.resize
	s.resize = nil
	if ps == nil {
		s.mu.Unlock()
		return false
	}
	old := s.capacity()
	if ps.Pages == old {
		// Asked again before the scheduler took the first ask.
		s.mu.Unlock()
		return false
	}
	s.capPages.Store(int64(ps.Pages))
	s.mostPages = max(s.mostPages, ps.Pages)
	s.pool.Pages, s.pool.Bound, s.pool.Nodes, s.pool.NodePages = ps.Pages, ps.Bound, ps.Nodes, ps.NodePages
	s.stats.CapacityPages = ps.Pages
	s.stats.PoolResizes++
	var fail, back []*job
	failGroup := func(g *group) {
		for _, x := range g.jobs {
			if !x.ended && !slices.Contains(fail, x) {
				fail = append(fail, x)
			}
		}
	}
	for _, j := range s.queue {
		if j.g.pages > ps.Pages {
			failGroup(j.g)
		}
	}
	for i := len(s.running) - 1; i >= 0 && s.reserved > ps.Pages; i-- {
		j := s.running[i]
		g := j.g
		if !g.reserved {
			continue
		}
		s.reserved -= g.pages
		g.reserved = false
		if len(g.jobs) == 1 && s.retries() && !j.creating && g.pages <= ps.Pages {
			back = append(back, j)
			s.stats.Preemptions++
			continue
		}
		failGroup(g)
	}
	s.running = slices.DeleteFunc(s.running, func(x *job) bool { return slices.Contains(back, x) })
	slices.Reverse(back) // the oldest first, at the front of the queue
	s.queue = append(back, s.queue...)
	s.mu.Unlock()
	s.log.Info("serving pool resized with the cluster's nodes", "pages_per_rank", ps.Pages, "was", old, "bound", ps.Bound,
		"nodes", ps.Nodes, "free_pages", ps.NodePages, "ranks", ps.Ranks, "requeued", len(back), "failed", len(fail))
	for _, j := range back {
		j.requeued = true
		if j.cseq != nil {
			s.releaseSeq(j, j.cseq)
			j.cseq = nil
		}
		s.preempt(j)
	}
	for _, j := range fail {
		s.end(j, nil, s.errShrunk(j, ps), "")
	}
	if s.pc != nil {
		// The entries live on grids of the old size: a fork of one
		// would put a request's pages on a pool sized for another.
		drop, evicted := s.pc.evict(0)
		s.dropPrefixes(drop, evicted)
	}
	return true
}

// errShrunk is the 503 of a request that the cluster's pool, shrunk to
// ps, no longer holds.
func (s *Server) errShrunk(j *job, ps *PoolSize) *apiError {
	return s.shrunkError(j.g.pages, ps.Pages, ps.Nodes, ps.NodePages)
}

// shrunkError is the 503 of a request of need pages per shard that a
// pool of pages, followed from nodes nodes of free pages, does not hold
// beside the running requests'.
func (s *Server) shrunkError(need, pages, nodes int, free uint64) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "pool_shrunk", retry: s.cfg.RetryAfter,
		message: fmt.Sprintf("The serving pool follows the cluster's nodes and now holds %d pages per shard (%d node(s) with %d pages free to this server: "+
			"nodes left, or another coordinator's grids, such as a second questd serving on these nodes, took their pages); "+
			"the request needs %d and does not fit beside the running requests now; retry later.", pages, nodes, free, need)}
}

// shrunk, for a request of need pages per shard that the pool does not
// hold now, is its 503 when the pool follows the cluster and held it
// before (the request fits the server's context bound), else nil: it
// never fits (400).
func (s *Server) shrunk(need int) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.pool.Cluster || need > s.mostPages {
		return nil
	}
	return s.shrunkError(need, s.pool.Pages, s.pool.Nodes, s.pool.NodePages)
}
