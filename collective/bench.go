package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// BenchConfig configures BenchCollective (questctl bench collective).
type BenchConfig struct {
	// Shards are the CP group sizes N to run. Default 2, 4, 8, 16.
	Shards []int
	// Batches are the batch sizes (sequences per step) to run. Default 1, 16.
	Batches []int
	// Steps is the number of measured layer-steps per configuration.
	// Default 1000.
	Steps int
	// Warmup is the number of unmeasured layer-steps run first. Default 50.
	Warmup int
	// Transport names the transport: "inproc" (default) is the only one
	// built in; others need NewTransports.
	Transport string
	// NewTransports, when set, builds the n members of a group for the
	// named Transport (a gRPC loopback group, say); the benchmark closes
	// them.
	NewTransports func(n int) ([]Transport, error)
	// KVHeads is the number of KV heads per sequence: selection rows =
	// batch x KVHeads (group_max GQA). Default 8.
	KVHeads int
	// QHeads is the number of query heads per sequence: merged states =
	// batch x QHeads. Default 32.
	QHeads int
	// HeadDim is D. Default 128.
	HeadDim int
	// PageBudget is K, pages selected per row; each rank proposes up to K
	// candidates per row. Default 128.
	PageBudget int
	// Pages is the number of pages of each sequence, striped over the
	// ranks (page p on rank p mod N). Default 8192 (128K tokens at S=16).
	Pages int
	// Seed seeds the random scores and states. Default 1.
	Seed uint64
}

// DefaultBenchConfig returns the defaults documented on BenchConfig.
func DefaultBenchConfig() BenchConfig {
	return BenchConfig{
		Shards: []int{2, 4, 8, 16}, Batches: []int{1, 16},
		Steps: 1000, Warmup: 50, Transport: "inproc",
		KVHeads: 8, QHeads: 32, HeadDim: 128, PageBudget: 128, Pages: 8192, Seed: 1,
	}
}

// withDefaults fills zero fields from DefaultBenchConfig.
func (c BenchConfig) withDefaults() BenchConfig {
	d := DefaultBenchConfig()
	if len(c.Shards) == 0 {
		c.Shards = d.Shards
	}
	if len(c.Batches) == 0 {
		c.Batches = d.Batches
	}
	if c.Steps == 0 {
		c.Steps = d.Steps
	}
	if c.Transport == "" {
		c.Transport = d.Transport
	}
	if c.KVHeads == 0 {
		c.KVHeads = d.KVHeads
	}
	if c.QHeads == 0 {
		c.QHeads = d.QHeads
	}
	if c.HeadDim == 0 {
		c.HeadDim = d.HeadDim
	}
	if c.PageBudget == 0 {
		c.PageBudget = d.PageBudget
	}
	if c.Pages == 0 {
		c.Pages = d.Pages
	}
	if c.Seed == 0 {
		c.Seed = d.Seed
	}
	return c
}

// Validate reports whether the config is usable (after zero fields take
// their defaults; Warmup may be 0).
func (c BenchConfig) Validate() error {
	c = c.withDefaults()
	for _, n := range c.Shards {
		if n < 1 || n > 1024 {
			return fmt.Errorf("bench collective: shard count %d not in [1, 1024]", n)
		}
	}
	for _, b := range c.Batches {
		if b < 1 {
			return fmt.Errorf("bench collective: batch %d < 1", b)
		}
	}
	switch {
	case c.Steps < 1:
		return fmt.Errorf("bench collective: steps %d < 1", c.Steps)
	case c.Warmup < 0:
		return fmt.Errorf("bench collective: warmup %d < 0", c.Warmup)
	case c.KVHeads < 1 || c.QHeads < 1 || c.HeadDim < 1 || c.PageBudget < 1 || c.Pages < 1:
		return fmt.Errorf("bench collective: heads, head dim, budget and pages must be positive")
	case c.Transport != "inproc" && c.NewTransports == nil:
		return fmt.Errorf("bench collective: unknown transport %q (only inproc is built in)", c.Transport)
	}
	return nil
}

