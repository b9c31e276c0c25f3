package completion

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/model"
)

// MonitorConfig is the online quality monitor: a fraction of the decode
// steps' (layer, KV head) pairs replayed with dense attention on the
// side (notes 2.2: recall needs a dense reference, so sample it).
//
// At a step boundary the scheduler draws, for every decoding request and
// every layer that selects pages (not its dense layers) and every KV
// head, whether that (layer, KV head) of the step is sampled, with
// probability Rate. A request with a sample has its sequence forked
// before the step (the fork shares every page; copy on write) and the
// sampled layers' query, key and value copied during it; after the step
// the replay goes to a bounded queue that one monitor goroutine of the
// server works off: per sampled layer, the same step on the fork with
// the engine's diagnostics (the same selection, a dense pass over the
// same pages, the keys read back) and a forced-dense step for the dense
// output. The request's step does not wait for any of it (the replays
// take the engine's lock between the scheduler's steps). When the queue
// is full the samples are dropped and counted (Stats.MonitorDropped),
// never waited for.
type MonitorConfig struct {
	// Rate is the fraction of (step, layer, KV head) triples replayed,
	// 0..1 (0, the default: the monitor is off and costs nothing).
	Rate float64
	// Queue bounds the replays waiting or running (64). Each holds a
	// forked sequence, which may keep one page per shard of its own: the
	// engines' pools get Queue pages on top of CapacityPages when Rate >
	// 0, so replays never take an admitted request's pages.
	Queue int
	// TopR is R of the page recall: the fraction of dense attention's
	// top-R tokens whose pages the step read (10).
	TopR int
	// Observe, when set, receives every sample, on the monitor's
	// goroutine (it must not block for long: the queue backs up).
	Observe func(MonitorSample)
}

// MonitorSample is the replay of one KV head at one layer of one decode
// step of one request.
type MonitorSample struct {
	// Request is the completion id; Layer and KVHead the sample's.
	Request       string
	Layer, KVHead int
	// Position is the new token's position (the step's context length
	// minus one).
	Position int
	// PagesRead and PagesTotal are the pages the step's plan reads per
	// selection row (sink, local and selected; under per_head GQA a KV
	// head reads the union of its query heads') and the pages the
	// sequence holds.
	PagesRead, PagesTotal int
	// PageRecall is the fraction of dense attention's top-R tokens whose
	// pages the step read, MassRecall the dense softmax mass inside the
	// pages it read (1 - eps), both averaged over the KV head's query
	// heads; OutputError is ||o - o_dense|| / ||o_dense|| of the step's
	// attention output against dense attention over the same pages,
	// averaged over those query heads.
	PageRecall, MassRecall, OutputError float64
}

// validate reports an unusable monitor setting.
func (c MonitorConfig) validate() error {
	switch {
	case !(c.Rate >= 0 && c.Rate <= 1):
		return fmt.Errorf("serve config: monitor rate %v: want 0..1", c.Rate)
	case c.Rate > 0 && c.Queue < 1:
		return fmt.Errorf("serve config: monitor queue %d: want at least 1", c.Queue)
	case c.TopR < 0:
		return fmt.Errorf("serve config: monitor top-R %d: want 0 (10) or more", c.TopR)
	}
	return nil
}

// monitorSlack is the pages per shard every engine's pool holds on top
// of the admitted requests' reservations for the monitor's forks.
func (s *Server) monitorSlack() int {
	if s.cfg.Monitor.Rate == 0 {
		return 0
	}
	return s.cfg.Monitor.Queue
}

// monitor is the quality monitor's state: the sampling (the scheduler's)
// and the replay queue with its goroutine (started by New, stopped by
// Close after the scheduler).
type monitor struct {
	cfg   MonitorConfig
	g     model.Geometry
	rng   *rand.Rand // the scheduler's
	tasks chan *replayTask
	// forks counts the replays alive (queued, running, or being captured
	// by the current step); at most cfg.Queue.
	forks atomic.Int64

	sampled, dropped, replayed, failed atomic.Uint64

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// replayTask is one request's sampled layers of one step.
type replayTask struct {
	request string
	ref     *engineRef
	fork    *model.EngineAttention
	pos     int
	layers  []replayLayer
}

// replayLayer is one sampled layer: its KV heads and the step's inputs
// (copied during the step).
type replayLayer struct {
	layer    int
	heads    []int
	q, k, v  []float32
	captured bool
}

// record copies layer's step inputs when the layer is sampled.
func (t *replayTask) record(layer int, q, k, v []float32) {
	for i := range t.layers {
		if l := &t.layers[i]; l.layer == layer {
			l.q, l.k, l.v = append([]float32(nil), q...), append([]float32(nil), k...), append([]float32(nil), v...)
			l.captured = true
		}
	}
}

// newMonitor starts the replay goroutine.
func newMonitor(cfg MonitorConfig, g model.Geometry, seed uint64, replay func(context.Context, *replayTask)) *monitor {
	if cfg.TopR == 0 {
		cfg.TopR = 10
	}
	mo := &monitor{cfg: cfg, g: g, rng: rand.New(rand.NewPCG(seed, 0x6d6f6e69746f72)), tasks: make(chan *replayTask, cfg.Queue)}
	ctx, cancel := context.WithCancel(context.Background())
	mo.cancel = cancel
	mo.wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				// Closing: drop what is left, releasing the forks.
				for {
					select {
					case t := <-mo.tasks:
						mo.discard(t)
					default:
						return
					}
				}
			case t := <-mo.tasks:
				replay(ctx, t)
			}
		}
	})
	return mo
}

