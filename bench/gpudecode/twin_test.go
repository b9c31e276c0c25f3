package gpudecode

import (
	"context"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// twin is the CPU twin of a device, closed with the test.
func twin(t *testing.T) *backendtest.QueuedDevice {
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	t.Cleanup(func() { cpu.Close() })
	return &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}
}

// tinyConfig is a Llama model of two layers, hidden size 64 and 4096
// positions.
func tinyConfig(t *testing.T) model.Config {
	t.Helper()
	c, err := model.ParseConfig([]byte(`{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
		"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
		"max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
		"hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tinyExecutor is an executor of tinyConfig's random weights (seed 3)
// for batches of up to 2 rows on dev, closed with the test.
func tinyExecutor(t *testing.T, dev Device) *gpu.Executor {
	t.Helper()
	ctx := context.Background()
	x, err := gpu.NewRandom(ctx, dev, tinyConfig(t), 3, gpu.Options{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close(ctx) })
	return x
}

// tinyPolicy is pages of 16 tokens, a budget of 64 tokens (4 pages) and
// no dense layers: sparse from 5 pages on.
func tinyPolicy() plan.Policy {
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 64, 0
	return pol
}
