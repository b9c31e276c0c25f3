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
	// Phases is the device timeline of one more prefill of the prompt
	// with marks between its phases (MeasurePrefill's phases), and
	// AttentionTFLOPs the causal attention's arithmetic (CausalFLOPs)
	// over Phases.Attention.
	Phases          *gpu.PrefillPhases `json:"phases_ms,omitempty"`
	AttentionTFLOPs float64            `json:"attention_tflops,omitempty"`
}

// CausalFLOPs is the arithmetic of the causal attention of a prompt of n
// tokens from position 0 over layers layers of qHeads query heads of
// dimension d: each query at position p scores and sums p + 1 keys, 2d
// flops each for q.k and for the weighted v, so 4 d qHeads layers
// n(n+1)/2 (the same count FlashAttention's benchmarks report for a
// causal forward pass).
func CausalFLOPs(n, layers, qHeads, d int) float64 {
	return 4 * float64(d) * float64(qHeads) * float64(layers) * float64(n) * float64(n+1) / 2
}

// MeasurePrefill times x.Prefill of prompts of each length of prompts
// (random tokens) into a fresh sequence of an in-process engine on dev
// (pages device-resident, of kv, pages of 16): the time from the call to
// the last token's logits on the host (time to first token), best of
// reps after one untimed run of the same length. With phases (dev must be
// a gpu.PhaseMarker), one more run with marks between every layer's
// phases gives the result's Phases (not a timed run: a mark ends the
// kernels' programmatic overlap). One result per length, to emit.
func MeasurePrefill(ctx context.Context, dev Device, x *gpu.Executor, prompts []int, kv plan.DType, reps int, phases bool, emit func(PrefillResult) error) error {
	c := x.Config()
	reps = max(reps, 1)
	if _, ok := dev.(gpu.PhaseMarker); phases && !ok {
		return fmt.Errorf("%w: prefill phases need a device with phase marks (the CUDA backend)", gpu.ErrBadInput)
	}
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
		var ph *gpu.PrefillPhases
		runs := reps + 1
		if phases {
			runs++
		}
		for r := range runs {
			marked := phases && r == runs-1
			if marked {
				if err := x.MarkPhases(true); err != nil {
					e.Close()
					return fmt.Errorf("prompt %d: %w", n, err)
				}
			}
			id, err := e.Create(plan.Striped)
			if err == nil {
				t0 := time.Now()
				if _, err = x.Prefill(ctx, e, id, tokens, 0); err == nil {
					if d := time.Since(t0); r > 0 && !marked && (best == 0 || d < best) {
						best = d
					}
					err = e.Release(id)
				}
			}
			if marked {
				x.MarkPhases(false)
				p := x.LastPrefillPhases()
				ph = &p
			}
			if err != nil {
				e.Close()
				return fmt.Errorf("prompt %d: %w", n, err)
			}
		}
		if err := e.Close(); err != nil {
			return fmt.Errorf("prompt %d: %w", n, err)
		}
		ms := float64(best.Microseconds()) / 1e3
		res := PrefillResult{Runtime: "questrt", Mode: "prefill", Layers: c.Layers, Prompt: n, Chunk: x.PrefillChunk(), Gemm: gemm,
			Ms: ms, PromptTokensPerS: float64(n) * 1e3 / ms, Phases: ph}
		if ph != nil && ph.Attention > 0 {
			res.AttentionTFLOPs = CausalFLOPs(n, c.Layers, c.Heads, c.HeadDim) / (ph.Attention * 1e-3) / 1e12
		}
		if err := emit(res); err != nil {
			return err
		}
	}
	return nil
}
