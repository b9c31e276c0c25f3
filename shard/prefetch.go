package shard

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
)

// prefetcher is the asynchronous half of an offloading shard's prefetch
// (see [Config.PrefetchPages]): one goroutine, started by New and stopped
// by Close, that reads the pages the steps reserved from the tier into
// their device slots (pagestore.Store.LoadPrefetch), in the order the
// steps queued them. It takes no lock of the shard, so a step never
// waits for it except for a page it needs whose read is in flight.
type prefetcher struct {
	store  *pagestore.Store
	ctx    context.Context // cancelled by stop: reads in flight end early
	cancel context.CancelFunc
	wake   chan struct{} // capacity 1: work was queued
	done   chan struct{} // closed when run returns
	once   sync.Once

	mu     sync.Mutex
	queue  []pagestore.Fetch // reservations to read, in order
	spare  []pagestore.Fetch // the other buffer, when run is not reading it
	closed bool

	buf []byte // run's payload scratch
}

func newPrefetcher(st *pagestore.Store) *prefetcher {
	ctx, cancel := context.WithCancel(context.Background())
	p := &prefetcher{
		store:  st,
		ctx:    ctx,
		cancel: cancel,
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		buf:    make([]byte, st.Config().PayloadBytes()),
	}
	go p.run()
	return p
}

func (p *prefetcher) run() {
	defer close(p.done)
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		}
		for {
			p.mu.Lock()
			batch := p.queue
			if len(batch) == 0 {
				p.mu.Unlock()
				break
			}
			// Swap buffers: the steps append to the other one meanwhile.
			p.queue, p.spare = p.spare[:0], nil
			p.mu.Unlock()
			for i, f := range batch {
				if p.ctx.Err() != nil {
					p.store.CancelPrefetch(batch[i:])
					return
				}
				// A failed read is counted by the store (PrefetchFailed);
				// a step that needs the page reads it itself and fails
				// with the tier's error if it fails again.
				_ = p.store.LoadPrefetch(p.ctx, f, p.buf)
			}
			p.mu.Lock()
			p.spare = batch[:0]
			p.mu.Unlock()
		}
	}
}

