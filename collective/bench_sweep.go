package collective

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
)

// Limits of a SweepConfig.
const (
	// MaxSweepBytes is the largest all-gather size of a sweep (MinBytes,
	// MaxBytes): 1 GiB in total over the ranks.
	MaxSweepBytes = 1 << 30
	// MaxSweepFactor is the largest Factor; the smallest is 2.
	MaxSweepFactor = 1024
)

// SweepConfig configures BenchSweep (questctl bench collective
// --min-bytes --max-bytes --factor): a message-size sweep of the plain
// all-gather of opaque bytes, as NVIDIA's nccl-tests all_gather_perf
// runs one (-b -e -f). Start from DefaultSweepConfig; Validate refuses
// what is out of range.
type SweepConfig struct {
	// Shards are the group sizes N to run, each in [1, MaxBenchShards].
	Shards []int
	// MinBytes and MaxBytes bound the sizes, in [1, MaxSweepBytes] with
	// MinBytes <= MaxBytes. Default 8 and 16 MiB.
	MinBytes, MaxBytes int64
	// Factor multiplies each size to give the next, in [2,
	// MaxSweepFactor]. Default 2.
	Factor int
	// Steps and Warmup are the measured and unmeasured all-gathers of
	// every size, as in BenchConfig.
	Steps, Warmup int
	// Transport and NewTransports are as in BenchConfig. NewTransports
	// must accept messages of MaxMsgBytes.
	Transport     string
	NewTransports func(n int) ([]Transport, error)
	// MaxMemory bounds the heap the sweep may need (MemoryBytes), as in
	// BenchConfig.
	MaxMemory int64
	// Progress, when set, receives one line as each group size starts.
	Progress io.Writer
}

// DefaultSweepConfig returns the defaults documented on SweepConfig,
// with BenchConfig's shards, steps, warm-up and transport.
func DefaultSweepConfig() SweepConfig {
	b := DefaultBenchConfig()
	return SweepConfig{
		Shards: b.Shards, MinBytes: 8, MaxBytes: 16 << 20, Factor: 2,
		Steps: b.Steps, Warmup: b.Warmup, Transport: b.Transport, MaxMemory: b.MaxMemory,
	}
}

// Sizes are the all-gather sizes of the sweep: MinBytes, then each times
// Factor while it is at most MaxBytes.
func (c SweepConfig) Sizes() []int64 {
	var out []int64
	if c.MinBytes < 1 || c.Factor < 2 {
		return nil
	}
	for s := c.MinBytes; s <= c.MaxBytes; s *= int64(c.Factor) {
		out = append(out, s)
		if s > math.MaxInt64/int64(c.Factor) {
			break
		}
	}
	return out
}

// SweepMsgBytes is what each of n ranks contributes to an all-gather of
// size bytes: size/n, at least 1 (nccl-tests likewise rounds the count
// down to a multiple of the ranks). The all-gather's actual size is n
// times that.
func SweepMsgBytes(size int64, n int) int64 {
	return max(1, size/int64(n))
}

// MsgSizes are the distinct per-rank message sizes of the sweep for n
// ranks, ascending (sizes that round to the same message run once).
func (c SweepConfig) MsgSizes(n int) []int64 {
	var out []int64
	for _, s := range c.Sizes() {
		if m := SweepMsgBytes(s, n); len(out) == 0 || out[len(out)-1] != m {
			out = append(out, m)
		}
	}
	return out
}

// MaxMsgBytes is the largest message of the sweep: MaxBytes over the
// smallest group, at least 1.
func (c SweepConfig) MaxMsgBytes() int64 {
	if len(c.Shards) == 0 {
		return max(1, c.MaxBytes)
	}
	return SweepMsgBytes(c.MaxBytes, max(1, slices.Min(c.Shards)))
}

