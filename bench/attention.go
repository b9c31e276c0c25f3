// Package bench holds the benchmark behind `questctl bench attention`
// (the CPU backend; the CUDA one lives in kernels/cuda, and `questctl bench
// collective` in package collective): one-layer Quest vs dense decode
// attention on the same data, with phase times and bytes moved next to the
// formula rho = 1/S + K/P. Results files live in bench/results/.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/shard"
)

// AttentionConfig sizes an attention benchmark.
type AttentionConfig struct {
	Contexts []int // context lengths in tokens; default 32768, 131072
	Budgets  []int // token budgets; default 2048
	PageSize int   // default 16
	QHeads   int   // default 32
	KVHeads  int   // default 8
	HeadDim  int   // default 128
	Batch    int   // sequences per step, each of the full context; default 1
	Iters    int   // timed steps per configuration (median reported); default 10
	Backend  kernels.Backend
	// Progress, when set, receives one line per phase of setup.
	Progress io.Writer
}

// DefaultAttentionConfig returns the defaults documented on the fields.
func DefaultAttentionConfig() AttentionConfig {
	return AttentionConfig{Contexts: []int{32768, 131072}, Budgets: []int{2048}, PageSize: 16, QHeads: 32, KVHeads: 8, HeadDim: 128, Batch: 1, Iters: 10}
}

// AttentionResult is one JSON line of `questctl bench attention`.
type AttentionResult struct {
	Backend    string  `json:"backend"`
	Context    int     `json:"context"`
	PageSize   int     `json:"page_size"`
	Budget     int     `json:"budget"`
	Batch      int     `json:"batch"`
	QHeads     int     `json:"q_heads"`
	KVHeads    int     `json:"kv_heads"`
	HeadDim    int     `json:"head_dim"`
	DenseUS    float64 `json:"dense_us"`
	QuestUS    float64 `json:"quest_us"`
	ScoreUS    float64 `json:"score_us"`
	TopKUS     float64 `json:"topk_us"`
	AttendUS   float64 `json:"attend_us"`
	Speedup    float64 `json:"speedup"`
	BytesRead  int64   `json:"bytes_read"`
	BytesDense int64   `json:"bytes_dense"`
	RhoBytes   float64 `json:"rho_measured"`
	RhoFormula float64 `json:"rho_formula"`
	DenseGBps  float64 `json:"dense_gbps"`
	CopyGBps   float64 `json:"copy_gbps"`
	Iters      int     `json:"iters"`
}

// Attention runs the benchmark and calls emit once per configuration.
func Attention(ctx context.Context, cfg AttentionConfig, emit func(AttentionResult) error) error {
	if len(cfg.Contexts) == 0 || len(cfg.Budgets) == 0 || cfg.PageSize < 1 || cfg.Batch < 1 || cfg.Iters < 1 {
		return fmt.Errorf("bench attention: contexts, budgets, page size, batch and iterations must be set and positive: %+v", cfg)
	}
	be := cfg.Backend
	if be == nil {
		cpu := kernels.NewCPU(kernels.CPUConfig{})
		defer cpu.Close()
		be = cpu
	}
	copyGBps := CopyBandwidth(256 << 20)
	for _, n := range cfg.Contexts {
		if n < 1 {
			return fmt.Errorf("bench attention: context %d < 1", n)
		}
		pages := (n + cfg.PageSize - 1) / cfg.PageSize
		sc := shard.Config{
			Store: pagestore.Config{
				Layers: 1, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, PageSize: cfg.PageSize,
				DType: pagestore.Float32, Capacity: pages * cfg.Batch,
			},
			QHeads: cfg.QHeads,
			Policy: shard.Policy{PageSize: cfg.PageSize, BudgetTokens: cfg.PageSize, LocalPages: 1},
		}
		sh, err := shard.New(sc, be)
		if err != nil {
			return fmt.Errorf("bench attention: %w", err)
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "bench: filling %d x %d tokens (%d MiB of K/V)\n", cfg.Batch, n, int64(pages)*int64(cfg.Batch)*int64(cfg.KVHeads*cfg.PageSize*cfg.HeadDim*8)>>20)
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
			for b := range reqs {
				reqs[b].BudgetTokens = budget
			}
			r, err := measure(ctx, sh, reqs, cfg.Iters)
			if err != nil {
				return fmt.Errorf("bench attention: context %d budget %d: %w", n, budget, err)
			}
			r.Backend, r.Context, r.PageSize, r.Budget, r.Batch = be.Name(), n, cfg.PageSize, budget, cfg.Batch
			r.QHeads, r.KVHeads, r.HeadDim, r.CopyGBps = cfg.QHeads, cfg.KVHeads, cfg.HeadDim, copyGBps
			k := budget / cfg.PageSize
			r.RhoFormula = 1/float64(cfg.PageSize) + float64(k)/float64(pages)
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	return nil
}

func measure(ctx context.Context, sh *shard.Shard, reqs []shard.SeqStep, iters int) (AttentionResult, error) {
	var res shard.StepResult
	var quest, dense, score, topk, attend []float64
	// One warm-up of each, then alternate so both see the same machine.
	for i := -1; i < iters; i++ {
		t0 := time.Now()
		if err := sh.Step(ctx, 0, reqs, shard.StepOptions{}, &res); err != nil {
			return AttentionResult{}, err
		}
		qt := time.Since(t0)
		st, kt, at := res.Time.Score, res.Time.TopK, res.Time.Attend
		t0 = time.Now()
		if err := sh.Step(ctx, 0, reqs, shard.StepOptions{ForceDense: true}, &res); err != nil {
			return AttentionResult{}, err
		}
		dt := time.Since(t0)
		if i < 0 {
			continue
		}
		quest, dense = append(quest, us(qt)), append(dense, us(dt))
		score, topk, attend = append(score, us(st)), append(topk, us(kt)), append(attend, us(at))
	}
	// Bytes from the quest plan of the last step.
	if err := sh.Step(ctx, 0, reqs, shard.StepOptions{}, &res); err != nil {
		return AttentionResult{}, err
	}
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
	r.DenseUS, r.QuestUS = median(dense), median(quest)
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

// FillRandom appends n tokens of uniform pseudo-random K/V to every layer of
// sequence id, in chunks, starting the generator at seed.
func FillRandom(sh *shard.Shard, id pagestore.SeqID, firstLayer, n int, seed uint32) error {
	c := sh.Config().Store
	tok := c.KVHeads * c.HeadDim
	const chunk = 4096
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

// WriteJSONLine writes v as one JSON line.
func WriteJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
