package collective

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/plan"
)

// Limits of the BenchConfig fields that size the benchmark, checked by
// Validate before anything is allocated. They keep every size the
// benchmark derives far from integer overflow and from the wire format's
// 32-bit counts; what fits in memory is checked separately (MaxMemory).
const (
	// MaxBenchShards is the largest CP group: N goroutines and N*(N-1)
	// messages per selection step.
	MaxBenchShards = 1024
	// MaxBenchBatch is the largest batch (sequences per step).
	MaxBenchBatch = 4096
	// MaxBenchHeads is the most KV heads, and the most query heads.
	MaxBenchHeads = 1024
	// MaxBenchHeadDim is the largest head dimension D.
	MaxBenchHeadDim = 16384
	// MaxBenchPages is the most pages per sequence (256M tokens at S=16).
	MaxBenchPages = 1 << 24
	// MaxBenchSteps is the most measured steps, and the most warm-up steps.
	MaxBenchSteps = 1 << 24
)

// BenchConfig configures BenchCollective (questctl bench collective). Start
// from DefaultBenchConfig: no field takes a default when it is zero, and
// Validate refuses zero or negative sizes (Warmup may be 0; Seed is any
// value; MaxMemory 0 means the memory available now).
type BenchConfig struct {
	// Shards are the CP group sizes N to run, each in [1, MaxBenchShards].
	// Default 2, 4, 8, 16.
	Shards []int
	// Batches are the batch sizes (sequences per step) to run, each in [1,
	// MaxBenchBatch]. Default 1, 16.
	Batches []int
	// Steps is the number of measured layer-steps per configuration, in
	// [1, MaxBenchSteps]. Default 1000.
	Steps int
	// Warmup is the number of unmeasured layer-steps run first, in [0,
	// MaxBenchSteps]. Default 50.
	Warmup int
	// Transport names the transport: "inproc" (default) is the only one
	// built in; others need NewTransports.
	Transport string
	// NewTransports, when set, builds the n members of a group for the
	// named Transport (a gRPC loopback group, say); the benchmark closes
	// them. It is called as each configuration starts.
	NewTransports func(n int) ([]Transport, error)
	// KVHeads is the number of KV heads per sequence: selection rows =
	// batch x KVHeads (group_max GQA). In [1, MaxBenchHeads]; default 8.
	KVHeads int
	// QHeads is the number of query heads per sequence: merged states =
	// batch x QHeads. In [1, MaxBenchHeads]; default 32.
	QHeads int
	// HeadDim is D, in [1, MaxBenchHeadDim]. Default 128.
	HeadDim int
	// PageBudget is K, pages selected per row, in [1, Pages]; each rank
	// proposes up to K candidates per row. Default 128.
	PageBudget int
	// Pages is the number of pages of each sequence, striped over the
	// ranks (page p on rank p mod N), in [1, MaxBenchPages]. Default 8192
	// (128K tokens at S=16).
	Pages int
	// Seed seeds the random scores and states. Default 1.
	Seed uint64
	// MaxMemory bounds the heap the benchmark may need (MemoryBytes), in
	// memlimit's terms: a byte count, memlimit.Auto (0, the default: the
	// memory available now) or memlimit.NoLimit (-1).
	MaxMemory int64
	// Progress, when set, receives one line as each configuration starts.
	Progress io.Writer
}

// DefaultBenchConfig returns the defaults documented on BenchConfig.
func DefaultBenchConfig() BenchConfig {
	return BenchConfig{
		Shards: []int{2, 4, 8, 16}, Batches: []int{1, 16},
		Steps: 1000, Warmup: 50, Transport: "inproc",
		KVHeads: 8, QHeads: 32, HeadDim: 128, PageBudget: 128, Pages: 8192, Seed: 1,
		MaxMemory: memlimit.Auto,
	}
}

// BenchRangeError reports a BenchConfig field outside its allowed range; a
// command line maps Field to its flag.
type BenchRangeError struct {
	Field    string // the BenchConfig field: "Steps", "PageBudget", ...
	Value    int
	Min, Max int
	// Limit names what sets Max when it is not a fixed limit ("Pages").
	Limit string
}

func (e *BenchRangeError) Error() string {
	return fmt.Sprintf("bench collective: %s %d: %s", e.Field, e.Value, e.Want())
}

// Want says the allowed range: "want 1 to 1024", "want 1 to 8192 (Pages)".
func (e *BenchRangeError) Want() string {
	w := fmt.Sprintf("want %d to %d", e.Min, e.Max)
	if e.Limit != "" {
		w += " (" + e.Limit + ")"
	}
	return w
}

