//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// BenchmarkShardStep times one decode step of one layer on a shard whose
// pages live only on the GPU (Llama-3.1-8B shape: 32 query heads, 8 KV
// heads, D = 128, S = 16, bf16, B = 2048 tokens), end to end as a caller
// sees it (uploads of the batch and queries, kernels, downloads): fused
// into one backend call (score, top-K and attention on the device) against
// phased (three backend calls, scores and selections through the host).
//
//	go test -tags cuda -run '^$' -bench ShardStep ./kernels/cuda/
func BenchmarkShardStep(b *testing.B) {
	for _, c := range []struct{ tokens, batch int }{{32 << 10, 1}, {32 << 10, 8}, {128 << 10, 1}, {128 << 10, 8}, {1 << 20, 1}} {
		b.Run(fmt.Sprintf("ctx%dK_b%d", c.tokens>>10, c.batch), func(b *testing.B) { benchShardStep(b, c.tokens, c.batch) })
	}
}

func benchShardStep(b *testing.B, tokens, batch int) {
	_, sh, reqs, _ := newBenchShard(b, tokens, batch, 1)
	for _, mode := range []struct {
		name string
		opt  shard.StepOptions
	}{{"phased", shard.StepOptions{Phased: true}}, {"fused", shard.StepOptions{}}} {
		b.Run(mode.name, func(b *testing.B) {
			var res shard.StepResult
			for range 3 { // warm-up: buffers grow to size
				if err := sh.Step(context.Background(), 0, reqs, mode.opt, &res); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				if err := sh.Step(context.Background(), 0, reqs, mode.opt, &res); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/step")
		})
	}
}

// newBenchShard is BenchmarkShardStep's shard: layers layers on a new
// bf16 backend, batch sequences of tokens random tokens in each layer,
// one step request per sequence, and the generator for more queries
// (closed at the end of b).
func newBenchShard(b *testing.B, tokens, batch, layers int) (*Backend, *shard.Shard, []shard.SeqStep, *rand.Rand) {
	const qh, kvh, d, s = 32, 8, 128, 16
	t0 := time.Now()
	be, err := New(Config{DType: plan.BFloat16})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("backend start: %v", time.Since(t0))
	b.Cleanup(func() { be.Close() })
	pol := plan.DefaultPolicy()
	pol.DenseLayers = 0
	pages := batch * (tokens/s + 1)
	sh, err := shard.New(shard.Config{Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: pages},
		Policy: pol, DeviceResident: true}, be)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sh.Close() })
	rng := rand.New(rand.NewPCG(1, 2))
	pd := newPrefill(rng, kvh*d)
	var reqs []shard.SeqStep
	for range batch {
		id := sh.Store().Create()
		for l := range layers {
			if err := pd.fill(tokens, func(k, v []float32) error { return sh.Append(id, l, k, v) }); err != nil {
				b.Fatal(err)
			}
		}
		reqs = append(reqs, shard.SeqStep{Seq: id, Q: randQuery(rng, qh*d)})
	}
	return be, sh, reqs, rng
}

// randQuery is n normal floats.
func randQuery(rng *rand.Rand, n int) []float32 {
	q := make([]float32, n)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	return q
}