// Result is one configuration of BenchCollective. Latencies are per
// layer-step in microseconds, measured as the group's latency: the ranks
// start each operation together (after an in-process barrier that is not
// timed), and a step's latency is the time from the first rank entering
// the operation to the last rank returning from it, which is the max over
// ranks (for the merge, the root returns last). Bytes are the payload bytes
// all ranks together hand to Transport.Send in one step (headers
// included), averaged over the measured steps.
type Result struct {
	Shards      int     `json:"shards"`
	Batch       int     `json:"batch"`
	Transport   string  `json:"transport"`
	Steps       int     `json:"steps"`
	Rows        int     `json:"rows"`     // selection rows = batch x KV heads
	K           int     `json:"k"`        // pages per row
	States      int     `json:"states"`   // merged states = batch x query heads
	HeadDim     int     `json:"head_dim"` // D
	SelectP50   float64 `json:"select_p50_us"`
	SelectP95   float64 `json:"select_p95_us"`
	SelectP99   float64 `json:"select_p99_us"`
	SelectMax   float64 `json:"select_max_us"`
	MergeP50    float64 `json:"merge_p50_us"`
	MergeP95    float64 `json:"merge_p95_us"`
	MergeP99    float64 `json:"merge_p99_us"`
	MergeMax    float64 `json:"merge_max_us"`
	SelectBytes int64   `json:"select_bytes"`
	MergeBytes  int64   `json:"merge_bytes"`
	SelectMsgs  int64   `json:"select_msgs"` // messages per step, all ranks
	MergeMsgs   int64   `json:"merge_msgs"`
}

