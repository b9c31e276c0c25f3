// Package bench holds the benchmark behind `questctl bench attention`
// (the CPU backend; the CUDA one lives in kernels/cuda, and `questctl bench
// collective` in package collective): one-layer Quest vs dense decode
// attention on the same data, with phase times (score, top-K, attention,
// from a run that makes them separate backend calls) next to the step as
// a server runs it, and bytes moved next to the formula rho = 1/S + K/P;
// and the benchmark behind `questctl bench selection`. Both validate their
// settings and check the memory of each configuration before allocating
// it. Results files live in bench/results/.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// AttentionConfig sizes an attention benchmark.
type AttentionConfig struct {
	Contexts []int // context lengths in tokens, 1..MaxContext; default 32768, 131072
	// Budgets are token budgets B, one page (PageSize) to MaxContext;
	// default 2048. A budget whose page count K = B/S reaches the
	// context's P pages is run with K capped at P: every step then reads
	// every page (see AttentionResult.BudgetCapped).
	Budgets  []int
	PageSize int // tokens per page S, 1..MaxPageSize; default 16
	QHeads   int // 1..MaxHeads, a multiple of KVHeads; default 32
	KVHeads  int // 1..MaxHeads; default 8
	HeadDim  int // 1..MaxHeadDim; default 128
	Batch    int // sequences per step, each of the full context, 1..MaxBatch; default 1
	Iters    int // timed steps per configuration (median reported), 1..MaxIters; default 10
	// MemoryLimit bounds the host memory of one configuration (K/V pools,
	// fill buffers, step scratch) and of the copy-bandwidth buffers: a
	// byte count, memlimit.Auto (0, the default: the memory available
	// when the configuration starts) or memlimit.NoLimit (-1). A
	// configuration over it is refused before anything is allocated.
	MemoryLimit int64
	Backend     kernels.Backend
	// Progress, when set, receives one line per phase of setup.
	Progress io.Writer
}

// DefaultAttentionConfig returns the defaults documented on the fields.
func DefaultAttentionConfig() AttentionConfig {
	return AttentionConfig{Contexts: []int{32768, 131072}, Budgets: []int{2048}, PageSize: 16, QHeads: 32, KVHeads: 8, HeadDim: 128, Batch: 1, Iters: 10}
}

// Validate reports the first setting outside its range, in one line that
// names the questctl flag and the allowed range.
func (c AttentionConfig) Validate() error {
	if len(c.Contexts) == 0 {
		return errors.New("--context: no context lengths given")
	}
	if len(c.Budgets) == 0 {
		return errors.New("--budget: no budgets given")
	}
	if err := checkShape(c.PageSize, c.QHeads, c.KVHeads, c.HeadDim); err != nil {
		return err
	}
	if err := inRange("--batch", c.Batch, 1, MaxBatch, " sequences"); err != nil {
		return err
	}
	if err := inRange("--iters", c.Iters, 1, MaxIters, ""); err != nil {
		return err
	}
	for _, n := range c.Contexts {
		if err := inRange("--context", n, 1, MaxContext, " tokens"); err != nil {
			return err
		}
		if p := pagesOf(n, c.PageSize); p > maxPages/c.Batch {
			return fmt.Errorf("--context %d x --batch %d is %d pages of %d tokens, more than the page pool's %d", n, c.Batch, int64(p)*int64(c.Batch), c.PageSize, maxPages)
		}
	}
	for _, b := range c.Budgets {
		if err := checkBudget(b, c.PageSize); err != nil {
			return err
		}
	}
	return checkLimit(c.MemoryLimit)
}

// copyBytes is the size of each buffer of the copy-bandwidth measurement.
const copyBytes = 256 << 20

