package worker_test

import (
	"context"
	"fmt"
	"math"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
)

// A coordinator drives a worker with plain messages: create a sequence
// with its layout, append its tokens, then one decode step (BeginStep,
// one Layer call per layer, EndStep).
func ExampleLocal() {
	cfg := worker.DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.Capacity = 1, 2, 1, 4, 8
	cfg.MemoryLimit = -1
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 1})
	defer be.Close()
	trs := collective.NewInprocGroup(1)
	defer trs[0].Close()
	w, err := worker.NewLocal(cfg, []worker.RankSpec{{Rank: worker.Rank{}, Backend: be, Transport: trs[0]}})
	if err != nil {
		panic(err)
	}
	defer w.Close()
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	must(w.Create(ctx, worker.CreateRequest{Seq: 1, Layout: plan.Layout{CP: 1, TP: 1}}))
	// Two tokens whose keys and values are all ones.
	kv := []float32{1, 1, 1, 1, 1, 1, 1, 1}
	must(w.Check(ctx, worker.CheckRequest{Seq: 1, Len: 0, Append: 2}))
	must(w.Append(ctx, worker.AppendRequest{Seq: 1, Rank: worker.Rank{}, Start: 0, Tokens: 2, K: kv, V: kv}))
	must(w.BeginStep(ctx, worker.BeginRequest{Step: 1, Seqs: []worker.StepSeq{{Seq: 1, Len: 2}}}))
	var rep worker.LayerReply
	q := []float32{1, 0, 0, 0, 0, 1, 0, 0} // two query heads
	must(w.Layer(ctx, worker.LayerRequest{Step: 1, Ranks: []worker.RankInput{{Rank: worker.Rank{}, Q: q}}}, &rep))
	must(w.EndStep(ctx, worker.EndRequest{Step: 1}))
	out := rep.Ranks[0]
	// Equal logits 1/sqrt(4) over two tokens: o = v, lse = 0.5 + ln 2.
	fmt.Println(out.O, math.Abs(float64(out.LSE[0])-(0.5+math.Ln2)) < 1e-6)
	// Output: [1 1 1 1 1 1 1 1] true
}