func checkRange(field string, v, lo, hi int, limit string) error {
	if v < lo || v > hi {
		return &BenchRangeError{Field: field, Value: v, Min: lo, Max: hi, Limit: limit}
	}
	return nil
}

// Validate reports whether the config is usable: every size in its range
// (a *BenchRangeError names the first one that is not), a known transport,
// and the heap the benchmark needs (MemoryBytes) within MaxMemory (an
// error wrapping memlimit.ErrTooLarge). It allocates nothing.
func (c BenchConfig) Validate() error {
	if err := c.validateSizes(); err != nil {
		return err
	}
	switch {
	case c.Transport == "":
		return errors.New("bench collective: no transport named (want inproc)")
	case c.Transport != "inproc" && c.NewTransports == nil:
		return fmt.Errorf("bench collective: unknown transport %q (only inproc is built in)", c.Transport)
	}
	return memlimit.Check("bench collective data", c.MemoryBytes(), c.MaxMemory)
}

// validateSizes is Validate without the transport and memory checks.
func (c BenchConfig) validateSizes() error {
	if len(c.Shards) == 0 || len(c.Batches) == 0 {
		return errors.New("bench collective: want at least one shard count and one batch size")
	}
	for _, n := range c.Shards {
		if err := checkRange("Shards", n, 1, MaxBenchShards, ""); err != nil {
			return err
		}
	}
	for _, b := range c.Batches {
		if err := checkRange("Batches", b, 1, MaxBenchBatch, ""); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name      string
		v, lo, hi int
		limit     string
	}{
		{"Steps", c.Steps, 1, MaxBenchSteps, ""},
		{"Warmup", c.Warmup, 0, MaxBenchSteps, ""},
		{"KVHeads", c.KVHeads, 1, MaxBenchHeads, ""},
		{"QHeads", c.QHeads, 1, MaxBenchHeads, ""},
		{"HeadDim", c.HeadDim, 1, MaxBenchHeadDim, ""},
		{"Pages", c.Pages, 1, MaxBenchPages, ""},
		{"PageBudget", c.PageBudget, 1, max(c.Pages, 1), "Pages"},
	} {
		if err := checkRange(f.name, f.v, f.lo, f.hi, f.limit); err != nil {
			return err
		}
	}
	if c.QHeads%c.KVHeads != 0 {
		return fmt.Errorf("--q-heads %d is not a multiple of --kv-heads %d", c.QHeads, c.KVHeads)
	}
	for _, n := range c.Shards {
		if n > c.Pages {
			return fmt.Errorf("--shards %d: more ranks than the %d pages of a sequence (--pages)", n, c.Pages)
		}
	}
	return nil
}

// MemoryBytes returns the heap the benchmark needs, in bytes, for its
// largest (shards, batch) configuration (configurations run one after
// another). Its data are the candidates, every rank's received select
// frames and their decoded sort keys, the selections, the partial states,
// the root's merge buffers and received state frames, the baseline's
// messages of the same sizes, the per-step timestamps and the ranks'
// goroutine stacks; the heap is twice that,
// because every step's messages are fresh allocations and the collector
// lets the heap grow to about twice the live data before collecting
// (GOGC=100). It is -1 when a size is out of range or the total overflows
// int64, which memlimit.Check refuses.
func (c BenchConfig) MemoryBytes() int64 {
	var need int64
	for _, n := range c.Shards {
		for _, b := range c.Batches {
			nb := benchBytes(c, n, b)
			if nb < 0 {
				return -1
			}
			need = max(need, nb)
		}
	}
	return need
}

