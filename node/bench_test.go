package node_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/node/nodetest"
	"github.com/questrt/questrt/plan"
)

// BenchmarkLayerStep128K: one decode layer-step (batch 1, a new token)
// over a 128K-token sequence, CP 3, exact selection: the in-process
// engine and a 3-node loopback cluster on the same data, side by side.
// Reported per step: the coordinator's phase times on CP rank 0 (score,
// top-K, selection exchange, attention, merge) and, for the cluster, the
// client's round trip (RPC = client time - coordinator total).
//
//	go test -run '^$' -bench LayerStep128K -benchtime 200x ./node/
func BenchmarkLayerStep128K(b *testing.B) {
	const tokens = 128 << 10
	ec := engine.DefaultConfig()
	ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = 1, 8, 2, 128, 16
	ec.CP, ec.TP, ec.Selection = 3, 1, plan.Exact
	ec.CapacityPages = tokens/ec.PageSize/ec.CP + 64
	ec.Policy.PageSize, ec.Policy.DenseLayers = 16, 0
	ec.StepTimeout, ec.MemoryLimit = 10*time.Second, memlimit.NoLimit
	rng := rand.New(rand.NewPCG(1, 1))
	kv := ec.KVHeads * ec.HeadDim
	const chunk = 8 << 10
	keys, vals := randVec(rng, tokens*kv), randVec(rng, tokens*kv)
	q, nk, nv := randVec(rng, ec.QHeads*ec.HeadDim), randVec(rng, kv), randVec(rng, kv)
	report := func(b *testing.B, t engine.Times, n int) {
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
		b.ReportMetric(per(t.Score+t.Fused), "score-us")
		b.ReportMetric(per(t.TopK), "topk-us")
		b.ReportMetric(per(t.Select), "exchange-us")
		b.ReportMetric(per(t.Attend), "attend-us")
		b.ReportMetric(per(t.Merge), "merge-us")
		b.ReportMetric(per(t.Total), "coord-total-us")
	}
	add := func(sum *engine.Times, t engine.Times) {
		sum.Score += t.Score + t.Fused
		sum.TopK += t.TopK
		sum.Select += t.Select
		sum.Attend += t.Attend
		sum.Merge += t.Merge
		sum.Total += t.Total
	}
	b.Run("inproc", func(b *testing.B) {
		e, err := engine.New(ec)
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		id, _ := e.Create(plan.Striped)
		for s := 0; s < tokens; s += chunk {
			if err := e.Append(id, 0, keys[s*kv:(s+chunk)*kv], vals[s*kv:(s+chunk)*kv]); err != nil {
				b.Fatal(err)
			}
		}
		var res engine.Result
		var sum engine.Times
		b.ResetTimer()
		for range b.N {
			if err := e.Step(context.Background(), 0, []engine.Request{{Seq: id, Q: q, K: nk, V: nv}}, engine.StepOptions{Phased: true}, &res); err != nil {
				b.Fatal(err)
			}
			add(&sum, res.Time)
		}
		report(b, sum, b.N)
	})
	b.Run("cluster3", func(b *testing.B) {
		ctx := context.Background()
		c, id := benchSequence(b, ec, keys, vals)
		var sum engine.Times
		var rtt time.Duration
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			res, err := c.Step(ctx, 0, []client.Item{{Seq: id, Q: q, K: nk, V: nv}}, client.StepOptions{Phased: true})
			if err != nil {
				b.Fatal(err)
			}
			rtt += time.Since(start) - res.Total
			add(&sum, engine.Times{Total: res.Total, Score: res.Time.Score, TopK: res.Time.TopK, Select: res.Time.Select,
				Attend: res.Time.Attend, Merge: res.Time.Merge, Fused: res.Time.Fused})
		}
		report(b, sum, b.N)
		b.ReportMetric(float64(rtt.Microseconds())/float64(b.N), "client-rpc-us")
	})
}

