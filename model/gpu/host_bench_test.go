package gpu

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// hostDevice is the CPU twin of a device whose kernels can be switched
// off (noop): the model kernels, the step and the token writes return at
// once, as a launch that queues work would, so that what a Decode costs
// is the runtime's host logic alone (its planning, checks, bookkeeping
// and the twin's own CheckTensor). Everything else is the twin's.
type hostDevice struct {
	*backendtest.QueuedDevice
	noop bool
}

func (d *hostDevice) UploadTensor(t decode.Tensor, src []float32) error {
	if d.noop {
		return nil
	}
	return d.QueuedDevice.UploadTensor(t, src)
}

func (d *hostDevice) Embed(ctx context.Context, out decode.Tensor, table kernels.Matrix, ids []int32) error {
	if d.noop {
		return nil
	}
	return d.QueuedDevice.Embed(ctx, out, table, ids)
}

func (d *hostDevice) Gemv(ctx context.Context, y decode.Tensor, w kernels.Matrix, x, res decode.Tensor, rows int) error {
	if d.noop {
		return nil
	}
	return d.QueuedDevice.Gemv(ctx, y, w, x, res, rows)
}

func (d *hostDevice) GemvNorm(ctx context.Context, w kernels.Matrix, x decode.Tensor, norm kernels.Matrix, eps float32, rows int, ys ...decode.Tensor) error {
	if d.noop {
		return nil
	}
	return d.QueuedDevice.GemvNorm(ctx, w, x, norm, eps, rows, ys...)
}

func (d *hostDevice) Rope(ctx context.Context, q, k decode.Tensor, rows, qh, kh, dim int, cs decode.Tensor) error {
	if d.noop {
		return nil
	}
	return d.QueuedDevice.Rope(ctx, q, k, rows, qh, kh, dim, cs)
}

func (d *hostDevice) SiluMul(ctx context.Context, g, u decode.Tensor) error {
	if d.noop {
		return nil
	}
	return d.QueuedDevice.SiluMul(ctx, g, u)
}

func (d *hostDevice) Argmax(ctx context.Context, logits decode.Tensor, rows, vocab int) ([]int32, error) {
	if d.noop {
		return make([]int32, rows), nil
	}
	return d.QueuedDevice.Argmax(ctx, logits, rows, vocab)
}

func (d *hostDevice) StepTensor(ctx context.Context, s kernels.Shape, l kernels.Layer, b *kernels.Batch, q decode.Tensor, pl *kernels.TopKPlan, lists *kernels.Lists, o, lse decode.Tensor) error {
	if d.noop {
		return nil
	}
	return d.QueuedDevice.StepTensor(ctx, s, l, b, q, pl, lists, o, lse)
}

func (d *hostDevice) WriteTokensTensor(ctx context.Context, pool any, pages []int32, slot int, k, v decode.Tensor) error {
	if d.noop {
		return nil
	}
	return d.QueuedDevice.WriteTokensTensor(ctx, pool, pages, slot, k, v)
}

// PrefillTensor skips the prompt's attention (quadratic in the twin,
// minutes for the benchmark's prompt; its output is not checked): the
// keys and values are appended as ever.
func (d *hostDevice) PrefillTensor(context.Context, kernels.Shape, any, any, uint64, int, int, decode.Tensor, decode.Tensor) error {
	return nil
}

// hostBenchConfig is a 32-layer Llama shape small enough that the twin's
// arithmetic is cheap (GQA 4:2, head dim 16).
func hostBenchConfig(b *testing.B) model.Config {
	b.Helper()
	c, err := model.ParseConfig([]byte(`{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
		"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 32,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
		"max_position_embeddings": 131072, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
		"hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}`))
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkDecodeHost runs Executor.Decode of one row at a context of
// 4096 tokens (pages of 16, a budget of 1024 tokens, the first two
// layers dense) through an engine whose pages are on the CPU twin of a
// device, 32 layers: "twin" with the twin's kernels, "host" with them
// switched off (hostDevice), the runtime's host logic alone, what a
// device's step waits for when the host enqueues slower than it runs.
// It reports ns and allocations per layer besides per token (op).
func BenchmarkDecodeHost(b *testing.B) {
	for _, mode := range []string{"host", "twin"} {
		b.Run(mode, func(b *testing.B) { benchDecodeHost(b, mode == "host") })
	}
}

// hostSetup is an executor of c on a hostDevice with an engine whose
// pages are there, and a row that holds ctxTokens prompt tokens and room
// for steps more (closed with tb).
func hostSetup(tb testing.TB, c model.Config, ctxTokens, steps int) (*hostDevice, *engine.Engine, *Executor, []Row) {
	tb.Helper()
	ctx := context.Background()
	cpu := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	tb.Cleanup(func() { cpu.Close() })
	dev := &hostDevice{QueuedDevice: &backendtest.QueuedDevice{FakeDevice: backendtest.FakeDevice{CPU: cpu}}}
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 1024, 2
	cfg := engine.ModelConfig(c.Geometry(), pol, (ctxTokens+steps)/pol.PageSize+4)
	cfg.Backend, cfg.DeviceResident = dev, true
	e, err := engine.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	x, err := NewRandom(ctx, dev, c, 7, Options{Float32Weights: true, MaxBatch: 1, PrefillChunk: 1024})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { x.Close(ctx) })
	id, err := e.Create(plan.Striped)
	if err != nil {
		tb.Fatal(err)
	}
	prompt := make([]int, ctxTokens)
	for i := range prompt {
		prompt[i] = 3 + (i*7+i*i/5)%290
	}
	if _, err := x.Prefill(ctx, e, id, prompt, 0); err != nil {
		tb.Fatal(err)
	}
	return dev, e, x, []Row{{Seq: id, Token: 5, Pos: ctxTokens}}
}

func benchDecodeHost(b *testing.B, noop bool) {
	const ctxTokens = 4096
	ctx := context.Background()
	c := hostBenchConfig(b)
	dev, e, x, rows := hostSetup(b, c, ctxTokens, b.N)
	dev.noop = noop
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		next, err := x.Decode(ctx, e, rows)
		if err != nil {
			b.Fatal(err)
		}
		rows[0].Token, rows[0].Pos = next[0], rows[0].Pos+1
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	perLayer := float64(b.N * c.Layers)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/perLayer, "ns/layer")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/perLayer, "allocs/layer")
	if s := x.LastSteps(0); len(s) != c.Layers {
		b.Fatal(fmt.Sprintf("%d layer steps", len(s)))
	}
}

// TestDecodeHostAllocs: a Decode's host logic on the device path
// allocates nothing a layer (the kernels switched off, hostDevice): a
// model of 8 layers allocates what one of 2 does, a step.
func TestDecodeHostAllocs(t *testing.T) {
	ctx := context.Background()
	allocs := map[int]float64{}
	for _, layers := range []int{2, 8} {
		c := tinyConfig(t)
		c.Layers = layers
		dev, e, x, rows := hostSetup(t, c, 100, 200)
		dev.noop = true
		allocs[layers] = testing.AllocsPerRun(50, func() {
			next, err := x.Decode(ctx, e, rows)
			if err != nil {
				t.Fatal(err)
			}
			rows[0].Token, rows[0].Pos = next[0], rows[0].Pos+1
		})
	}
	t.Logf("allocations a Decode: %v (by layers)", allocs)
	if allocs[8] > allocs[2] {
		t.Errorf("a Decode of 8 layers allocates %v times, of 2 layers %v: allocations a layer", allocs[8], allocs[2])
	}
}
