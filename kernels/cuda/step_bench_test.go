//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

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
	const qh, kvh, d, s = 32, 8, 128, 16
	be, err := New(Config{DType: plan.BFloat16})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	pol := plan.DefaultPolicy()
	pol.DenseLayers = 0
	pages := batch * (tokens/s + 1)
	sh, err := shard.New(shard.Config{Store: pagestore.Config{Layers: 1, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: pages},
		Policy: pol, DeviceResident: true}, be)
	if err != nil {
		b.Fatal(err)
	}
	defer sh.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	pd := newPrefill(rng, kvh*d)
	var reqs []shard.SeqStep
	for range batch {
		id := sh.Store().Create()
		if err := pd.fill(tokens, func(k, v []float32) error { return sh.Append(id, 0, k, v) }); err != nil {
			b.Fatal(err)
		}
		q := make([]float32, qh*d)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		reqs = append(reqs, shard.SeqStep{Seq: id, Q: q})
	}
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
	const qh, kvh, d, s = 32, 8, 128, 16
	bes := make([]*Backend, cp)
	for i := range bes {
		be, err := New(Config{DType: plan.BFloat16})
		if err != nil {
			b.Fatal(err)
		}
		defer be.Close()
		bes[i] = be
	}
	cfg := engine.DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 1, qh, kvh, d, s
	cfg.CP, cfg.TP, cfg.CapacityPages = cp, 1, batch*(tokens/s/cp+2)
	cfg.Policy.DenseLayers = 0
	cfg.DeviceResident = true
	cfg.Backends = func(_, r int) kernels.Backend { return bes[r] }
	e, err := engine.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	rng := rand.New(rand.NewPCG(3, 4))
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
		q := make([]float32, qh*d)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		reqs = append(reqs, engine.Request{Seq: id, Q: q})
	}
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