// MemoryBytes returns the host bytes one configuration (context n tokens,
// c.Batch sequences) allocates: the page pool (K, V, summaries, metadata),
// the fill buffers, the queries and the scratch of the fused, phased and
// dense steps. It is -1 when the size overflows. c must be valid.
func (c AttentionConfig) MemoryBytes(n int) int64 {
	pages := int64(pagesOf(n, c.PageSize))
	st := c.storeConfig(n)
	pool, err := st.HostBytes()
	if err != nil {
		return -1
	}
	b, kvh, qh, d := int64(c.Batch), int64(c.KVHeads), int64(c.QHeads), int64(c.HeadDim)
	return memlimit.Add(pool,
		memlimit.Mul(2, int64(min(n, fillChunk)), kvh, d, 4), // FillRandom's k and v
		memlimit.Mul(b, qh, d, 4),                            // queries
		// Scores of the fused and the phased step, top-K indices,
		// candidates, selections and lists: at most 8 words per
		// (sequence, KV head, page).
		memlimit.Mul(b, pages, kvh, 4, 8),
		memlimit.Mul(int64(runtime.GOMAXPROCS(0)), pages, 4), // per-worker top-K indices
		memlimit.Mul(4, b, qh, d+1, 4),                       // outputs and LSEs
	)
}

// Preflight checks, before anything is allocated, that the copy-bandwidth
// buffers and every configuration (one context at a time, as they run)
// fit c.MemoryLimit. The errors wrap memlimit.ErrTooLarge.
func (c AttentionConfig) Preflight() error {
	if err := memlimit.Check("bench attention: the copy-bandwidth buffers", 2*copyBytes, c.MemoryLimit); err != nil {
		return err
	}
	for _, n := range c.Contexts {
		if err := c.checkMemory(n); err != nil {
			return err
		}
	}
	return nil
}

func (c AttentionConfig) checkMemory(n int) error {
	what := fmt.Sprintf("bench attention: --context %d x --batch %d (%d pages of K/V with summaries, %d KV heads, D %d, and step scratch)",
		n, c.Batch, int64(pagesOf(n, c.PageSize))*int64(c.Batch), c.KVHeads, c.HeadDim)
	return memlimit.Check(what, c.MemoryBytes(n), c.MemoryLimit)
}

// geometry is the shard geometry of the benchmark (float32 pages).
func (c AttentionConfig) geometry() plan.Geometry {
	return plan.Geometry{QHeads: c.QHeads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize, DType: plan.Float32}
}

func (c AttentionConfig) storeConfig(n int) pagestore.Config {
	return pagestore.Config{
		Layers: 1, Geometry: c.geometry(), Capacity: pagesOf(n, c.PageSize) * c.Batch,
		MemoryLimit: memlimit.NoLimit, // checked with the rest by checkMemory
	}
}

// AttentionResult is one JSON line of `questctl bench attention`.
type AttentionResult struct {
	Backend  string `json:"backend"`
	Context  int    `json:"context"`
	PageSize int    `json:"page_size"`
	Budget   int    `json:"budget"`
	Batch    int    `json:"batch"`
	QHeads   int    `json:"q_heads"`
	KVHeads  int    `json:"kv_heads"`
	HeadDim  int    `json:"head_dim"`
	// Pages is P, the pages of one sequence; KPages is the page budget K
	// = Budget/PageSize, capped at P. BudgetCapped says the cap applied:
	// the budget covers the context, so the Quest step reads every page
	// (it is dense attention) and rho_formula is 1/S + 1.
	Pages        int     `json:"pages"`
	KPages       int     `json:"k_pages"`
	BudgetCapped bool    `json:"budget_capped"`
	DenseUS      float64 `json:"dense_us"`
	// QuestUS is the Quest step as a server runs it (on a backend that
	// fuses score, top-K and attention, one backend call), median wall
	// time.
	QuestUS float64 `json:"quest_us"`
	// PhasedUS is the same step run as three backend calls (score, top-K,
	// attention) in a run of its own, median wall time; ScoreUS, TopKUS
	// and AttendUS are the medians of its phases.
	PhasedUS   float64 `json:"phased_us"`
	ScoreUS    float64 `json:"score_us"`
	TopKUS     float64 `json:"topk_us"`
	AttendUS   float64 `json:"attend_us"`
	Speedup    float64 `json:"speedup"` // DenseUS / QuestUS
	BytesRead  int64   `json:"bytes_read"`
	BytesDense int64   `json:"bytes_dense"`
	RhoBytes   float64 `json:"rho_measured"`
	RhoFormula float64 `json:"rho_formula"` // 1/S + K/P, K capped at P
	DenseGBps  float64 `json:"dense_gbps"`
	CopyGBps   float64 `json:"copy_gbps"`
	Iters      int     `json:"iters"`
}