// BenchmarkTokenStep: one decode step of one token over 4 layers at 32K
// tokens, CP 3, batch 1: layer by layer (Step: BeginStep, Layer and
// EndStep per layer) against the plan sent once (Decode; over the
// cluster the Steps stream), in process and over a 3-node loopback
// cluster, side by side.
//
//	go test -run '^$' -bench TokenStep -benchtime 100x ./node/
func BenchmarkTokenStep(b *testing.B) {
	const tokens, layers = 32 << 10, 4
	ec := engine.DefaultConfig()
	ec.Layers, ec.QHeads, ec.KVHeads, ec.HeadDim, ec.PageSize = layers, 8, 2, 128, 16
	ec.CP, ec.TP, ec.Selection = 3, 1, plan.Exact
	ec.CapacityPages = tokens/ec.PageSize/ec.CP + 64
	ec.Policy.PageSize, ec.Policy.DenseLayers = 16, 0
	ec.StepTimeout, ec.MemoryLimit = 10*time.Second, memlimit.NoLimit
	rng := rand.New(rand.NewPCG(2, 2))
	kv, qd := ec.KVHeads*ec.HeadDim, ec.QHeads*ec.HeadDim
	keys, vals := randVec(rng, tokens*kv), randVec(rng, tokens*kv)
	q, nk, nv := randVec(rng, qd), randVec(rng, kv), randVec(rng, kv)
	const chunk = 8 << 10
	b.Run("inproc", func(b *testing.B) {
		e, err := engine.New(ec)
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		id, _ := e.Create(plan.Striped)
		for l := range layers {
			for s := 0; s < tokens; s += chunk {
				if err := e.Append(id, l, keys[s*kv:(s+chunk)*kv], vals[s*kv:(s+chunk)*kv]); err != nil {
					b.Fatal(err)
				}
			}
		}
		var res engine.Result
		b.Run("per-layer", func(b *testing.B) {
			for range b.N {
				for l := range layers {
					if err := e.Step(context.Background(), l, []engine.Request{{Seq: id, Q: q, K: nk, V: nv}}, engine.StepOptions{}, &res); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run("plan-once", func(b *testing.B) {
			next := func(int, []engine.Request, []float32) {}
			for range b.N {
				if _, err := decodeLayers(context.Background(), e, layers, []engine.Request{{Seq: id, Q: q, K: nk, V: nv}}, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("cluster3", func(b *testing.B) {
		ctx := context.Background()
		c, id := benchSequence(b, ec, keys, vals)
		item := []client.Item{{Seq: id, Q: q, K: nk, V: nv}}
		b.Run("per-layer", func(b *testing.B) {
			for range b.N {
				for l := range layers {
					if _, err := c.Step(ctx, l, item, client.StepOptions{}); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run("plan-once", func(b *testing.B) {
			next := func(int, []client.Item, *client.StepResult) error { return nil }
			for range b.N {
				if _, err := c.Decode(ctx, 0, layers, item, client.StepOptions{}, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// benchSequence starts a 3-node cluster of ec and creates through node 0
// a sequence holding keys and vals (token-major) in every layer.
func benchSequence(b *testing.B, ec engine.Config, keys, vals []float32) (*client.Client, string) {
	b.Helper()
	nodes := nodetest.Start(b, "b", 3, ec, nil)
	ctx := context.Background()
	c, err := client.Dial(ctx, nodes[0].Addr(), client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	id, on, err := c.Create(ctx, plan.Striped)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("placed on %v", on)
	for l := range ec.Layers {
		if err := c.Append(ctx, id, l, keys, vals); err != nil { // in chunks under the message limit
			b.Fatal(err)
		}
	}
	return c, id
}

// decodeLayers runs one decode step of reqs over every layer of e through
// Begin, Layer and End (the plan once), next writing each later layer's
// requests from the layer before's output; it returns the last layer's
// output.
func decodeLayers(ctx context.Context, e *engine.Engine, layers int, reqs []engine.Request, next func(l int, rq []engine.Request, o []float32)) ([]float32, error) {
	bt := decode.Batch{Rows: make([]decode.Row, len(reqs))}
	for i, r := range reqs {
		bt.Rows[i] = decode.Row{Seq: r.Seq, New: r.K != nil}
	}
	st, err := e.Begin(ctx, bt)
	if err != nil {
		return nil, err
	}
	var o []float32
	for l := range layers {
		if l > 0 {
			next(l-1, reqs, o)
		}
		var q, k, v []float32
		for _, r := range reqs {
			q, k, v = append(q, r.Q...), append(k, r.K...), append(v, r.V...)
		}
		var dr decode.Result
		if err := st.Layer(ctx, l, decode.Host(q), decode.Host(k), decode.Host(v), &dr); err != nil {
			st.End(ctx)
			return nil, err
		}
		if o, err = dr.O.HostData("o"); err != nil {
			st.End(ctx)
			return nil, err
		}
	}
	return o, st.End(ctx)
}
