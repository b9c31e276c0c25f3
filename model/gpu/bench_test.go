//go:build cuda

package gpu

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels/cuda"
	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

// TestBenchDecode measures the executor's decode tokens/s with random
// weights of a config (QUESTRT_BENCH_CONFIG, a config.json; default
// examples/llama-3.1-8b) over sequences already holding CTX tokens of
// random K/V (no prefill), as ../shared/anchors/llama_decode_anchor.py
// does: bf16 weights and pages, pages of 16, a budget of 4096 tokens,
// Quest and dense (every layer dense) in the same run, BATCH rows. One
// JSON line per measurement, with the host's split of the step
// (Executor.LastTiming): Quest and dense with the model kernels launched
// as programmatic dependents, and Quest without. Runs only with QUESTRT_BENCH=1 (it needs a
// GPU with room for the model).
func TestBenchDecode(t *testing.T) {
	if os.Getenv("QUESTRT_BENCH") != "1" {
		t.Skip("QUESTRT_BENCH=1 runs the decode benchmark")
	}
	cfgPath := os.Getenv("QUESTRT_BENCH_CONFIG")
	if cfgPath == "" {
		cfgPath = "../../examples/llama-3.1-8b/config.json"
	}
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	ctxs := envInts(t, "CTX", "1024,32768")
	batches := envInts(t, "BATCH", "1")
	const warm, steps = 3, 20
	ctx := context.Background()
	maxCtx, maxBatch := 0, 0
	for _, n := range ctxs {
		maxCtx = max(maxCtx, n)
	}
	for _, n := range batches {
		maxBatch = max(maxBatch, n)
	}
	be, err := cuda.New(cuda.Config{DType: plan.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	t0 := time.Now()
	x, err := NewRandom(ctx, be, c, 1, Options{MaxBatch: maxBatch})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	t.Logf("random weights: %.2f GB in %v", float64(x.WeightBytes())/1e9, time.Since(t0))
	pol := plan.DefaultPolicy()
	pol.PageSize, pol.BudgetTokens, pol.DenseLayers = 16, 4096, 0
	g := c.Geometry()
	for _, n := range ctxs {
		for _, bs := range batches {
			ecfg := model.EngineConfig(g, pol, bs*((n+steps+warm+2*16)/16+2))
			ecfg.Geometry.DType = plan.BFloat16
			ecfg.Backend, ecfg.DeviceResident = be, true
			e, err := engine.New(ecfg)
			if err != nil {
				t.Fatal(err)
			}
			t1 := time.Now()
			rows := make([]Row, bs)
			for i := range rows {
				id, err := e.Create(plan.Striped)
				if err != nil {
					t.Fatal(err)
				}
				fillRandom(t, e, id, c.Layers, n, c.KVHeads*c.HeadDim, uint64(i))
				rows[i] = Row{Seq: id, Token: 1 + i, Pos: n}
			}
			t.Logf("ctx %d batch %d: K/V filled in %v", n, bs, time.Since(t1))
			for _, run := range []struct{ dense, pdl bool }{{false, true}, {true, true}, {false, false}} {
				dense := run.dense
				be.SetModelPDL(run.pdl)
				for i := range rows {
					rows[i].Dense = dense
				}
				var el time.Duration
				var tm Timing
				for s := range warm + steps {
					t2 := time.Now()
					next, err := x.Decode(ctx, e, rows)
					if err != nil {
						t.Fatalf("ctx %d batch %d step %d: %v", n, bs, s, err)
					}
					if s >= warm {
						el += time.Since(t2)
						lt := x.LastTiming()
						tm.Enqueue += lt.Enqueue
						tm.EndWait += lt.EndWait
						tm.Head += lt.Head
					}
					for i := range rows {
						rows[i].Token, rows[i].Pos = next[i], rows[i].Pos+1
					}
				}
				mode := "quest"
				if dense {
					mode = "dense"
				}
				ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / steps }
				line, _ := json.Marshal(map[string]any{"runtime": "questrt", "mode": mode, "pdl": run.pdl, "ctx": n, "batch": bs, "layers": c.Layers,
					"ms_per_step": ms(el), "tokens_per_s": float64(bs*steps) / el.Seconds(),
					"enqueue_ms": ms(tm.Enqueue), "end_wait_ms": ms(tm.EndWait), "head_ms": ms(tm.Head)})
				fmt.Println(string(line))
			}
			e.Close()
		}
	}
}

// fillRandom appends n tokens of uniform random K/V to every layer of
// sequence id, generated on every core.
func fillRandom(t *testing.T, e *engine.Engine, id decode.SeqID, layers, n, row int, seed uint64) {
	t.Helper()
	const chunk = 1 << 15 // tokens per Append
	k, v := make([]float32, min(n, chunk)*row), make([]float32, min(n, chunk)*row)
	for l := range layers {
		for lo := 0; lo < n; lo += chunk {
			m := min(chunk, n-lo) * row
			fill := func(dst []float32, s uint64) {
				var wg sync.WaitGroup
				w := runtime.GOMAXPROCS(0)
				per := (len(dst) + w - 1) / w
				for j := 0; j*per < len(dst); j++ {
					part := dst[j*per : min((j+1)*per, len(dst))]
					wg.Go(func() {
						r := rand.New(rand.NewPCG(s, uint64(j)))
						for i := range part {
							part[i] = float32(r.Float64()*2 - 1)
						}
					})
				}
				wg.Wait()
			}
			fill(k[:m], seed<<40|uint64(l)<<20|uint64(lo>>15)<<1)
			fill(v[:m], seed<<40|uint64(l)<<20|uint64(lo>>15)<<1|1)
			if err := e.Append(id, l, k[:m], v[:m]); err != nil {
				t.Fatalf("fill layer %d at %d: %v", l, lo, err)
			}
		}
	}
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
