package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"

	"github.com/questrt/questrt/bench/gpudecode"
	"github.com/questrt/questrt/internal/readlimit"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// decodeBench is one run of 'questctl bench decode': the benchmark's
// spec and the CUDA backend's settings.
type decodeBench struct {
	gpudecode.Spec
	summary     plan.SummaryDType // --summary-dtype
	cudaKernels string            // --cuda-kernels: the backend's tuning overrides
}

func runBenchDecode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, benchDecodeCommand, args, stdout, stderr)
}

// benchDecodeCommand builds the flags and the action of 'questctl bench
// decode' without running it (see [runCommand]).
func benchDecodeCommand() (*flag.FlagSet, action) {
	fs := newFlags("bench decode", `Usage: questctl bench decode --config FILE|--model DIR [flags]

Decode tokens/s of a whole model on GPU 0 (a -tags cuda build): the
device executor (model/gpu: every layer's projections, RoPE, SwiGLU, the
LM head and greedy sampling on the GPU, attention through the engine on
pages in GPU memory) over sequences that already hold --context tokens
of random K/V (no prefill), --batch of them decoded together: --warmup
steps, then --steps timed ones, with Quest (--budget tokens per KV head
from pages of --page-size), then (--dense) with every layer dense,
continuing the same sequences. The weights are random for --config (a
Hugging Face config.json, e.g. examples/llama-3.1-8b/config.json) or
with --load-format dummy, else --model's checkpoint. One JSON line per
measurement on stdout, with the fields of the PyTorch anchor's decode
lines (mode, ctx, batch, layers, ms_per_step, tokens_per_s), rho and its
formula 1/S + K/P, the host's split of a step (enqueue_ms: queueing every
layer; end_wait_ms: waiting for them; head_ms: the LM head and argmax),
and weights_GB. Progress goes to stderr.`)
	configPath := fs.String("config", "", "a model's config.json: random weights of that shape")
	modelDir := fs.String("model", "", "a Llama checkpoint directory (config.json and safetensors)")
	loadFormat := fs.String("load-format", "auto", "auto (--model's weights, random with --config) or dummy (random weights of --model's config, as vLLM's --load-format dummy)")
	contexts := fs.String("context", "1024,32768", "comma-separated context lengths in tokens")
	batches := fs.String("batch", "1", "comma-separated batch sizes (1..16)")
	prefillChunk := fs.Int("prefill-chunk", 0, fmt.Sprintf("prompt tokens one --prefill pass runs through the layers (1..1048576; 0: the executor's default, %d)", gpu.DefaultPrefillChunk))
	prefill := fs.String("prefill", "", "comma-separated prompt lengths in tokens: also time the GPU prefill of a random prompt of each (time to first token; bf16, f16 or fp8 pages); empty: none")
	steps := fs.Int("steps", 20, "timed decode steps per measurement (1..10000)")
	warmup := fs.Int("warmup", 3, "untimed steps before them (0..1000)")
	budget := fs.Int("budget", 4096, "token budget B per KV head and step (page budget K = B/S), --page-size..1073741824")
	pageSize := fs.Int("page-size", 16, "tokens per page S (1..256)")
	denseLayers := fs.Int("dense-layers", 0, "leading layers that always attend densely, 0..1024")
	denseRho := fs.Float64("dense-rho", 0, "Quest's layers read every page while 1/S + K/P >= this (0..2; 0: off): the dense fallback below the crossover context")
	dense := fs.Bool("dense", true, "also time every layer dense after Quest")
	weights := fs.String("weights-dtype", "bf16", "weights on the GPU: bf16 or f32")
	noPDL := fs.Bool("no-pdl", false, "launch each model kernel only after the previous one ended (default: as its programmatic dependent)")
	seed := fs.Uint64("seed", 1, "seed of the random weights and K/V")
	backend := fs.String("backend", "cuda", "where the model decodes: cuda (the only one: the CPU executor's speed is what generate and bench serve report)")
	kvDType := kvCacheDTypeFlagFP8(fs, "")
	phases := fs.Bool("phases", false, "after the timed Quest steps of each measurement, one more step with CUDA events between its phases: the result's phases_ms (per token, summed over layers: in = normalised q|k|v projection and RoPE, attention = the engine's layer step, out = o, gate|up, SiLU and down, end_gap = the host's end of the step, head = the LM head) and proj_GBps (the layers' weight bytes over in + out); the events end the kernels' programmatic overlap there, so that step is not a timed one; with --prefill also one more marked prefill of each prompt: its phases_ms (in, attention = appending K/V and the causal attention, out; summed over chunks and layers) and attention_tflops (the causal attention's 4 d heads layers n(n+1)/2 flops over its time)")
	summary := summaryDTypeFlag(fs, "")
	cudaKernels := fs.String("cuda-kernels", "", "tuning overrides of the CUDA backend, comma-separated: attend=NAME and score=NAME (kernel variants of kernels/cuda/mma.cu), prefill=NAME (a prefill attention variant of kernels/cuda/prefill.cu, used where its page type and head dimension fit), topk=thr|twostage|radix|onestage (force a top-K kernel), score-chunk=N and attend-chunk=N (pages per scoring block / attention work item), uploads=always (copy a layer's step inputs even when the device holds the same bytes from the previous layer; default: skip that copy); empty: the defaults")
	profileRange := fs.Bool("profile-range", false, "bracket the last warm-up Quest step of each measurement with cuProfilerStart/Stop, so that a profiler started with capture off records that one step's kernels (ncu --profile-from-start off); the timed steps are other steps")
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the host's side of the whole run to this file (go tool pprof reads it); empty: none")
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		if *backend != "cuda" {
			return usageError{fmt.Errorf("--backend %q: bench decode times the device executor, --backend cuda (for the CPU, see generate and bench serve)", *backend)}
		}
		b := decodeBench{summary: summary.types[0], cudaKernels: *cudaKernels}
		b.Executor.NoPDL = *noPDL
		if *prefillChunk < 0 || *prefillChunk > 1<<20 {
			return usageError{fmt.Errorf("--prefill-chunk %d: want 1..1048576 tokens, or 0 for the default", *prefillChunk)}
		}
		b.Executor.PrefillChunk = *prefillChunk
		b.Measure = gpudecode.Config{Warmup: *warmup, Steps: *steps, Dense: *dense, Seed: *seed, Profile: *profileRange, Phases: *phases}
		var err error
		switch {
		case (*configPath == "") == (*modelDir == ""):
			return usageError{errors.New("want one of --config FILE and --model DIR")}
		case *loadFormat != "auto" && *loadFormat != "dummy":
			return usageError{fmt.Errorf("--load-format %q: want auto or dummy", *loadFormat)}
		case *steps < 1 || *steps > 10000 || *warmup < 0 || *warmup > 1000:
			return usageError{fmt.Errorf("--steps %d, --warmup %d: want 1..10000 and 0..1000", *steps, *warmup)}
		case !(*denseRho >= 0 && *denseRho <= plan.MaxDenseRho):
			return usageError{fmt.Errorf("--dense-rho %v: want 0..%v", *denseRho, plan.MaxDenseRho)}
		case *pageSize < 1 || *pageSize > 256 || *budget < *pageSize || *budget > 1<<30 || *denseLayers < 0 || *denseLayers > 1024:
			return usageError{fmt.Errorf("--page-size %d, --budget %d, --dense-layers %d: want a page of 1..256 tokens, a budget of one page..1073741824 tokens, dense layers 0..1024", *pageSize, *budget, *denseLayers)}
		}
		switch *weights {
		case "bf16":
		case "f32":
			b.Executor.Float32Weights = true
		default:
			return usageError{fmt.Errorf("--weights-dtype %q: want bf16 or f32", *weights)}
		}
		path := *configPath
		if *modelDir != "" {
			path = filepath.Join(*modelDir, "config.json")
			if *loadFormat == "auto" {
				b.ModelDir = *modelDir
			}
		}
		raw, err := readlimit.ReadFile(path, maxInputFile)
		if err != nil {
			return usageError{fmt.Errorf("model config: %w", err)}
		}
		if b.Model, err = model.ParseConfig(raw); err != nil {
			return usageError{fmt.Errorf("%s: %w", path, err)}
		}
		if b.Measure.Contexts, err = intList(*contexts); err != nil {
			return usageError{fmt.Errorf("--context: %w", err)}
		}
		if b.Measure.Batches, err = intList(*batches); err != nil {
			return usageError{fmt.Errorf("--batch: %w", err)}
		}
		if *prefill != "" {
			if b.Prefill, err = intList(*prefill); err != nil {
				return usageError{fmt.Errorf("--prefill: %w", err)}
			}
			for _, n := range b.Prefill {
				if mp := b.Model.MaxPositions; mp > 0 && n > mp {
					return usageError{fmt.Errorf("--prefill %d: beyond the model's %d positions (max_position_embeddings)", n, mp)}
				}
			}
		}
		for _, n := range b.Measure.Batches {
			if n > 16 {
				return usageError{fmt.Errorf("--batch %d: at most 16", n)}
			}
		}
		need := *warmup + *steps
		if *dense {
			need *= 2
		}
		for _, n := range b.Measure.Contexts {
			if mp := b.Model.MaxPositions; mp > 0 && n+need > mp {
				return usageError{fmt.Errorf("--context %d: with %d steps past it, beyond the model's %d positions (max_position_embeddings)", n, need, mp)}
			}
		}
		if b.Measure.KVDType, err = plan.ParseDType(*kvDType); err != nil {
			return usageError{fmt.Errorf("--kv-cache-dtype: %w", err)}
		}
		if len(b.Prefill) > 0 && b.Measure.KVDType == plan.Float32 {
			return usageError{fmt.Errorf("--prefill with --kv-cache-dtype %v: the GPU prefill reads bf16, f16 or fp8 pages (f32 pages are decoded, not prefilled)", b.Measure.KVDType)}
		}
		b.PrefillDType = b.Measure.KVDType
		pol := plan.DefaultPolicy()
		pol.PageSize, pol.BudgetTokens, pol.DenseLayers = *pageSize, *budget, min(*denseLayers, b.Model.Layers)
		pol.DenseRho = *denseRho
		if err := pol.Validate(); err != nil {
			return usageError{err}
		}
		b.Measure.Policy = &pol
		if *cpuProfile != "" {
			stop, err := startCPUProfile(*cpuProfile)
			if err != nil {
				return err
			}
			defer stop()
		}
		return benchDecodeCUDA(ctx, b, stdout, stderr)
	}
}

// startCPUProfile starts a Go CPU profile into path and returns what
// stops it and closes the file.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