// Attention runs the benchmark and calls emit once per configuration, as
// soon as it is measured. It validates cfg and checks the memory of every
// configuration first (see Preflight), and each one again right before it
// is allocated, after the previous one's is returned to the system.
func Attention(ctx context.Context, cfg AttentionConfig, emit func(AttentionResult) error) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("bench attention: %w", err)
	}
	debug.FreeOSMemory() // what an earlier run left is garbage: let Auto see it
	if err := cfg.Preflight(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bench attention: %w", err)
	}
	be := cfg.Backend
	if be == nil {
		cpu := kernels.NewCPU(kernels.CPUConfig{})
		defer cpu.Close()
		be = cpu
	}
	copyGBps := CopyBandwidth(copyBytes)
	for _, n := range cfg.Contexts {
		// The previous configuration's pool is garbage now: give it back,
		// so the check below sees the memory this one can have.
		debug.FreeOSMemory()
		if err := cfg.checkMemory(n); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("bench attention: %w", err)
		}
		pages := pagesOf(n, cfg.PageSize)
		sc := shard.Config{
			Store:  cfg.storeConfig(n),
			Policy: plan.Policy{PageSize: cfg.PageSize, BudgetTokens: cfg.PageSize, LocalPages: 1},
		}
		sh, err := shard.New(sc, be)
		if err != nil {
			return fmt.Errorf("bench attention: %w", err)
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "bench attention: filling %d x %d tokens (%s of K/V)\n", cfg.Batch, n,
				memlimit.Bytes(memlimit.Mul(int64(pages), int64(cfg.Batch), int64(cfg.KVHeads*cfg.PageSize*cfg.HeadDim*8))))
		}
		reqs := make([]shard.SeqStep, cfg.Batch)
		for b := range reqs {
			id := sh.Store().Create()
			if err := FillRandom(sh, id, 0, n, uint32(b+1)); err != nil {
				return fmt.Errorf("bench attention: %w", err)
			}
			q := make([]float32, cfg.QHeads*cfg.HeadDim)
			fillUniform(q, uint32(1000+b))
			reqs[b] = shard.SeqStep{Seq: id, Q: q}
		}
		for _, budget := range cfg.Budgets {
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "bench attention: context %d batch %d budget %d: timing %d steps\n", n, cfg.Batch, budget, cfg.Iters)
			}
			for b := range reqs {
				reqs[b].BudgetTokens = budget
			}
			r, err := measure(ctx, sh, reqs, cfg.Iters)
			if err != nil {
				return fmt.Errorf("bench attention: context %d budget %d: %w", n, budget, err)
			}
			r.Backend, r.Context, r.PageSize, r.Budget, r.Batch = be.Name(), n, cfg.PageSize, budget, cfg.Batch
			r.QHeads, r.KVHeads, r.HeadDim, r.CopyGBps = cfg.QHeads, cfg.KVHeads, cfg.HeadDim, copyGBps
			r.Pages, r.KPages, r.BudgetCapped, r.RhoFormula = RhoFormula(n, budget, cfg.PageSize)
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// RhoFormula returns, for a context of n tokens and a budget of budget
// tokens on pages of s tokens, P (the pages), K = budget/s capped at P,
// whether the cap applied, and the formula rho = 1/S + K/P, which is at
// most 1 + 1/S.
func RhoFormula(n, budget, s int) (pages, k int, capped bool, rho float64) {
	pages = pagesOf(n, s)
	k = budget / s
	if k >= pages {
		k, capped = pages, true
	}
	return pages, k, capped, 1/float64(s) + float64(k)/float64(pages)
}

