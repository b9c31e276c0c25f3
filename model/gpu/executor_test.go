//go:build cuda

package gpu

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// testModel loads the checkpoint named by QUESTRT_TEST_MODEL (a passkey
// model of ../shared/models, copied where the GPU host can read it) and
// its reference prompt; the test is skipped without it.
func testModel(t *testing.T) (*model.Model, []int) {
	t.Helper()
	dir := os.Getenv("QUESTRT_TEST_MODEL")
	if dir == "" {
		t.Skip("QUESTRT_TEST_MODEL names no checkpoint")
	}
	m, err := model.Load(dir, model.LoadOptions{MemoryLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		InputIDs []int `json:"input_ids"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return m, ref.InputIDs
}

// TestGreedyMatchesCPU decodes the reference prompt (and a shorter one
// in the same batch) greedily on the GPU, the prompts prefilled by the
// CPU executor into an engine whose pages live on the GPU, and compares
// with the CPU executor over a CPU engine under the same policy: with
// float32 weights every token equals the CPU's and the first step's
// logits agree to 1e-3; with bf16 weights the share of equal tokens is
// reported (and must be most of them).
func TestGreedyMatchesCPU(t *testing.T) {
	m, prompt := testModel(t)
	for _, f32 := range []bool{true, false} {
		name := "bf16"
		if f32 {
			name = "f32"
		}
		t.Run(name, func(t *testing.T) {
			be, err := cuda.New(cuda.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			compareGreedy(t, be, m, [][]int{prompt, prompt[:500]}, 48, f32, 1e-3)
		})
	}
}

// TestGreedyPrefillMatchesCPU is TestGreedyMatchesCPU with the prompts
// prefilled on the GPU (the executor's Prefill: GEMMs for the chunk's
// projections, the tensor-core causal attention over bf16 pages; chunks
// of 200 tokens, so that chunks continue sequences mid-page): the
// prefill's logits are reported against the CPU's, and most greedy
// tokens must equal the CPU's (bf16 pages and GEMM inputs round what the
// CPU keeps in float32; the share is reported).
func TestGreedyPrefillMatchesCPU(t *testing.T) {
	m, prompt := testModel(t)
	for _, f32 := range []bool{true, false} {
		name := "bf16"
		if f32 {
			name = "f32"
		}
		t.Run(name, func(t *testing.T) {
			be, err := cuda.New(cuda.Config{DType: plan.BFloat16})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			compareGreedyWith(t, be, m, [][]int{prompt, prompt[:500]}, 48, f32, 0, devicePrefill{on: true, chunk: 200, dtype: plan.BFloat16})
		})
	}
	// fp8 pages (e4m3 records with a scale per page and KV head),
	// prefilled and decoded on the device with bf16 weights, against the
	// CPU's float32 pages: the quantization's cost shows as the share of
	// equal greedy tokens (logged; at least half, as for bf16 weights).
	t.Run("fp8 pages", func(t *testing.T) {
		be, err := cuda.New(cuda.Config{DType: plan.FP8})
		if err != nil {
			t.Fatal(err)
		}
		defer be.Close()
		compareGreedyWith(t, be, m, [][]int{prompt, prompt[:500]}, 48, false, 0, devicePrefill{on: true, chunk: 200, dtype: plan.FP8})
	})
}