// stop ends the replay goroutine (the replay running is cancelled; the
// queued ones are dropped) and waits for it. Every fork is released.
func (mo *monitor) stop() {
	mo.cancel()
	mo.wg.Wait()
}

// discard releases a replay's fork without running it.
func (mo *monitor) discard(t *replayTask) {
	if err := t.fork.Release(); err != nil && !errors.Is(err, ErrEngineClosed) && !errors.Is(err, ErrClusterUnavailable) {
		mo.failed.Add(1)
	}
	t.ref.release()
	mo.forks.Add(-1)
}

// sample draws j's sampled (layer, KV head) pairs of the coming step and
// forks j's sequence for them; it returns the replay to capture, or nil.
// Called on the scheduler goroutine at a step boundary.
func (s *Server) sample(j *job) *replayTask {
	mo := s.mon
	if mo == nil || j.p.allDense {
		return nil
	}
	var layers []replayLayer
	n := 0
	for l := j.p.denseLayers; l < mo.g.Layers; l++ {
		var heads []int
		for h := range mo.g.KVHeads {
			if mo.rng.Float64() < mo.cfg.Rate {
				heads = append(heads, h)
			}
		}
		if heads != nil {
			layers = append(layers, replayLayer{layer: l, heads: heads})
			n += len(heads)
		}
	}
	if n == 0 {
		return nil
	}
	if mo.forks.Load() >= int64(mo.cfg.Queue) {
		mo.dropped.Add(uint64(n))
		return nil
	}
	fork, err := j.attn.Fork()
	if err != nil {
		s.log.Warn("monitor: fork", "request", j.id, "err", err)
		mo.failed.Add(uint64(n))
		return nil
	}
	mo.forks.Add(1)
	mo.sampled.Add(uint64(n))
	j.eng.acquire()
	fork.Options = decode.Options{Diagnostics: true, TopR: mo.cfg.TopR}
	fork.Compare = true
	return &replayTask{request: j.id, ref: j.eng, fork: fork, pos: j.attn.Len(), layers: layers}
}

// submit queues a captured replay (never blocking: forks bound the
// queue), or discards it when j's step failed.
func (s *Server) submit(t *replayTask, ok bool) {
	if !ok {
		s.mon.discard(t)
		return
	}
	s.mon.tasks <- t
}

// replay runs a task on the monitor goroutine: per sampled layer, the
// step again on the fork with diagnostics and a dense comparison, then
// the samples of its KV heads.
func (s *Server) replay(ctx context.Context, t *replayTask) {
	mo := s.mon
	defer mo.discard(t)
	g := mo.g
	grp := g.Heads / g.KVHeads
	out := make([]float32, g.Heads*g.HeadDim)
	for _, l := range t.layers {
		if !l.captured {
			mo.failed.Add(uint64(len(l.heads)))
			continue
		}
		if err := t.fork.Decode(ctx, l.layer, l.q, l.k, l.v, out); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("monitor: replay", "request", t.request, "layer", l.layer, "err", err)
			}
			mo.failed.Add(uint64(len(l.heads)))
			continue
		}
		st := t.fork.Steps()[l.layer]
		if !st.Diag || len(st.HeadRecall) != g.Heads || len(st.HeadMassRecall) != g.Heads || len(st.RelL2) != g.Heads {
			mo.failed.Add(uint64(len(l.heads)))
			continue
		}
		for _, h := range l.heads {
			sm := MonitorSample{Request: t.request, Layer: l.layer, KVHead: h, Position: t.pos,
				PagesRead: st.Plan.Reads(), PagesTotal: st.Plan.Pages}
			for qh := h * grp; qh < (h+1)*grp; qh++ {
				sm.PageRecall += st.HeadRecall[qh] / float64(grp)
				sm.MassRecall += st.HeadMassRecall[qh] / float64(grp)
				sm.OutputError += st.RelL2[qh] / float64(grp)
			}
			mo.replayed.Add(1)
			if mo.cfg.Observe != nil {
				mo.cfg.Observe(sm)
			}
		}
	}
}
