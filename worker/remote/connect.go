package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/questrt/questrt/api/wire"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/collective/grpctransport"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/worker"
)

// ConnectGrid implements workerv1.WorkerServer: it connects every hosted
// rank's transport to the ranks of its TP group (all at once: each waits
// for its peers, bounded by ConnectTimeout), then builds the grid's
// worker. On failure the grid is freed.
func (s *Server) ConnectGrid(ctx context.Context, r *workerv1.ConnectGridRequest) (*workerv1.ConnectGridReply, error) {
	if err := authorize(ctx, r.GetRef().GetGrid()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	g, err := s.lookup(r.GetRef())
	if err == nil && g.state != opened {
		err = fmt.Errorf("%w: grid %s is already connecting or connected", ErrGridState, g.id)
	}
	if err != nil {
		s.mu.Unlock()
		return nil, statusErr(fmt.Errorf("connect grid: %w", err))
	}
	g.state = connecting
	lis := g.lis
	g.lis = nil
	if s.cfg.DataDir != "" && g.cfg.Mode == worker.Replicated {
		s.log.Warn("worker server: grid not persisted: replicated selection's summary mirrors are not persisted", "grid", g.id)
	}
	// The grid's data directory is this call's until the grid is
	// connected, then the grid's (shut gives it back).
	s.connects.Add(1)
	defer s.connects.Done()
	var dir string
	release := func() {}
	if s.cfg.DataDir != "" && g.cfg.Mode != worker.Replicated {
		var h *dirHold
		var err error
		dir, h, err = s.claimDir(ctx, g, gridDirBase(s.cfg.DataDir, g.id, g.cfg, g.ranks))
		if err != nil {
			s.forget(g)
			s.mu.Unlock()
			for _, l := range lis {
				l.Close()
			}
			return nil, statusErr(fmt.Errorf("connect grid %s: %w", g.id, err))
		}
		release = sync.OnceFunc(func() {
			if s.testHookRelease != nil {
				s.testHookRelease(dir)
			}
			s.mu.Lock()
			if s.dirs[dir] == h {
				delete(s.dirs, dir)
			}
			s.mu.Unlock()
			close(h.released)
		})
	}
	s.mu.Unlock()

	local, trs, err := s.connect(ctx, g, dir, lis, r.GetPeers(), r.GetPlacement())
	s.mu.Lock()
	if err == nil && s.grids[g.id] != g {
		err = fmt.Errorf("%w: grid %s closed while connecting", ErrGridState, g.id)
	}
	if err != nil {
		s.forget(g)
		s.mu.Unlock()
		if local != nil {
			local.Close()
		}
		closeTransports(trs)
		release() // no worker holds the directory now
		return nil, statusErr(s.redactPeers("connect grid "+g.id, fmt.Errorf("connect grid %s: %w", g.id, err)))
	}
	g.state, g.local, g.trs, g.dir, g.release = connected, local, trs, dir, release
	rep := &workerv1.ConnectGridReply{}
	if g.dir != "" {
		rec := local.Recovery()
		s.noteRecovery(g, rec)
		e := &enc{what: "connect grid reply"}
		for _, r := range rec.Sequences {
			rep.Recovered = append(rep.Recovered, encodeRecovered(e, r))
		}
		if e.err != nil { // not reached: the lengths fit the pool
			s.log.Warn("worker server: recovered sequences not reported", "grid", g.id, "err", e.err)
			rep.Recovered = nil
		}
		rep.Quarantined = g.lost.Quarantined
		for _, d := range g.lost.Damaged {
			rep.Damaged = append(rep.Damaged, &workerv1.DamagedSeq{Key: d.Key, Seq: d.Seq, Grid: d.Grid, Reason: d.Reason})
		}
		for _, d := range rec.Damaged {
			rep.Damaged = append(rep.Damaged, &workerv1.DamagedSeq{Key: d.Key, Seq: d.Seq, Grid: d.Grid,
				Reason: "not recovered: " + scrubPaths(d.Err, s.cfg.DataDir, g.dir)})
		}
	}
	s.mu.Unlock()
	return rep, nil
}

// noteRecovery logs what grid g recovered from its data directory and
// counts it (s.mu held).
func (s *Server) noteRecovery(g *grid, rep worker.RecoveryReport) {
	corrupt := rep.CorruptSlots()
	if len(rep.Sequences) == 0 && len(rep.Damaged) == 0 && corrupt == 0 {
		s.log.Info("worker server: grid persists", "grid", g.id, "dir", rep.Dir)
		return
	}
	s.rec.Grids++
	s.rec.Sequences += len(rep.Sequences)
	s.rec.LostTokens += rep.LostTokens()
	s.rec.Damaged += len(rep.Damaged)
	s.rec.CorruptSlots += corrupt
	s.rec.RolledBack += rep.RolledBackTokens()
	s.log.Info("worker server: grid recovered", "grid", g.id, "dir", rep.Dir, "sequences", len(rep.Sequences),
		"lost_tokens", rep.LostTokens(), "rolled_back_tokens", rep.RolledBackTokens(), "damaged", len(rep.Damaged), "corrupt_slots", corrupt, "orphans", rep.OrphanSeqs)
	for _, r := range rep.Sequences {
		s.log.Info("worker server: recovered sequence", "grid", g.id, "from_grid", r.Grid, "key", r.Key, "seq", r.Seq, "lens", r.Lens, "lost_tokens", r.LostTokens(), "rolled_back", r.RolledBack)
	}
	for _, d := range rep.Damaged {
		s.log.Warn("worker server: sequence not recovered", "grid", g.id, "key", d.Key, "seq", d.Seq, "err", d.Err)
	}
	for i, rr := range rep.Ranks {
		if rr.Lengths != nil {
			// The sequences' losses there are unknown or bounds
			// (HadExact false), their tokens unaffected.
			s.log.Warn("worker server: length records damaged", "grid", g.id, "rank", i, "dir", rr.Dir, "err", rr.Lengths)
		}
	}
}

// connect builds g's transports on lis (which it takes over) and its
// worker, persisting in dir ("" for none); on failure it returns what
// it built for the caller to close.
func (s *Server) connect(ctx context.Context, g *grid, dir string, lis []net.Listener, peers, placement []string) (*worker.Local, []*grpctransport.Transport, error) {
	c := g.cfg
	if len(peers) != c.TP*c.CP {
		for _, l := range lis {
			l.Close()
		}
		return nil, nil, fmt.Errorf("%w: %d peer addresses for a %d x %d grid", worker.ErrBadMessage, len(peers), c.TP, c.CP)
	}
	for i, p := range peers {
		if p == "" {
			for _, l := range lis {
				l.Close()
			}
			return nil, nil, fmt.Errorf("%w: peers[%d] is empty", worker.ErrBadMessage, i)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	defer context.AfterFunc(g.ctx, cancel)()
	trs := make([]*grpctransport.Transport, len(g.ranks))
	errs := make([]error, len(g.ranks))
	var wg sync.WaitGroup
	for i, rk := range g.ranks {
		tc := grpctransport.DefaultConfig()
		tc.Group = g.id + "/tp" + strconv.Itoa(rk.TP)
		tc.Rank = rk.CP
		tc.Peers = peers[rk.TP*c.CP : (rk.TP+1)*c.CP]
		tc.Listener = lis[i]
		tc.TLS, tc.Plaintext, tc.Logger = s.cfg.TLS, s.cfg.Plaintext, s.log
		// Fixed windows, no BDP pings: a layer's exchanges are small
		// messages answered at once (wire.FlowWindow).
		tc.ServerOptions = append(append(tc.ServerOptions, wire.ServerFlowOptions()...), s.cfg.CollectiveServerOptions...)
		tc.DialOptions = append(append(tc.DialOptions, wire.DialFlowOptions()...), s.cfg.CollectiveDialOptions...)
		wg.Go(func() {
			var err error
			if trs[i], err = grpctransport.New(ctx, tc); err != nil {
				errs[i] = fmt.Errorf("rank %v: %w", rk, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, trs, &peerError{err}
	}
	if dir != "" {
		c.DataDir, c.Durability, c.SyncInterval, c.GridID = dir, s.cfg.Durability, s.cfg.SyncInterval, g.id
		c.Verify, c.ScrubRate = s.cfg.Verify, s.cfg.ScrubRate
		c.OnPersistError = s.cfg.OnPersistError
		if len(placement) == c.TP*c.CP {
			c.Placement = slices.Clone(placement)
		}
	}
	specs := make([]worker.RankSpec, len(g.ranks))
	for i, rk := range g.ranks {
		specs[i] = worker.RankSpec{Rank: rk, Backend: s.bes[g.devs[i]], Transport: trs[i]}
	}
	local, err := worker.NewLocal(c, specs)
	if err != nil && dir != "" && (errors.Is(err, tier.ErrCorrupt) || errors.Is(err, pagestore.ErrOtherFormat)) {
		// A damaged metadata file: nothing of it was read. (A format
		// record that disagrees with the config is damage too: the
		// directory's name says the grid's shape, gridDirBase.) Move the
		// directory aside for its owner to inspect and open the grid on
		// a fresh one: this node's part of the grid's sequences is lost
		// (the coordinator reports them as not recovered here), the node
		// and its other grids go on.
		moved := QuarantineName(dir, time.Now())
		if rerr := os.Rename(dir, moved); rerr != nil {
			return nil, trs, fmt.Errorf("%w (moving it aside failed: %v)", err, rerr)
		}
		why := scrubPaths(err, s.cfg.DataDir, dir)
		g.lost = NotRecovered{Quarantined: "the grid's data directory was damaged and moved aside: " + why}
		seqs, terr := worker.TableSeqs(moved)
		for _, q := range seqs {
			g.lost.Damaged = append(g.lost.Damaged, DamagedSeq{Key: q.Key, Seq: q.Seq, Grid: q.Grid, Reason: g.lost.Quarantined})
		}
		s.log.Error("data dir damaged: moved aside, the grid starts on a fresh one (this node's part of its sequences is lost)",
			"grid", g.id, "dir", dir, "moved_to", moved, "err", err, "sequences_lost", len(seqs), "table_err", terr)
		if s.cfg.OnQuarantine != nil {
			s.cfg.OnQuarantine(dir, moved, err)
		}
		local, err = worker.NewLocal(c, specs)
	}
	if err != nil {
		return nil, trs, err
	}
	return local, trs, nil
}