// Validate reports whether c is usable: every size in its range (a
// *BenchRangeError naming the first field that is not: "MinBytes",
// "MaxBytes", "Factor", "Shards", "Steps", "Warmup"; MinBytes above
// MaxBytes is a range error on MinBytes with Limit "MaxBytes"), a known
// transport and the heap within MaxMemory. It allocates nothing.
func (c SweepConfig) Validate() error {
	for _, f := range []struct {
		name      string
		v, lo, hi int64
	}{
		{"Factor", int64(c.Factor), 2, MaxSweepFactor},
		{"MinBytes", c.MinBytes, 1, MaxSweepBytes},
		{"MaxBytes", c.MaxBytes, 1, MaxSweepBytes},
	} {
		if err := checkRange(f.name, int(f.v), int(f.lo), int(f.hi), ""); err != nil {
			return err
		}
	}
	if c.MinBytes > c.MaxBytes {
		return &BenchRangeError{Field: "MinBytes", Value: int(c.MinBytes), Min: 1, Max: int(c.MaxBytes), Limit: "MaxBytes"}
	}
	if len(c.Shards) == 0 {
		return errors.New("bench collective sweep: want at least one group size")
	}
	for _, n := range c.Shards {
		if err := checkRange("Shards", n, 1, MaxBenchShards, ""); err != nil {
			return err
		}
	}
	if err := checkRange("Steps", c.Steps, 1, MaxBenchSteps, ""); err != nil {
		return err
	}
	if err := checkRange("Warmup", c.Warmup, 0, MaxBenchSteps, ""); err != nil {
		return err
	}
	switch {
	case c.Transport == "":
		return errors.New("bench collective sweep: no transport named (want inproc)")
	case c.Transport != "inproc" && c.NewTransports == nil:
		return fmt.Errorf("bench collective sweep: unknown transport %q (only inproc is built in)", c.Transport)
	}
	return memlimit.Check("bench collective sweep data", c.MemoryBytes(), c.MaxMemory)
}

// MemoryBytes returns the heap the sweep needs for its largest (group
// size, message) pair: every rank's message and the N-1 it receives, and
// as much again for the copies a transport makes on the way (gRPC's
// frames), twice over for the collector (see BenchConfig.MemoryBytes),
// plus the timestamps and stacks. -1 when it overflows.
func (c SweepConfig) MemoryBytes() int64 {
	mul, add := memlimit.Mul, memlimit.Add
	var need int64
	for _, n := range c.Shards {
		if n < 1 {
			return -1
		}
		m := SweepMsgBytes(c.MaxBytes, n)
		steps := add(int64(c.Steps), int64(c.Warmup))
		nb := mul(add(
			mul(int64(n), int64(n), m, 2),
			mul(int64(n), steps, 16),
			mul(int64(n), 8<<10),
		), 2)
		if nb < 0 {
			return -1
		}
		need = max(need, nb)
	}
	return need
}

// SweepResult is one (group size, message size) of a sweep, with the
// columns of nccl-tests: Bytes is the all-gather's size (all ranks'
// messages together, as nccl-tests' size column), TimeUS the mean group
// latency of one all-gather, AlgBW = Bytes / TimeUS and BusBW = AlgBW *
// (N-1)/N in GB/s (1e9 bytes per second). Latencies are group latencies
// as in BenchResult (first rank in to last rank out, after a barrier that
// is not timed), where nccl-tests times back-to-back iterations on each
// rank; SentBytes and SentMsgs are the payloads all ranks handed to
// Transport.Send per all-gather.
type SweepResult struct {
	Op        string  `json:"op"` // "allgather"
	Shards    int     `json:"shards"`
	Transport string  `json:"transport"`
	Steps     int     `json:"steps"`
	Bytes     int64   `json:"bytes"`
	MsgBytes  int64   `json:"msg_bytes"` // each rank's part
	TimeUS    float64 `json:"time_us"`
	P50       float64 `json:"p50_us"`
	P99       float64 `json:"p99_us"`
	Max       float64 `json:"max_us"`
	AlgBW     float64 `json:"algbw_gbps"`
	BusBW     float64 `json:"busbw_gbps"`
	SentBytes int64   `json:"sent_bytes"`
	SentMsgs  int64   `json:"sent_msgs"`
	Processes int     `json:"processes"`
}

// SweepSamples is what one rank measured in a sweep for one group size:
// a SweepSizeSamples per message size of MsgSizes, in that order.
type SweepSamples struct {
	Rank  int                `json:"rank"`
	Sizes []SweepSizeSamples `json:"sizes"`
}

// SweepSizeSamples are one rank's times of one message size: the start
// and end of each measured all-gather, in nanoseconds after BaseNS on the
// rank's clock, and what it sent over them.
type SweepSizeSamples struct {
	MsgBytes  int64   `json:"msg_bytes"`
	BaseNS    int64   `json:"base_ns"`
	Start     []int64 `json:"start_ns"`
	End       []int64 `json:"end_ns"`
	SentBytes int64   `json:"sent_bytes"`
	SentMsgs  int64   `json:"sent_msgs"`
}

