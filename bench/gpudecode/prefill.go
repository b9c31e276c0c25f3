package gpudecode

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// PrefillResult is one line of MeasurePrefill: the fields of the PyTorch
// anchor's prefill lines (../shared/anchors/llama_decode_anchor.py).
type PrefillResult struct {
	Runtime string `json:"runtime"`
	Mode    string `json:"mode"` // "prefill"
	Layers  int    `json:"layers"`
	Prompt  int    `json:"prompt"`
	Chunk   int    `json:"chunk"`
	// Gemm is what ran the projections (the CUDA backend's GemmEngine).
	Gemm string  `json:"gemm,omitempty"`
	Ms   float64 `json:"ms"`
	// PromptTokensPerS is Prompt over the time to the first token's
	// logits on the host.
	PromptTokensPerS float64 `json:"prompt_tokens_per_s"`
}

// MeasurePrefill times x.Prefill of prompts of each length of prompts
// (random tokens) into a fresh sequence of an in-process engine on dev
// (pages device-resident, of kv, pages of 16): the time from the call to
// the last token's logits on the host (time to first token), best of
// reps after one untimed run of the same length. One result per length,
// to emit.
func MeasurePrefill(ctx context.Context, dev Device, x *gpu.Executor, prompts []int, kv plan.DType, reps int, emit func(PrefillResult) error) error {
	c := x.Config()
	reps = max(reps, 1)
	for _, n := range prompts {
		if n < 1 || (c.MaxPositions > 0 && n > c.MaxPositions) {
			return fmt.Errorf("%w: prompt of %d tokens outside the model's %d positions", gpu.ErrBadInput, n, c.MaxPositions)
		}
	}
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 4096, 0
	g := c.Geometry()
	gemm := ""
	if ge, ok := dev.(gemmEngine); ok {
		gemm, _ = ge.GemmEngine(ctx)
	}
	for _, n := range prompts {
		ecfg := engine.ModelConfig(g, pol, (n+pol.PageSize-1)/pol.PageSize+1)
		ecfg.Geometry.DType = kv
		ecfg.Backend, ecfg.DeviceResident = dev, true
		if err := gpu.Admit(ctx, dev, mustPages(ecfg), fmt.Sprintf("%d pages of K/V", ecfg.CapacityPages)); err != nil {
			return err
		}
		e, err := engine.New(ecfg)
		if err != nil {
			return fmt.Errorf("prompt %d: engine: %w", n, err)
		}
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		tokens := make([]int, n)
		for i := range tokens {
			tokens[i] = rng.IntN(c.VocabSize)
		}
		best := time.Duration(0)
		for r := range reps + 1 {
			id, err := e.Create(plan.Striped)
			if err != nil {
				e.Close()
				return fmt.Errorf("prompt %d: %w", n, err)
			}
			t0 := time.Now()
			if _, err := x.Prefill(ctx, e, id, tokens, 0); err != nil {
				e.Close()
				return fmt.Errorf("prompt %d: %w", n, err)
			}
			d := time.Since(t0)
			if r > 0 && (best == 0 || d < best) {
				best = d
			}
			if err := e.Release(id); err != nil {
				e.Close()
				return fmt.Errorf("prompt %d: %w", n, err)
			}
		}
		if err := e.Close(); err != nil {
			return fmt.Errorf("prompt %d: %w", n, err)
		}
		ms := float64(best.Microseconds()) / 1e3
		if err := emit(PrefillResult{Runtime: "questrt", Mode: "prefill", Layers: c.Layers, Prompt: n, Chunk: x.PrefillChunk(), Gemm: gemm,
			Ms: ms, PromptTokensPerS: float64(n) * 1e3 / ms}); err != nil {
			return err
		}
	}
	return nil
}
