//go:build cuda

package gpudecode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/model/gpu"
	"github.com/questrt/questrt/plan"
)

// TestBenchDecode measures the executor's decode tokens/s with random
// weights of a config (QUESTRT_BENCH_CONFIG, a config.json; default
// examples/llama-3.1-8b) over sequences already holding CTX tokens of
// random K/V (no prefill), as ../shared/anchors/llama_decode_anchor.py
// does: bf16 weights and pages, pages of 16, a budget of 4096 tokens,
// Quest and dense (every layer dense) in the same run, BATCH rows, model
// kernels launched as programmatic dependents (PDL=0 turns them off).
// One JSON line per measurement (Measure). Runs only with QUESTRT_BENCH=1
// (it needs a GPU with room for the model); questctl bench decode is
// the same from the command line.
func TestBenchDecode(t *testing.T) {
	if os.Getenv("QUESTRT_BENCH") != "1" {
		t.Skip("QUESTRT_BENCH=1 runs the decode benchmark")
	}
	c := benchModelConfig(t)
	batches := envInts(t, "BATCH", "1")
	maxBatch := 0
	for _, n := range batches {
		maxBatch = max(maxBatch, n)
	}
	ctx := context.Background()
	be, err := cuda.New(cuda.Config{DType: plan.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	t0 := time.Now()
	x, err := gpu.NewRandom(ctx, be, c, 1, gpu.Options{MaxBatch: maxBatch, NoPDL: os.Getenv("PDL") == "0"})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	t.Logf("random weights: %.2f GB in %v", float64(x.WeightBytes())/1e9, time.Since(t0))
	cfg := Config{Contexts: envInts(t, "CTX", "1024,32768"), Batches: batches, KVDType: plan.BFloat16, Dense: true}
	err = Measure(ctx, be, x, cfg, func(r Result) error {
		line, err := json.Marshal(r)
		fmt.Println(string(line))
		return err
	}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
}

// benchModelConfig reads QUESTRT_BENCH_CONFIG (default
// examples/llama-3.1-8b/config.json).
func benchModelConfig(t *testing.T) model.Config {
	t.Helper()
	path := os.Getenv("QUESTRT_BENCH_CONFIG")
	if path == "" {
		path = "../../examples/llama-3.1-8b/config.json"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func envInts(t *testing.T, name, def string) []int {
	s := os.Getenv(name)
	if s == "" {
		s = def
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, n)
	}
	return out
}

// TestBenchPrefill measures the time to the first token of random
// prompts of PREFILL tokens (default 32768,131072) with the executor's
// device prefill, random weights of QUESTRT_BENCH_CONFIG (as
// TestBenchDecode), bf16 weights and pages, chunks of CHUNK tokens
// (default gpu.DefaultPrefillChunk), the attention variant PREFILL_ATTEND
// (default: the backend's); one JSON line per prompt, the anchor's
// prefill fields. QUESTRT_BENCH=1 only.
func TestBenchPrefill(t *testing.T) {
	if os.Getenv("QUESTRT_BENCH") != "1" {
		t.Skip("QUESTRT_BENCH=1 runs the prefill benchmark")
	}
	c := benchModelConfig(t)
	ctx := context.Background()
	be, err := cuda.New(cuda.Config{DType: plan.BFloat16, PrefillKernel: os.Getenv("PREFILL_ATTEND")})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	x, err := gpu.NewRandom(ctx, be, c, 1, gpu.Options{MaxBatch: 1, PrefillChunk: envInts(t, "CHUNK", "0")[0]})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	err = MeasurePrefill(ctx, be, x, envInts(t, "PREFILL", "32768,131072"), plan.BFloat16, 2, false, func(r PrefillResult) error {
		line, err := json.Marshal(r)
		fmt.Println(string(line))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