// sweepLoop is the measured loop of one rank for one group size, the
// same on goroutines (BenchSweep) and processes (SweepRank): for each
// message size, Warmup + Steps plain all-gathers over ct, each after
// meet (not timed).
func sweepLoop(ctx context.Context, cfg SweepConfig, ct *countingTransport, meet func(step int) error, now func() int64) (SweepSamples, error) {
	sizes := cfg.MsgSizes(ct.Size())
	out := SweepSamples{Rank: ct.Rank(), Sizes: make([]SweepSizeSamples, len(sizes))}
	step := 0 // over all sizes: every all-gather has its own tag
	total := cfg.Warmup + cfg.Steps
	for i, m := range sizes {
		msg := make([]byte, m)
		start, end := make([]int64, total), make([]int64, total)
		var sent, msgs int64
		for s := range total {
			if err := meet(step); err != nil {
				return out, err
			}
			b0, m0 := ct.bytes.Load(), ct.msgs.Load()
			start[s] = now()
			err := plainAllGather(ctx, ct, MakeTag(uint64(step), 0, opSweep), msg)
			end[s] = now()
			if err != nil {
				return out, fmt.Errorf("all-gather of %d bytes per rank: %w", m, err)
			}
			if s >= cfg.Warmup {
				sent += ct.bytes.Load() - b0
				msgs += ct.msgs.Load() - m0
			}
			step++
		}
		w := cfg.Warmup
		base := start[w]
		rel := func(xs []int64) []int64 {
			r := make([]int64, len(xs)-w)
			for j, x := range xs[w:] {
				r[j] = x - base
			}
			return r
		}
		out.Sizes[i] = SweepSizeSamples{MsgBytes: m, BaseNS: base, Start: rel(start), End: rel(end), SentBytes: sent, SentMsgs: msgs}
	}
	return out, nil
}

// BenchSweep runs the sweep of cfg on goroutines: for every group size N
// (in order), one group of N transports and, for every message size of
// MsgSizes(N), Warmup + Steps plain all-gathers. emit receives each
// (N, size) result once N's sweep is done, on the calling goroutine; an
// error from emit is returned as is. When ctx ends, BenchSweep stops
// within an all-gather and returns an error wrapping ctx's.
func BenchSweep(ctx context.Context, cfg SweepConfig, emit func(SweepResult) error) error {
	if emit == nil {
		return errors.New("bench collective sweep: nil emit")
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	for _, n := range cfg.Shards {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("bench collective sweep: %w", err)
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "bench collective: all-gather sweep, shards %d: %d sizes, %d + %d rounds each over %s\n",
				n, len(cfg.MsgSizes(n)), cfg.Warmup, cfg.Steps, cfg.Transport)
		}
		samples, err := sweepOne(ctx, cfg, n)
		if cerr := ctx.Err(); err != nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("bench collective sweep shards=%d: %w", n, err)
		}
		res, err := SweepCombine(cfg, samples)
		if err != nil {
			return fmt.Errorf("bench collective sweep shards=%d: %w", n, err)
		}
		for _, r := range res {
			r.Processes = 1
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	return nil
}