// enqueue hands reservations to the goroutine (after stop: gives them
// back).
func (p *prefetcher) enqueue(fs []pagestore.Fetch) {
	if len(fs) == 0 {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.store.CancelPrefetch(fs)
		return
	}
	p.queue = append(p.queue, fs...)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// stop ends the goroutine (a read in flight is cancelled through its
// context) and gives back the reservations still queued. Idempotent.
func (p *prefetcher) stop() {
	p.once.Do(func() {
		p.cancel()
		<-p.done
		p.mu.Lock()
		q := p.queue
		p.queue, p.closed = nil, true
		p.mu.Unlock()
		p.store.CancelPrefetch(q)
	})
}

// prefetchPlan is the step side of prefetch: ranking the pages below a
// step's selection and reserving slots for them. Guarded by the shard's
// mutex.
type prefetchPlan struct {
	pages int  // K_prefetch per row
	cross bool // rank layer l+1's pages with layer l's queries

	topk   kernels.TopKPlan
	rowSeq []int32   // the sequence (part) of each top-K row
	sel    []int32   // top-K output
	scores []float32 // cross-layer scores
	cand   []cand
	phys   []int32
	seen   []uint32 // physical page: == epoch once a candidate
	epoch  uint32
	fetch  []pagestore.Fetch

	steps, ranked int64
	time          time.Duration
}

type cand struct {
	score float32
	page  int32
}

func newPrefetchPlan(c Config) *prefetchPlan {
	return &prefetchPlan{pages: c.PrefetchPages, cross: c.PrefetchCrossLayer, seen: make([]uint32, c.Store.Capacity)}
}

// prefetchNext runs after a single-pass step's recall, before its
// attention: per ranked (sequence, row), it ranks this shard's pages of
// the plan's candidate range and takes the best n + PrefetchPages (n: the
// row's selected pages here), drops those the step attends, orders the
// rest by score (best first), reserves device slots for those that are
// not resident (free slots and clean unpinned victims outside the step's
// working set: pagestore.Store.ReservePrefetch) and queues them for the
// prefetcher, which reads them while the step attends. With
// PrefetchCrossLayer, below the last layer, the ranking uses layer l+1's
// summaries scored with this step's queries: a prediction of the pages
// layer l+1 will select. It needs the step's scores on the host (the
// quest or oracle selector; nothing is ranked otherwise).
func (s *Shard) prefetchNext(ctx context.Context, ls *LocalStep) error {
	pp, o := s.pfPlan, s.off
	if s.store.Offloaded() == 0 {
		return nil // every page's K/V is on the device: nothing to fetch
	}
	t0 := time.Now()
	defer func() { pp.time += time.Since(t0) }()
	if ls.pfRanked {
		if ls.topk.Rows() == 0 {
			return nil // nothing ranked (dense or unranked plans), as below
		}
		// rankDevice ranked the candidates on the device.
		ep := next(&pp.epoch, pp.seen)
		pp.cand = pp.cand[:0]
		for _, c := range ls.pfCand {
			if o.mark[c.page] == o.epoch || pp.seen[c.page] == ep {
				continue // attended now, or a candidate already
			}
			pp.seen[c.page] = ep
			pp.cand = append(pp.cand, c)
		}
		return s.reservePrefetch()
	}
	scores := ls.scores
	if pp.cross && ls.layer+1 < s.cfg.Store.Layers && ls.scored {
		n := ls.batch.Total() * ls.rows
		pp.scores = resize(pp.scores, n)
		if err := s.be.Score(ctx, s.shape, s.layer(ls.layer+1), &ls.batch, ls.q, ls.mode, pp.scores); err != nil {
			return err
		}
		scores = pp.scores
	} else if !ls.scored || ls.lists.All {
		return nil
	}
	pp.topk.Reset()
	pp.rowSeq = pp.rowSeq[:0]
	total := 0
	for i, part := range ls.parts {
		pl := part.Plan
		if pl.Dense || pl.Rank == 0 {
			continue
		}
		lo, hi := ls.localRange(i, pl.Lo(), pl.Hi())
		if hi <= lo {
			continue
		}
		a, b := ls.localRange(i, 0, pl.Sink)
		c, d := ls.localRange(i, pl.Hi(), pl.Pages)
		forced := (b - a) + (d - c)
		np := ls.batch.NumPages(i)
		for r := range ls.rows {
			k := i*ls.rows + r
			nsel := int(ls.lists.Indptr[k+1]-ls.lists.Indptr[k]) - forced
			want := min(max(nsel, 0)+pp.pages, hi-lo)
			pp.topk.Add(ls.batch.ScoreOffset(i, ls.rows)+r*np+lo, hi-lo, lo, want, total)
			pp.rowSeq = append(pp.rowSeq, int32(i))
			total += want
		}
	}
	if total == 0 {
		return nil
	}
	pp.sel = slices.Grow(pp.sel[:0], total)[:total]
	if err := s.be.TopK(ctx, scores, &pp.topk, pp.sel); err != nil {
		return err
	}
	ep := next(&pp.epoch, pp.seen)
	pp.cand = pp.cand[:0]
	for row, i := range pp.rowSeq {
		pages := ls.batch.Pages[ls.batch.Indptr[i]:ls.batch.Indptr[i+1]]
		base := int(pp.topk.ScoreOff[row]) - int(pp.topk.Base[row])
		off, k := int(pp.topk.OutOff[row]), int(pp.topk.K[row])
		for _, lp := range pp.sel[off : off+k] {
			p := pages[lp]
			if o.mark[p] == o.epoch || pp.seen[p] == ep {
				continue // attended now, or a candidate already
			}
			pp.seen[p] = ep
			pp.cand = append(pp.cand, cand{score: scores[base+int(lp)], page: p})
		}
	}
	return s.reservePrefetch()
}

// reservePrefetch reserves slots for the candidates of s.pfPlan.cand, best
// first, and queues them for the prefetcher.
func (s *Shard) reservePrefetch() error {
	pp, o := s.pfPlan, s.off
	pp.steps++
	pp.ranked += int64(len(pp.cand))
	if len(pp.cand) == 0 {
		return nil
	}
	// Best first, so that when slots run short the likeliest pages come.
	slices.SortFunc(pp.cand, func(a, b cand) int {
		if c := cmp.Compare(b.score, a.score); c != 0 {
			return c
		}
		return cmp.Compare(a.page, b.page)
	})
	pp.phys = pp.phys[:0]
	for _, c := range pp.cand {
		pp.phys = append(pp.phys, c.page)
	}
	// Victims: cold pages only, unused by this step and by every layer's
	// step of the previous token.
	pp.fetch = s.store.ReservePrefetch(pp.phys, o.want, s.cfg.Store.Layers+1, pp.fetch[:0])
	s.pf.enqueue(pp.fetch)
	return nil
}