// BenchmarkStepOverhead splits BenchmarkShardStep's fused step (batch 1,
// 128K and 1M tokens) into its parts, per step in microseconds:
// shard-us (the step as a caller sees it), backend-us (the backend call
// inside it, wall time); host-*-us, the host's wall time from the call's
// entry to the start of its device work (entry), through the upload
// (prep), the kernel launches (launch) and the download (wait); gpu-*-us,
// the device time between CUDA events at the same points. The fixed
// costs of one backend call: handoff (an empty call on the device
// goroutine), sync (cuCtxSynchronize with nothing queued), copy (a
// 256-byte upload and download through the staging buffer).
//
//	go test -tags cuda -run '^$' -bench StepOverhead ./kernels/cuda/
func BenchmarkStepOverhead(b *testing.B) {
	for _, tokens := range []int{128 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("ctx%dK_b1", tokens>>10), func(b *testing.B) {
			be, sh, reqs, _ := newBenchShard(b, tokens, 1, 1)
			ctx := context.Background()
			var p *stepProbe
			if err := be.do(ctx, func() (err error) { p, err = newStepProbe(); return err }); err != nil {
				b.Fatal(err)
			}
			defer be.do(ctx, func() error { p.destroy(); return nil })
			var res shard.StepResult
			for range 3 {
				if err := sh.Step(ctx, 0, reqs, shard.StepOptions{}, &res); err != nil {
					b.Fatal(err)
				}
			}
			be.probe = p
			defer func() { be.probe = nil }()
			var backend time.Duration
			b.ResetTimer()
			for range b.N {
				if err := sh.Step(ctx, 0, reqs, shard.StepOptions{}, &res); err != nil {
					b.Fatal(err)
				}
				backend += res.Time.Fused
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/n, "shard-us")
			b.ReportMetric(float64(backend.Microseconds())/n, "backend-us")
			for i, name := range []string{"entry", "prep", "launch", "wait"} {
				b.ReportMetric(medianOf(p.Host[i]), "host-"+name+"-us")
			}
			for i, name := range []string{"prep", "kernels", "download"} {
				b.ReportMetric(medianOf(p.GPU[i]), "gpu-"+name+"-us")
			}
		})
	}
	be, err := New(Config{DType: plan.BFloat16})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	ctx := context.Background()
	small := make([]float32, 64)
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"handoff", func() error { return nil }},
		{"sync", cu.Synchronize},
		{"copy", func() error {
			be.in.reset()
			i := pack(&be.in, small)
			if err := be.send(&be.in, "probe.in"); err != nil {
				return err
			}
			be.out.reset()
			be.out.region(256)
			be.out.base = be.in.ptr(i)
			setHost(&be.out, 0, small)
			return be.receive(&be.out)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				if err := be.do(ctx, c.f); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "us/call")
		})
	}
}

func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	ys := slices.Clone(xs)
	slices.Sort(ys)
	return ys[len(ys)/2]
}

// BenchmarkLayerSync runs 32 layer-steps of one decode step (batch 1, the
// BenchmarkShardStep shape) on a shard of distinct layers, cycled: per
// layer, one host synchronisation each (Step) against all 32 queued and
// one Sync (Queue). us/layer is the wall time of the 32 divided by 32.
//
//	go test -tags cuda -run '^$' -bench LayerSync ./kernels/cuda/
func BenchmarkLayerSync(b *testing.B) {
	for _, c := range []struct{ tokens, layers int }{{32 << 10, 8}, {128 << 10, 8}, {1 << 20, 2}} {
		b.Run(fmt.Sprintf("ctx%dK", c.tokens>>10), func(b *testing.B) { benchLayerSync(b, c.tokens, c.layers) })
	}
}

func benchLayerSync(b *testing.B, tokens, layers int) {
	const qh, d, steps = 32, 128, 32
	_, sh, first, rng := newBenchShard(b, tokens, 1, layers)
	reqs := make([][]shard.SeqStep, steps)
	for i := range reqs {
		reqs[i] = []shard.SeqStep{{Seq: first[0].Seq, Q: randQuery(rng, qh*d)}}
	}
	res := make([]shard.StepResult, steps)
	ctx := context.Background()
	run := func(queue bool) error {
		for i := range steps {
			if err := sh.Step(ctx, i%layers, reqs[i], shard.StepOptions{Queue: queue}, &res[i]); err != nil {
				return err
			}
		}
		return sh.Sync(ctx)
	}
	for _, mode := range []struct {
		name  string
		queue bool
	}{{"per-layer", false}, {"per-step", true}} {
		b.Run(mode.name, func(b *testing.B) {
			for range 3 {
				if err := run(mode.queue); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				if err := run(mode.queue); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*steps), "us/layer")
		})
	}
}

// BenchmarkEngineStepCP2 times one decode step of one layer of an engine
// with two CP ranks sharing the GPU (one backend each, pages and tables on
// the device), same shape as BenchmarkShardStep: served (each rank scores
// and picks its candidates in one call; only candidates leave the device)
// against phased (scores down to the host, back up for the top-K); and a
// dense step (every page) on the same data.
//
//	go test -tags cuda -run '^$' -bench EngineStepCP2 ./kernels/cuda/
func BenchmarkEngineStepCP2(b *testing.B) {
	for _, c := range []struct{ tokens, batch int }{{128 << 10, 1}, {128 << 10, 8}, {1 << 20, 1}} {
		b.Run(fmt.Sprintf("ctx%dK_b%d", c.tokens>>10, c.batch), func(b *testing.B) { benchEngineStep(b, 2, c.tokens, c.batch) })
	}
}