// BenchCollective runs, for every shard count N and batch size of cfg, Warmup
// + Steps layer-steps on N goroutines over N transports: (a) SelectExact
// with batch x KVHeads rows, each rank proposing up to PageBudget
// candidates per row from its own stripe of the pages, and (b) Reduce to
// rank 0 of batch x QHeads partial states of HeadDim floats. It reports
// latency percentiles of each operation separately and the bytes sent per
// step (see Result).
func BenchCollective(ctx context.Context, cfg BenchConfig) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var out []Result
	for _, n := range cfg.Shards {
		for _, b := range cfg.Batches {
			r, err := benchOne(ctx, cfg, n, b)
			if err != nil {
				return out, fmt.Errorf("bench collective shards=%d batch=%d: %w", n, b, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// countingTransport counts what its member sends.
type countingTransport struct {
	Transport
	bytes, msgs atomic.Int64
}

func (c *countingTransport) Send(ctx context.Context, to int, tag uint64, msg []byte) error {
	c.bytes.Add(int64(len(msg)))
	c.msgs.Add(1)
	return c.Transport.Send(ctx, to, tag, msg)
}

// barrier is a cyclic barrier for n goroutines that can be broken (every
// waiter then returns false).
type barrier struct {
	mu     sync.Mutex
	n, in  int
	ch     chan struct{}
	broken bool
}

func newBarrier(n int) *barrier { return &barrier{n: n, ch: make(chan struct{})} }

func (b *barrier) wait() bool {
	b.mu.Lock()
	if b.broken {
		b.mu.Unlock()
		return false
	}
	b.in++
	if b.in == b.n {
		b.in = 0
		close(b.ch)
		b.ch = make(chan struct{})
		b.mu.Unlock()
		return true
	}
	ch := b.ch
	b.mu.Unlock()
	<-ch
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.broken
}

func (b *barrier) breakAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.broken {
		b.broken = true
		close(b.ch)
	}
}

type benchRank struct {
	local  [][]Candidate
	o, lse []float32
	o0, l0 []float32 // the root's input, restored before every merge
	// per step, nanoseconds since the run's base time
	selStart, selEnd, mrgStart, mrgEnd   []int64
	selBytes, mrgBytes, selMsgs, mrgMsgs int64
}

func benchOne(ctx context.Context, cfg BenchConfig, n, batch int) (Result, error) {
	var trs []Transport
	if cfg.NewTransports != nil {
		var err error
		if trs, err = cfg.NewTransports(n); err != nil {
			return Result{}, err
		}
		if len(trs) != n {
			return Result{}, fmt.Errorf("transport factory returned %d members, want %d", len(trs), n)
		}
	} else {
		trs = NewInprocGroup(n)
	}
	cts := make([]*countingTransport, n)
	for i, t := range trs {
		cts[i] = &countingTransport{Transport: t}
	}
	defer func() {
		for _, t := range trs {
			t.Close()
		}
	}()

	rows, states, d, k := batch*cfg.KVHeads, batch*cfg.QHeads, cfg.HeadDim, cfg.PageBudget
	total := cfg.Warmup + cfg.Steps
	budgets := make([]int, rows)
	for i := range budgets {
		budgets[i] = k
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(n)<<32|uint64(batch)))
	ranks := make([]*benchRank, n)
	for r := range n {
		br := &benchRank{
			local: make([][]Candidate, rows),
			o:     make([]float32, states*d), lse: make([]float32, states),
			selStart: make([]int64, total), selEnd: make([]int64, total),
			mrgStart: make([]int64, total), mrgEnd: make([]int64, total),
		}
		var mine []int32
		for p := r; p < cfg.Pages; p += n {
			mine = append(mine, int32(p))
		}
		for row := range rows {
			rng.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
			c := make([]Candidate, min(k, len(mine)))
			for i := range c {
				c[i] = Candidate{Score: float32(rng.NormFloat64()), Page: mine[i]}
			}
			br.local[row] = c
		}
		for i := range br.o {
			br.o[i] = float32(rng.Float64()*2 - 1)
		}
		for i := range br.lse {
			br.lse[i] = float32(rng.Float64() * 10)
		}
		if r == 0 {
			br.o0, br.l0 = slices.Clone(br.o), slices.Clone(br.lse)
		}
		ranks[r] = br
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bar := newBarrier(n)
	base := time.Now()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		cancel()
		bar.breakAll()
	}
	for r := range n {
		wg.Go(func() {
			br, ct := ranks[r], cts[r]
			g := NewGroup(ct)
			var dst [][]int32
			for s := range total {
				if !bar.wait() {
					return
				}
				b0, m0 := ct.bytes.Load(), ct.msgs.Load()
				br.selStart[s] = int64(time.Since(base))
				var err error
				dst, err = g.SelectExact(ctx, MakeTag(uint64(s), 0, OpSelect), br.local, budgets, dst)
				br.selEnd[s] = int64(time.Since(base))
				if err != nil {
					fail(err)
					return
				}
				b1, m1 := ct.bytes.Load(), ct.msgs.Load()
				if r == 0 {
					copy(br.o, br.o0)
					copy(br.lse, br.l0)
				}
				if !bar.wait() {
					return
				}
				br.mrgStart[s] = int64(time.Since(base))
				err = g.Reduce(ctx, MakeTag(uint64(s), 0, OpReduce), 0, d, br.o, br.lse)
				br.mrgEnd[s] = int64(time.Since(base))
				if err != nil {
					fail(err)
					return
				}
				if s >= cfg.Warmup {
					b2, m2 := ct.bytes.Load(), ct.msgs.Load()
					br.selBytes += b1 - b0
					br.selMsgs += m1 - m0
					br.mrgBytes += b2 - b1
					br.mrgMsgs += m2 - m1
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return Result{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}

	sel := make([]float64, 0, cfg.Steps)
	mrg := make([]float64, 0, cfg.Steps)
	res := Result{
		Shards: n, Batch: batch, Transport: cfg.Transport, Steps: cfg.Steps,
		Rows: rows, K: k, States: states, HeadDim: d,
	}
	for s := cfg.Warmup; s < total; s++ {
		sel = append(sel, groupLatencyUS(ranks, s, func(b *benchRank) ([]int64, []int64) { return b.selStart, b.selEnd }))
		mrg = append(mrg, groupLatencyUS(ranks, s, func(b *benchRank) ([]int64, []int64) { return b.mrgStart, b.mrgEnd }))
	}
	for _, br := range ranks {
		res.SelectBytes += br.selBytes
		res.SelectMsgs += br.selMsgs
		res.MergeBytes += br.mrgBytes
		res.MergeMsgs += br.mrgMsgs
	}
	steps := int64(cfg.Steps)
	res.SelectBytes, res.SelectMsgs = res.SelectBytes/steps, res.SelectMsgs/steps
	res.MergeBytes, res.MergeMsgs = res.MergeBytes/steps, res.MergeMsgs/steps
	slices.Sort(sel)
	slices.Sort(mrg)
	res.SelectP50, res.SelectP95, res.SelectP99, res.SelectMax = quantile(sel, 0.50), quantile(sel, 0.95), quantile(sel, 0.99), sel[len(sel)-1]
	res.MergeP50, res.MergeP95, res.MergeP99, res.MergeMax = quantile(mrg, 0.50), quantile(mrg, 0.95), quantile(mrg, 0.99), mrg[len(mrg)-1]
	if res.SelectP50 < 0 || res.MergeP50 < 0 {
		return res, errors.New("negative latency (clock)")
	}
	return res, nil
}

// groupLatencyUS is max over ranks of the end minus min over ranks of the
// start of step s, in microseconds.
func groupLatencyUS(ranks []*benchRank, s int, f func(*benchRank) ([]int64, []int64)) float64 {
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for _, b := range ranks {
		st, en := f(b)
		lo, hi = min(lo, st[s]), max(hi, en[s])
	}
	return float64(hi-lo) / 1e3
}

// quantile returns the nearest-rank q-quantile of sorted xs.
func quantile(xs []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