func sweepOne(ctx context.Context, cfg SweepConfig, n int) ([]SweepSamples, error) {
	var trs []Transport
	if cfg.NewTransports != nil {
		var err error
		if trs, err = cfg.NewTransports(n); err != nil {
			return nil, err
		}
		if len(trs) != n {
			for _, t := range trs {
				t.Close()
			}
			return nil, fmt.Errorf("transport factory returned %d members, want %d", len(trs), n)
		}
	} else {
		trs = NewInprocGroup(n)
	}
	defer func() {
		for _, t := range trs {
			t.Close()
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bar := newBarrier(n)
	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) }
	meet := func(int) error {
		if !bar.wait() {
			return errBarrierBroken
		}
		return nil
	}
	out := make([]SweepSamples, n)
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for r := range n {
		wg.Go(func() {
			s, err := sweepLoop(ctx, cfg, &countingTransport{Transport: trs[r]}, meet, now)
			if err != nil {
				errOnce.Do(func() { firstErr = err })
				cancel()
				bar.breakAll()
				return
			}
			out[r] = s
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return out, ctx.Err()
}

// SweepRank runs one rank's part of the sweep of cfg for the group of t
// (t.Size() ranks) over t, whose other members run SweepRank in other
// processes; the ranks meet at a barrier over t before every all-gather,
// as BenchRank's do. cfg's Shards, Transport and NewTransports are
// ignored; MaxMemory bounds the group's data. Times are wall-clock
// nanoseconds (see BenchRank).
func SweepRank(ctx context.Context, cfg SweepConfig, t Transport) (SweepSamples, error) {
	n, rank := t.Size(), t.Rank()
	c := cfg
	c.Shards, c.Transport, c.NewTransports = []int{n}, "inproc", nil
	if err := c.Validate(); err != nil {
		return SweepSamples{}, err
	}
	if err := checkRank(rank, n); err != nil {
		return SweepSamples{}, fmt.Errorf("bench collective sweep: %w", err)
	}
	meet := func(s int) error {
		if err := transportBarrier(ctx, t, MakeTag(uint64(s), barrierLayer, opSweep)); err != nil {
			return fmt.Errorf("round %d: barrier: %w", s, err)
		}
		return nil
	}
	now := func() int64 { return time.Now().UnixNano() }
	s, err := sweepLoop(ctx, c, &countingTransport{Transport: t}, meet, now)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%v)", cerr, err)
		}
		return SweepSamples{}, fmt.Errorf("bench collective sweep rank %d of %d: %w", rank, n, err)
	}
	return s, nil
}

// SweepCombine returns the results of one group size of a sweep from
// every rank's samples (len(samples) ranks, in any order), one per
// message size of cfg.MsgSizes(len(samples)). Processes is left 0.
func SweepCombine(cfg SweepConfig, samples []SweepSamples) ([]SweepResult, error) {
	n := len(samples)
	if n == 0 {
		return nil, errors.New("bench collective sweep: no samples")
	}
	sizes := cfg.MsgSizes(n)
	byRank := make([]*SweepSamples, n)
	for i := range samples {
		s := &samples[i]
		if s.Rank < 0 || s.Rank >= n || byRank[s.Rank] != nil {
			return nil, fmt.Errorf("bench collective sweep: samples of rank %d: want each of ranks 0 to %d once", s.Rank, n-1)
		}
		if len(s.Sizes) != len(sizes) {
			return nil, fmt.Errorf("bench collective sweep: rank %d has %d sizes, want %d", s.Rank, len(s.Sizes), len(sizes))
		}
		for j, z := range s.Sizes {
			if z.MsgBytes != sizes[j] || len(z.Start) != cfg.Steps || len(z.End) != cfg.Steps {
				return nil, fmt.Errorf("bench collective sweep: rank %d size %d: %d bytes, %d samples; want %d bytes, %d samples (steps)",
					s.Rank, j, z.MsgBytes, len(z.Start), sizes[j], cfg.Steps)
			}
		}
		byRank[s.Rank] = s
	}
	out := make([]SweepResult, len(sizes))
	for j, m := range sizes {
		lat := make([]float64, cfg.Steps)
		var sum float64
		for s := range cfg.Steps {
			lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
			for _, b := range byRank {
				z := &b.Sizes[j]
				lo, hi = min(lo, z.BaseNS+z.Start[s]), max(hi, z.BaseNS+z.End[s])
			}
			lat[s] = float64(hi-lo) / 1e3
			sum += lat[s]
		}
		slices.Sort(lat)
		r := SweepResult{
			Op: "allgather", Shards: n, Transport: cfg.Transport, Steps: cfg.Steps,
			Bytes: m * int64(n), MsgBytes: m,
			TimeUS: sum / float64(cfg.Steps), P50: quantile(lat, 0.5), P99: quantile(lat, 0.99), Max: lat[len(lat)-1],
		}
		if lat[0] < 0 {
			return nil, errors.New("negative latency (clock)")
		}
		for _, b := range byRank {
			r.SentBytes += b.Sizes[j].SentBytes
			r.SentMsgs += b.Sizes[j].SentMsgs
		}
		r.SentBytes /= int64(cfg.Steps)
		r.SentMsgs /= int64(cfg.Steps)
		if r.TimeUS > 0 {
			r.AlgBW = float64(r.Bytes) / (r.TimeUS * 1e-6) / 1e9
			r.BusBW = r.AlgBW * float64(n-1) / float64(n)
		}
		out[j] = r
	}
	return out, nil
}