// benchBytes is MemoryBytes of one configuration.
func benchBytes(c BenchConfig, shards, batch int) int64 {
	if shards < 1 || c.Pages < 1 {
		return -1
	}
	mul, add := memlimit.Mul, memlimit.Add
	n, k, pages := int64(shards), int64(c.PageBudget), int64(c.Pages)
	rows := mul(int64(batch), int64(c.KVHeads))
	states := mul(int64(batch), int64(c.QHeads))
	stripe := (pages + n - 1) / n // pages of one rank
	cands := min(k, stripe)       // candidates per rank and row
	selected := min(k, pages)     // pages selected per row
	// A select frame: header, a count per row, 8 bytes per candidate.
	selFrame := add(selectHeaderLen, mul(rows, 4), mul(rows, cands, candidateLen))
	// A state frame, and one state's o and lse: (D+1) floats per head.
	state := mul(states, add(int64(c.HeadDim), 1), 4)
	stateFrame := add(stateHeaderLen, state)
	steps := add(int64(c.Warmup), int64(c.Steps))
	// The sort keys are appended into one slice: up to 1/4 more capacity.
	keys := mul(n, n, rows, add(cands, 1), 8)
	keys = add(keys, keys/4)
	data := add(
		mul(n, rows, add(mul(cands, 8), 24)),    // candidates, and the row slices
		mul(n, stripe, 4),                       // each rank's stripe of page indices
		mul(rows, 8),                            // the budgets
		mul(n, n, selFrame),                     // each rank's own frame and the N-1 it receives
		keys,                                    // each rank's sort keys of all ranks' candidates
		mul(n, n, rows, 8),                      // where each (row, rank) starts among them
		mul(n, rows, add(mul(selected, 4), 24)), // the selections, and the row slices
		mul(n, state),                           // every rank's o and lse
		mul(4, state),                           // the root's input copy, accumulator and scratch
		mul(n, stateFrame),                      // the state frames the root receives (and each sender's)
		mul(n, n, selFrame),                     // the baseline's select-sized messages, own and received
		mul(n, stateFrame),                      // the baseline's state-sized messages
		mul(n, steps, 10*8),                     // ten timestamps per rank and step
		mul(n, 8<<10),                           // goroutine stacks
	)
	return mul(data, 2)
}

// BenchResult is one configuration of BenchCollective. Latencies are per
// layer-step in microseconds, measured as the group's latency: the ranks
// start each operation together (after an in-process barrier that is not
// timed), and a step's latency is the time from the first rank entering
// the operation to the last rank returning from it, which is the max over
// ranks (for the merge, the root returns last). Bytes are the payload bytes
// all ranks together hand to Transport.Send in one step (headers
// included), averaged over the measured steps.
type BenchResult struct {
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
	// StartSkewP50 is the median over the measured steps of the spread of
	// the ranks' selection start times (last start minus first): how far
	// apart the barrier released them, included in the select latencies.
	StartSkewP50 float64 `json:"start_skew_p50_us"`
	// BaselineStartSkewP50 is the same spread for the baseline of the
	// select (the ranks' BaselineStart): what the barrier's exit costs an
	// operation that starts with no work of its own, so the excess of
	// StartSkewP50 over it is start skew the select's own work causes
	// (the barrier's last message waiting behind a rank's encode).
	BaselineStartSkewP50 float64 `json:"baseline_start_skew_p50_us"`
	// Processes is the number of OS processes the ranks ran in: 1 for
	// BenchCollective (goroutines of one process), Shards when every rank
	// had its own (BenchRank; questctl bench collective --nodes).
	Processes int `json:"processes"`

	// The baseline, measured in the same steps over the same transports:
	// BaselineP50/P99 are the group latency of an all-gather of opaque
	// bytes, each rank sending a message of its own select frame's length
	// to every other rank (the select exchange's bytes and messages,
	// without encoding, checks or the top-K merge), and
	// OverheadVsBaseline is SelectP50 / BaselineP50. The Merge* ones are
	// the same for the merge: every rank sends rank 0 a message of its
	// state frame's length. PingPongP50/P99 are one round trip between
	// ranks 0 and 1 over their stream of a message of rank 0's select
	// frame (PingPongBytes), timed by rank 0 (0 with one rank).
	BaselineP50             float64 `json:"baseline_p50_us"`
	BaselineP99             float64 `json:"baseline_p99_us"`
	OverheadVsBaseline      float64 `json:"overhead_vs_baseline"`
	MergeBaselineP50        float64 `json:"merge_baseline_p50_us"`
	MergeBaselineP99        float64 `json:"merge_baseline_p99_us"`
	MergeOverheadVsBaseline float64 `json:"merge_overhead_vs_baseline"`
	PingPongP50             float64 `json:"pingpong_p50_us"`
	PingPongP99             float64 `json:"pingpong_p99_us"`
	PingPongBytes           int64   `json:"pingpong_bytes"`
	// Bytes and messages of the baseline rounds per step, all ranks, as
	// SelectBytes and MergeBytes count them (Transport.Send's payloads):
	// equal to the select's and the merge's by construction.
	BaselineBytes      int64 `json:"baseline_bytes"`
	BaselineMsgs       int64 `json:"baseline_msgs"`
	MergeBaselineBytes int64 `json:"merge_baseline_bytes"`
	MergeBaselineMsgs  int64 `json:"merge_baseline_msgs"`
}