// BenchmarkEngineStepCP1 is BenchmarkEngineStepCP2 with one CP rank (the
// step fuses), plus a dense step (every page) on the same data: what an
// engine step costs over the shard step.
//
//	go test -tags cuda -run '^$' -bench EngineStepCP1 ./kernels/cuda/
func BenchmarkEngineStepCP1(b *testing.B) {
	for _, c := range []struct{ tokens, batch int }{{64 << 10, 1}, {128 << 10, 8}} {
		b.Run(fmt.Sprintf("ctx%dK_b%d", c.tokens>>10, c.batch), func(b *testing.B) { benchEngineStep(b, 1, c.tokens, c.batch) })
	}
}

func benchEngineStep(b *testing.B, cp, tokens, batch int) {
	bes := make([]*Backend, cp)
	for i := range bes {
		be, err := New(Config{DType: plan.BFloat16})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { be.Close() }) // after the engine's (cleanups run last first)
		bes[i] = be
	}
	e, reqs := newBenchEngine(b, bes, tokens, batch, 3, func(*engine.Config) {})
	for _, mode := range []struct {
		name string
		opt  engine.StepOptions
	}{{"phased", engine.StepOptions{Phased: true}}, {"served", engine.StepOptions{}}, {"dense", engine.StepOptions{ForceDense: true}}} {
		b.Run(mode.name, func(b *testing.B) {
			var res engine.Result
			for range 3 {
				if err := e.Step(context.Background(), 0, reqs, mode.opt, &res); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				if err := e.Step(context.Background(), 0, reqs, mode.opt, &res); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/step")
		})
	}
}

// newBenchEngine is an engine of one layer with a CP rank per backend of
// bes (Llama-3.1-8B shape, bf16, pages and tables on the devices; tune
// changes the config before it is built), batch sequences of tokens
// random tokens and one step request each (closed at the end of b).
func newBenchEngine(b *testing.B, bes []*Backend, tokens, batch int, seed uint64, tune func(*engine.Config)) (*engine.Engine, []engine.Request) {
	const qh, kvh, d, s = 32, 8, 128, 16
	cp := len(bes)
	cfg := engine.DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 1, qh, kvh, d, s
	cfg.CP, cfg.TP, cfg.CapacityPages = cp, 1, batch*(tokens/s/cp+2)
	cfg.Policy.DenseLayers = 0
	cfg.DeviceResident = true
	cfg.Backends = func(_, r int) kernels.Backend { return bes[r] }
	tune(&cfg)
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	rng := rand.New(rand.NewPCG(seed, seed+1))
	pd := newPrefill(rng, kvh*d)
	var reqs []engine.Request
	for range batch {
		id, err := e.Create(plan.Striped)
		if err != nil {
			b.Fatal(err)
		}
		if err := pd.fill(tokens, func(k, v []float32) error { return e.Append(id, 0, k, v) }); err != nil {
			b.Fatal(err)
		}
		reqs = append(reqs, engine.Request{Seq: id, Q: randQuery(rng, qh*d)})
	}
	return e, reqs
}

// prefill is a pool of random tokens twice the append chunk, appended in
// chunks read at random offsets (pages differ without drawing every key
// afresh).
type prefill struct {
	rng  *rand.Rand
	tok  int // floats per token
	k, v []float32
}

const prefillChunk = 8192

func newPrefill(rng *rand.Rand, tok int) *prefill {
	p := &prefill{rng: rng, tok: tok, k: make([]float32, 2*prefillChunk*tok), v: make([]float32, 2*prefillChunk*tok)}
	for i := range p.k {
		p.k[i], p.v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	return p
}

// fill hands add at least tokens tokens, a chunk at a time.
func (p *prefill) fill(tokens int, add func(k, v []float32) error) error {
	n := prefillChunk * p.tok
	for done := 0; done < tokens; done += prefillChunk {
		off := p.rng.IntN(prefillChunk) * p.tok
		if err := add(p.k[off:off+n], p.v[off:off+n]); err != nil {
			return err
		}
	}
	return nil
}
