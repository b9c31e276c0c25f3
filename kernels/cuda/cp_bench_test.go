//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/plan"
)

// BenchmarkCPScaling times one decode layer of an engine whose CP ranks
// each have a CUDA backend (a context) on the GPUs of
// QUESTRT_BENCH_DEVICES (comma-separated ordinals, default "0"; a GPU
// listed twice gets two contexts), for CP = 1, 2, 4, 8 up to the number
// listed, at the contexts of QUESTRT_BENCH_CONTEXTS (tokens, default
// 1048576) and batches of QUESTRT_BENCH_BATCHES (default 1): the
// Llama-3.1-8B layer shape, bf16, B = 4096, pages and tables only in GPU
// memory. Per configuration: us/step (mean wall time), the median of each
// phase as the engine reports it (score, top-K, select = the selection
// exchange, attend, merge = the partial-state merge; at CP 1 the local
// step fuses and score is its whole time), and the p50/p99 of select +
// merge (the collectives). Written for the multi-GPU kinds; compiled, not
// yet run. The prefill goes through the host
// (8 KiB of float32 per token): plan contexts and batches that fit host
// memory.
//
//	QUESTRT_BENCH_DEVICES=0,1,2,3 go test -tags cuda -run '^$' -bench CPScaling -benchtime 200x ./kernels/cuda/
func BenchmarkCPScaling(b *testing.B) {
	devs := benchInts(b, "QUESTRT_BENCH_DEVICES", "0")
	for _, tokens := range benchInts(b, "QUESTRT_BENCH_CONTEXTS", "1048576") {
		for _, batch := range benchInts(b, "QUESTRT_BENCH_BATCHES", "1") {
			for cp := 1; cp <= min(8, len(devs)); cp *= 2 {
				b.Run(fmt.Sprintf("ctx%dK_b%d_cp%d", tokens>>10, batch, cp), func(b *testing.B) { benchCPScaling(b, devs[:cp], tokens, batch) })
			}
		}
	}
}

func benchInts(b *testing.B, env, def string) []int {
	s := os.Getenv(env)
	if s == "" {
		s = def
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			b.Fatalf("%s=%q: %q is not a non-negative integer", env, s, f)
		}
		out = append(out, n)
	}
	return out
}

func benchCPScaling(b *testing.B, devs []int, tokens, batch int) {
	bes := make([]*Backend, len(devs))
	for i, dev := range devs {
		be, err := New(Config{Device: dev, DType: plan.BFloat16})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { be.Close() }) // after the engine's (cleanups run last first)
		bes[i] = be
	}
	e, reqs := newBenchEngine(b, bes, tokens, batch, 11, func(c *engine.Config) {
		c.Policy.BudgetTokens = 4096
		c.StepTimeout = time.Minute
	})
	ctx := context.Background()
	var res engine.Result
	for range 3 {
		if err := e.Step(ctx, 0, reqs, engine.StepOptions{}, &res); err != nil {
			b.Fatal(err)
		}
	}
	var phases [5][]float64
	var coll []float64
	us := func(x time.Duration) float64 { return float64(x.Nanoseconds()) / 1e3 }
	b.ResetTimer()
	for range b.N {
		if err := e.Step(ctx, 0, reqs, engine.StepOptions{}, &res); err != nil {
			b.Fatal(err)
		}
		t := res.Time
		for i, x := range []time.Duration{t.Score + t.Fused, t.TopK, t.Select, t.Attend, t.Merge} {
			phases[i] = append(phases[i], us(x))
		}
		coll = append(coll, us(t.Collective()))
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/step")
	for i, name := range []string{"score", "topk", "select", "attend", "merge"} {
		b.ReportMetric(medianOf(phases[i]), name+"-us")
	}
	slices.Sort(coll)
	b.ReportMetric(coll[len(coll)/2], "coll-p50-us")
	b.ReportMetric(coll[min(len(coll)-1, len(coll)*99/100)], "coll-p99-us")
}