// BenchCollective runs, for every shard count N and batch size of cfg (in
// that order, batches inner), Warmup + Steps layer-steps on N goroutines
// over N transports: (a) SelectExactUnordered (what the worker runs) with
// batch x KVHeads rows, each rank proposing up to PageBudget candidates
// per row from its own stripe of the pages, best first as the CPU
// backend's top-K hands them to the exchange (kernels.TopKPlan.BestFirst),
// and (b) Reduce to rank 0 of batch x QHeads partial states of
// HeadDim floats, each followed in the same step by its baseline (a plain
// round of the same bytes over the same transports) and then a ping-pong.
// It reports latency percentiles of each operation and its baseline
// separately and the bytes sent per step (see BenchResult).
//
// emit receives each configuration's result as soon as it is measured, on
// the calling goroutine and before the next configuration starts; an
// error from emit stops the benchmark and is returned as is. When ctx ends
// (between configurations or inside one), BenchCollective stops within a
// layer-step and returns an error wrapping ctx's.
func BenchCollective(ctx context.Context, cfg BenchConfig, emit func(BenchResult) error) error {
	if emit == nil {
		return errors.New("bench collective: nil emit")
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	for _, n := range cfg.Shards {
		for _, b := range cfg.Batches {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("bench collective: %w", err)
			}
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "bench collective: shards %d batch %d: %d + %d layer-steps over %s\n",
					n, b, cfg.Warmup, cfg.Steps, cfg.Transport)
			}
			r, err := benchOne(ctx, cfg, n, b)
			if cerr := ctx.Err(); err != nil && cerr != nil {
				// The ranks' errors (aborts from peers, say) only name it.
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("bench collective shards=%d batch=%d: %w", n, b, err)
			}
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	return nil
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

// benchRank is one rank's data and measurements in one configuration.
type benchRank struct {
	rank    int
	local   [][]Candidate
	budgets []int // K for every row; shared by the ranks of a process, read only
	o, lse  []float32
	o0, l0  []float32 // the root's input, restored before every merge; nil on the other ranks
	// The baseline's messages: as long as this rank's select frame and
	// state frame.
	selMsg, mrgMsg []byte
	// per step (warm-up included), nanoseconds on the loop's clock
	selStart, selEnd, mrgStart, mrgEnd   []int64
	bsStart, bsEnd, bmStart, bmEnd       []int64 // the baseline of the select, of the merge
	ppStart, ppEnd                       []int64 // the ping-pong
	selBytes, mrgBytes, selMsgs, mrgMsgs int64   // over the measured steps
	bsBytes, bmBytes, bsMsgs, bmMsgs     int64
}

// newBenchRanks makes the data of the configuration (n ranks, batch) for
// the ranks keep accepts, nil for the others. Every rank's data are drawn
// from one generator in rank order, the draws of the ranks not kept made
// and dropped, so that a rank's data are the same whether it is made alone
// (BenchRank, one process per rank) or with all the others
// (BenchCollective).
func newBenchRanks(cfg BenchConfig, n, batch int, keep func(r int) bool) []*benchRank {
	rows, states, d, k := batch*cfg.KVHeads, batch*cfg.QHeads, cfg.HeadDim, cfg.PageBudget
	total := cfg.Warmup + cfg.Steps
	budgets := make([]int, rows)
	for i := range budgets {
		budgets[i] = k
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(n)<<32|uint64(batch)))
	ranks := make([]*benchRank, n)
	for r := range n {
		kept := keep(r)
		var br *benchRank
		if kept {
			br = &benchRank{
				rank: r, budgets: budgets,
				local: make([][]Candidate, rows),
				o:     make([]float32, states*d), lse: make([]float32, states),
				selStart: make([]int64, total), selEnd: make([]int64, total),
				mrgStart: make([]int64, total), mrgEnd: make([]int64, total),
				bsStart: make([]int64, total), bsEnd: make([]int64, total),
				bmStart: make([]int64, total), bmEnd: make([]int64, total),
				ppStart: make([]int64, total), ppEnd: make([]int64, total),
				mrgMsg: make([]byte, stateFrameLen(states, d)),
			}
		}
		var mine []int32
		for p := r; p < cfg.Pages; p += n {
			mine = append(mine, int32(p))
		}
		for row := range rows {
			rng.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
			m := min(k, len(mine))
			var c []Candidate
			if kept {
				c = make([]Candidate, m)
			}
			for i := range m {
				score := float32(rng.NormFloat64())
				if kept {
					c[i] = Candidate{Score: score, Page: mine[i]}
				}
			}
			if kept {
				// Best first, as the shard's candidates come from the
				// CPU backend (the draws are the same in any order).
				slices.SortFunc(c, plan.Compare)
				br.local[row] = c
			}
		}
		if !kept {
			for range states*d + states { // the o and lse draws below
				rng.Float64()
			}
			continue
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
		br.selMsg = make([]byte, selectFrameLen(br.local))
		ranks[r] = br
	}
	return ranks
}

// benchLoop is the measured loop of one rank, the same whether the ranks
// are goroutines of one process (BenchCollective) or processes
// (BenchRank): Warmup + Steps layer-steps, each a SelectExactUnordered and a Reduce
// to rank 0 over ct, then their baselines (plainAllGather of the select
// frame's bytes, plainGather of the state frame's) and a pingPong. Before
// each operation it waits at meet (not timed); it reads the operation's
// start and end on now's clock and counts what ct sent during the
// measured steps.
func benchLoop(ctx context.Context, cfg BenchConfig, ct *countingTransport, br *benchRank, meet func(step int, op Op) error, now func() int64) error {
	g := NewGroup(ct)
	var dst [][]int32
	for s := range cfg.Warmup + cfg.Steps {
		if err := meet(s, OpSelect); err != nil {
			return err
		}
		b0, m0 := ct.bytes.Load(), ct.msgs.Load()
		br.selStart[s] = now()
		var err error
		dst, err = g.SelectExactUnordered(ctx, MakeTag(uint64(s), 0, OpSelect), br.local, br.budgets, dst)
		br.selEnd[s] = now()
		if err != nil {
			return err
		}
		b1, m1 := ct.bytes.Load(), ct.msgs.Load()
		if br.o0 != nil {
			copy(br.o, br.o0)
			copy(br.lse, br.l0)
		}
		if err := meet(s, OpReduce); err != nil {
			return err
		}
		br.mrgStart[s] = now()
		err = g.Reduce(ctx, MakeTag(uint64(s), 0, OpReduce), 0, cfg.HeadDim, br.o, br.lse)
		br.mrgEnd[s] = now()
		if err != nil {
			return err
		}
		b2, m2 := ct.bytes.Load(), ct.msgs.Load()

		// The baselines: the same bytes as plain rounds.
		if err := meet(s, opBaseGather); err != nil {
			return err
		}
		br.bsStart[s] = now()
		err = plainAllGather(ctx, ct, MakeTag(uint64(s), 0, opBaseGather), br.selMsg)
		br.bsEnd[s] = now()
		if err != nil {
			return fmt.Errorf("baseline of the select: %w", err)
		}
		b3, m3 := ct.bytes.Load(), ct.msgs.Load()
		if err := meet(s, opBaseRoot); err != nil {
			return err
		}
		br.bmStart[s] = now()
		err = plainGather(ctx, ct, MakeTag(uint64(s), 0, opBaseRoot), br.mrgMsg)
		br.bmEnd[s] = now()
		if err != nil {
			return fmt.Errorf("baseline of the merge: %w", err)
		}
		b4, m4 := ct.bytes.Load(), ct.msgs.Load()
		if err := meet(s, opPingPong); err != nil {
			return err
		}
		br.ppStart[s] = now()
		err = pingPong(ctx, ct, MakeTag(uint64(s), 0, opPingPong), br.selMsg)
		br.ppEnd[s] = now()
		if err != nil {
			return fmt.Errorf("ping-pong: %w", err)
		}
		if s >= cfg.Warmup {
			br.selBytes += b1 - b0
			br.selMsgs += m1 - m0
			br.mrgBytes += b2 - b1
			br.mrgMsgs += m2 - m1
			br.bsBytes += b3 - b2
			br.bsMsgs += m3 - m2
			br.bmBytes += b4 - b3
			br.bmMsgs += m4 - m3
		}
	}
	return nil
}

// samples returns what br measured in the measured steps.
func (br *benchRank) samples(cfg BenchConfig) BenchSamples {
	w := cfg.Warmup
	base := br.selStart[w]
	rel := func(xs []int64) []int64 {
		out := make([]int64, len(xs)-w)
		for i, x := range xs[w:] {
			out[i] = x - base
		}
		return out
	}
	return BenchSamples{
		Rank: br.rank, BaseNS: base,
		SelectStart: rel(br.selStart), SelectEnd: rel(br.selEnd),
		MergeStart: rel(br.mrgStart), MergeEnd: rel(br.mrgEnd),
		BaselineStart: rel(br.bsStart), BaselineEnd: rel(br.bsEnd),
		MergeBaselineStart: rel(br.bmStart), MergeBaselineEnd: rel(br.bmEnd),
		PingPongStart: rel(br.ppStart), PingPongEnd: rel(br.ppEnd),
		SelectBytes: br.selBytes, SelectMsgs: br.selMsgs,
		MergeBytes: br.mrgBytes, MergeMsgs: br.mrgMsgs,
		BaselineBytes: br.bsBytes, BaselineMsgs: br.bsMsgs,
		MergeBaselineBytes: br.bmBytes, MergeBaselineMsgs: br.bmMsgs,
		PingPongBytes: int64(len(br.selMsg)),
	}
}

// errBarrierBroken is what an in-process rank's barrier returns once
// another rank failed (and recorded the error that counts).
var errBarrierBroken = errors.New("bench collective: barrier broken")

func benchOne(ctx context.Context, cfg BenchConfig, n, batch int) (BenchResult, error) {
	var trs []Transport
	if cfg.NewTransports != nil {
		var err error
		if trs, err = cfg.NewTransports(n); err != nil {
			return BenchResult{}, err
		}
		if len(trs) != n {
			return BenchResult{}, fmt.Errorf("transport factory returned %d members, want %d", len(trs), n)
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
	ranks := newBenchRanks(cfg, n, batch, func(int) bool { return true })

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bar := newBarrier(n)
	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) }
	meet := func(int, Op) error {
		if !bar.wait() {
			return errBarrierBroken
		}
		return nil
	}
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for r := range n {
		wg.Go(func() {
			if err := benchLoop(ctx, cfg, cts[r], ranks[r], meet, now); err != nil {
				errOnce.Do(func() { firstErr = err })
				cancel()
				bar.breakAll()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return BenchResult{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return BenchResult{}, err
	}
	samples := make([]BenchSamples, n)
	for r, br := range ranks {
		samples[r] = br.samples(cfg)
	}
	res, err := BenchCombine(cfg, batch, samples)
	res.Processes = 1
	return res, err
}

// BenchSamples is what one rank measured in one configuration of the
// benchmark: the start and end of each measured step's selection and
// merge, in nanoseconds after BaseNS on the rank's clock, and what it sent.
// BenchRank returns it (a process per rank sends it to the one that
// combines them); BenchCombine turns all ranks' into a BenchResult.
type BenchSamples struct {
	Rank int `json:"rank"`
	// BaseNS is the clock reading the times count from: the start of the
	// first measured selection. BenchRank's clock is the wall clock
	// (Unix nanoseconds), which the processes of one host share.
	BaseNS      int64   `json:"base_ns"`
	SelectStart []int64 `json:"select_start_ns"` // one per measured step
	SelectEnd   []int64 `json:"select_end_ns"`
	MergeStart  []int64 `json:"merge_start_ns"`
	MergeEnd    []int64 `json:"merge_end_ns"`
	// The baseline rounds' times, likewise (see BenchResult).
	BaselineStart      []int64 `json:"baseline_start_ns"`
	BaselineEnd        []int64 `json:"baseline_end_ns"`
	MergeBaselineStart []int64 `json:"merge_baseline_start_ns"`
	MergeBaselineEnd   []int64 `json:"merge_baseline_end_ns"`
	PingPongStart      []int64 `json:"pingpong_start_ns"`
	PingPongEnd        []int64 `json:"pingpong_end_ns"`
	// Bytes and messages the rank sent over all measured steps.
	SelectBytes        int64 `json:"select_bytes"`
	SelectMsgs         int64 `json:"select_msgs"`
	MergeBytes         int64 `json:"merge_bytes"`
	MergeMsgs          int64 `json:"merge_msgs"`
	BaselineBytes      int64 `json:"baseline_bytes"`
	BaselineMsgs       int64 `json:"baseline_msgs"`
	MergeBaselineBytes int64 `json:"merge_baseline_bytes"`
	MergeBaselineMsgs  int64 `json:"merge_baseline_msgs"`
	// PingPongBytes is the length of the ping-pong's message.
	PingPongBytes int64 `json:"pingpong_bytes"`
}

// barrierLayer is the layer of the tags of BenchRank's barriers; the
// measured operations use layer 0.
const barrierLayer = 1

// BenchRank runs one rank's part of one configuration of BenchCollective
// (t.Size() ranks, batch) over t, whose other members run BenchRank in
// other processes: the same data and the same measured loop as the
// goroutines of BenchCollective. cfg's Shards, Batches, Transport and
// NewTransports are ignored; its sizes must be valid, and MaxMemory bounds
// the group's data as in BenchCollective (for one rank that is
// conservative).
//
// Before each operation the ranks meet at a barrier over t (every rank
// reports to rank 0, which answers them all; one-byte messages under tags
// of a layer the operations do not use, not counted, not timed). Its exit
// is not simultaneous: rank 0 leaves it about one message latency before
// the others, and that spread is part of the measured latency, as the
// wake-up spread of BenchCollective's in-process barrier is. Step times
// are read from the wall clock, which all processes of one host share;
// BenchCombine compares the ranks' times directly, so ranks on different
// hosts compare only as well as their clocks agree.
//
// When ctx ends, BenchRank returns within a layer-step with an error
// wrapping ctx's.
func BenchRank(ctx context.Context, cfg BenchConfig, batch int, t Transport) (BenchSamples, error) {
	n, rank := t.Size(), t.Rank()
	c := cfg
	c.Shards, c.Batches = []int{n}, []int{batch}
	if err := c.validateSizes(); err != nil {
		return BenchSamples{}, err
	}
	if err := checkRank(rank, n); err != nil {
		return BenchSamples{}, fmt.Errorf("bench collective: %w", err)
	}
	if err := memlimit.Check("bench collective data", c.MemoryBytes(), c.MaxMemory); err != nil {
		return BenchSamples{}, err
	}
	br := newBenchRanks(c, n, batch, func(r int) bool { return r == rank })[rank]
	ct := &countingTransport{Transport: t}
	meet := func(s int, op Op) error {
		if err := transportBarrier(ctx, t, MakeTag(uint64(s), barrierLayer, op)); err != nil {
			return fmt.Errorf("step %d: barrier before %v: %w", s, op, err)
		}
		return nil
	}
	now := func() int64 { return time.Now().UnixNano() }
	if err := benchLoop(ctx, c, ct, br, meet, now); err != nil {
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%v)", cerr, err)
		}
		return BenchSamples{}, fmt.Errorf("bench collective rank %d of %d batch=%d: %w", rank, n, batch, err)
	}
	return br.samples(c), nil
}

// transportBarrier returns once every rank of t has called it with tag:
// the ranks report to rank 0, which then answers each of them.
func transportBarrier(ctx context.Context, t Transport, tag uint64) error {
	n := t.Size()
	msg := []byte{1}
	if t.Rank() != 0 {
		if err := t.Send(ctx, 0, tag, msg); err != nil {
			return &RankError{Rank: 0, Err: err}
		}
		if _, err := t.Recv(ctx, 0, tag); err != nil {
			return &RankError{Rank: 0, Err: err}
		}
		return nil
	}
	for r := 1; r < n; r++ {
		if _, err := t.Recv(ctx, r, tag); err != nil {
			return &RankError{Rank: r, Err: err}
		}
	}
	for r := 1; r < n; r++ {
		if err := t.Send(ctx, r, tag, msg); err != nil {
			return &RankError{Rank: r, Err: err}
		}
	}
	return nil
}

// BenchCombine returns the BenchResult of one configuration of cfg
// (len(samples) ranks, batch) from every rank's samples, in any order,
// exactly as BenchCollective computes it for its goroutines (see
// BenchResult). Every rank 0..len(samples)-1 must be there once, with
// cfg.Steps samples of each kind. Processes is left 0 for the caller.
func BenchCombine(cfg BenchConfig, batch int, samples []BenchSamples) (BenchResult, error) {
	n := len(samples)
	if n == 0 {
		return BenchResult{}, errors.New("bench collective: no samples")
	}
	if cfg.Steps < 1 {
		return BenchResult{}, checkRange("Steps", cfg.Steps, 1, MaxBenchSteps, "")
	}
	byRank := make([]*BenchSamples, n)
	for i := range samples {
		s := &samples[i]
		if s.Rank < 0 || s.Rank >= n || byRank[s.Rank] != nil {
			return BenchResult{}, fmt.Errorf("bench collective: samples of rank %d: want each of ranks 0 to %d once", s.Rank, n-1)
		}
		for _, xs := range [][]int64{s.SelectStart, s.SelectEnd, s.MergeStart, s.MergeEnd,
			s.BaselineStart, s.BaselineEnd, s.MergeBaselineStart, s.MergeBaselineEnd, s.PingPongStart, s.PingPongEnd} {
			if len(xs) != cfg.Steps {
				return BenchResult{}, fmt.Errorf("bench collective: rank %d has %d samples, want %d (steps)", s.Rank, len(xs), cfg.Steps)
			}
		}
		byRank[s.Rank] = s
	}
	rows, states := batch*cfg.KVHeads, batch*cfg.QHeads
	res := BenchResult{
		Shards: n, Batch: batch, Transport: cfg.Transport, Steps: cfg.Steps,
		Rows: rows, K: cfg.PageBudget, States: states, HeadDim: cfg.HeadDim,
	}
	var sel, mrg, skew, bskew, bs, bm, pp []float64
	for s := range cfg.Steps {
		sel = append(sel, groupLatencyUS(byRank, s, func(b *BenchSamples) ([]int64, []int64) { return b.SelectStart, b.SelectEnd }))
		mrg = append(mrg, groupLatencyUS(byRank, s, func(b *BenchSamples) ([]int64, []int64) { return b.MergeStart, b.MergeEnd }))
		skew = append(skew, groupLatencyUS(byRank, s, func(b *BenchSamples) ([]int64, []int64) { return b.SelectStart, b.SelectStart }))
		bskew = append(bskew, groupLatencyUS(byRank, s, func(b *BenchSamples) ([]int64, []int64) { return b.BaselineStart, b.BaselineStart }))
		bs = append(bs, groupLatencyUS(byRank, s, func(b *BenchSamples) ([]int64, []int64) { return b.BaselineStart, b.BaselineEnd }))
		bm = append(bm, groupLatencyUS(byRank, s, func(b *BenchSamples) ([]int64, []int64) { return b.MergeBaselineStart, b.MergeBaselineEnd }))
		// Rank 0 times the round trip alone.
		pp = append(pp, groupLatencyUS(byRank[:1], s, func(b *BenchSamples) ([]int64, []int64) { return b.PingPongStart, b.PingPongEnd }))
	}
	for _, b := range byRank {
		res.SelectBytes += b.SelectBytes
		res.SelectMsgs += b.SelectMsgs
		res.MergeBytes += b.MergeBytes
		res.MergeMsgs += b.MergeMsgs
		res.BaselineBytes += b.BaselineBytes
		res.BaselineMsgs += b.BaselineMsgs
		res.MergeBaselineBytes += b.MergeBaselineBytes
		res.MergeBaselineMsgs += b.MergeBaselineMsgs
	}
	steps := int64(cfg.Steps)
	res.SelectBytes, res.SelectMsgs = res.SelectBytes/steps, res.SelectMsgs/steps
	res.MergeBytes, res.MergeMsgs = res.MergeBytes/steps, res.MergeMsgs/steps
	res.BaselineBytes, res.BaselineMsgs = res.BaselineBytes/steps, res.BaselineMsgs/steps
	res.MergeBaselineBytes, res.MergeBaselineMsgs = res.MergeBaselineBytes/steps, res.MergeBaselineMsgs/steps
	for _, xs := range [][]float64{sel, mrg, skew, bskew, bs, bm, pp} {
		slices.Sort(xs)
	}
	res.SelectP50, res.SelectP95, res.SelectP99, res.SelectMax = quantile(sel, 0.50), quantile(sel, 0.95), quantile(sel, 0.99), sel[len(sel)-1]
	res.MergeP50, res.MergeP95, res.MergeP99, res.MergeMax = quantile(mrg, 0.50), quantile(mrg, 0.95), quantile(mrg, 0.99), mrg[len(mrg)-1]
	res.StartSkewP50, res.BaselineStartSkewP50 = quantile(skew, 0.50), quantile(bskew, 0.50)
	res.BaselineP50, res.BaselineP99 = quantile(bs, 0.50), quantile(bs, 0.99)
	res.MergeBaselineP50, res.MergeBaselineP99 = quantile(bm, 0.50), quantile(bm, 0.99)
	res.OverheadVsBaseline = ratio(res.SelectP50, res.BaselineP50)
	res.MergeOverheadVsBaseline = ratio(res.MergeP50, res.MergeBaselineP50)
	if n > 1 {
		res.PingPongP50, res.PingPongP99 = quantile(pp, 0.50), quantile(pp, 0.99)
		res.PingPongBytes = byRank[0].PingPongBytes
	}
	if res.SelectP50 < 0 || res.MergeP50 < 0 || res.BaselineP50 < 0 || res.MergeBaselineP50 < 0 || res.PingPongP50 < 0 {
		return res, errors.New("negative latency (clock)")
	}
	return res, nil
}

// ratio is a / b, or 0 when b is not positive (a baseline too fast for
// the clock).
func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// groupLatencyUS is max over ranks of the end minus min over ranks of the
// start of measured step s, in microseconds.
func groupLatencyUS(ranks []*BenchSamples, s int, f func(*BenchSamples) ([]int64, []int64)) float64 {
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for _, b := range ranks {
		st, en := f(b)
		lo, hi = min(lo, b.BaseNS+st[s]), max(hi, b.BaseNS+en[s])
	}
	return float64(hi-lo) / 1e3
}

// quantile returns the nearest-rank q-quantile of sorted xs.
func quantile(xs []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