// measure times, iters times after one warm-up of each, in turn: the
// Quest step as a server runs it (fused into one backend call where the
// backend can), a dense step, and the Quest step as three backend calls
// (its phase times). Alternating lets all three see the same machine.
func measure(ctx context.Context, sh *shard.Shard, reqs []shard.SeqStep, iters int) (AttentionResult, error) {
	var res shard.StepResult
	var quest, dense, phased, score, topk, attend []float64
	timed := func(opt shard.StepOptions) (time.Duration, error) {
		t0 := time.Now()
		err := sh.Step(ctx, 0, reqs, opt, &res)
		return time.Since(t0), err
	}
	for i := -1; i < iters; i++ {
		qt, err := timed(shard.StepOptions{})
		if err != nil {
			return AttentionResult{}, err
		}
		dt, err := timed(shard.StepOptions{ForceDense: true})
		if err != nil {
			return AttentionResult{}, err
		}
		pt, err := timed(shard.StepOptions{Phased: true})
		if err != nil {
			return AttentionResult{}, err
		}
		if i < 0 {
			continue
		}
		quest, dense, phased = append(quest, us(qt)), append(dense, us(dt)), append(phased, us(pt))
		score, topk, attend = append(score, us(res.Time.Score)), append(topk, us(res.Time.TopK)), append(attend, us(res.Time.Attend))
	}
	// Bytes from the plans of the last (phased Quest) step.
	c := sh.Config().Store
	pageKV := int64(c.PageSize * c.HeadDim * 4 * 2) // K+V of one (page, KV head)
	sum := int64(2 * c.HeadDim * 4)                 // one summary record
	var r AttentionResult
	for _, pl := range res.Plans {
		kvh := int64(c.KVHeads)
		r.BytesDense += int64(pl.Pages) * kvh * pageKV
		r.BytesRead += int64(pl.Reads()) * kvh * pageKV
		if !pl.Dense {
			r.BytesRead += int64(pl.Pages) * kvh * sum
		}
	}
	r.DenseUS, r.QuestUS, r.PhasedUS = median(dense), median(quest), median(phased)
	r.ScoreUS, r.TopKUS, r.AttendUS = median(score), median(topk), median(attend)
	r.Speedup = r.DenseUS / r.QuestUS
	r.RhoBytes = float64(r.BytesRead) / float64(r.BytesDense)
	r.DenseGBps = float64(r.BytesDense) / r.DenseUS / 1e3
	r.Iters = iters
	return r, nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// CopyBandwidth measures memory bandwidth in GB/s (bytes read plus bytes
// written per second) with a copy of size bytes, best of 5.
func CopyBandwidth(size int) float64 {
	src := make([]byte, size)
	dst := make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	best := time.Duration(1 << 62)
	for range 5 {
		t0 := time.Now()
		copy(dst, src)
		best = min(best, time.Since(t0))
	}
	return 2 * float64(size) / float64(best.Nanoseconds())
}

// fillChunk is the most tokens FillRandom appends in one call.
const fillChunk = 4096

// FillRandom appends n tokens of uniform pseudo-random K/V to every layer of
// sequence id, in chunks, starting the generator at seed.
func FillRandom(sh *shard.Shard, id pagestore.SeqID, firstLayer, n int, seed uint32) error {
	c := sh.Config().Store
	tok := c.KVHeads * c.HeadDim
	chunk := min(fillChunk, max(n, 1))
	k := make([]float32, chunk*tok)
	v := make([]float32, chunk*tok)
	for l := firstLayer; l < c.Layers; l++ {
		for t0 := 0; t0 < n; t0 += chunk {
			m := min(chunk, n-t0)
			seed = fillUniform(k[:m*tok], seed)
			seed = fillUniform(v[:m*tok], seed)
			if err := sh.Append(id, l, k[:m*tok], v[:m*tok]); err != nil {
				return err
			}
		}
	}
	return nil
}

// fillUniform fills x with xorshift values in [-1, 1) and returns the next
// state.
func fillUniform(x []float32, s uint32) uint32 {
	if s == 0 {
		s = 1
	}
	for i := range x {
		s ^= s << 13
		s ^= s >> 17
		s ^= s << 5
		x[i] = float32(int32(s)) / (1 << 31)
	}
	return s
}

// WriteJSONLine writes v as one JSON line, in one Write call, and flushes
// w when it has a Flush method (a bufio.Writer, say), so that a reader of
// a long run sees each configuration as soon as it is measured.
func WriteJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return err
	}
	if f, ok := w.(interface{ Flush() error }); ok {
		return f.Flush()
	}
	return nil
}
