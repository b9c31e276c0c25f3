//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// TestQueuedStepsMatchStep queues every layer of a decode step on the GPU
// (Shard.Step with Queue, one Sync) and compares with the same steps run
// synchronously: bit-identical outputs. Batches of 8 sequences and 40
// queued steps outgrow the 1 MiB staging buffer, so queued outputs are
// also settled when the buffer starts over in the middle of the queue.
func TestQueuedStepsMatchStep(t *testing.T) {
	const layers, qh, kvh, d, s = 4, 32, 8, 128, 16
	be, err := New(Config{DType: plan.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	pol := plan.DefaultPolicy()
	pol.DenseLayers = 1
	pol.BudgetTokens = 256
	sh, err := shard.New(shard.Config{Store: pagestore.Config{Layers: layers, Geometry: plan.Geometry{QHeads: qh, KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 8 * 300},
		Policy: pol, DeviceResident: true}, be)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	vec := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	var ids []pagestore.SeqID
	for i := range 8 {
		id := sh.Store().Create()
		n := 1000 + 517*i
		for l := range layers {
			if err := sh.Append(id, l, vec(n*kvh*d), vec(n*kvh*d)); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, id)
	}
	ctx := context.Background()
	for _, c := range []struct{ batch, rounds int }{{1, 2}, {3, 2}, {8, 10}} {
		t.Run(fmt.Sprintf("batch%d", c.batch), func(t *testing.T) {
			var reqs [][]shard.SeqStep
			for range c.rounds * layers {
				var r []shard.SeqStep
				for _, id := range ids[:c.batch] {
					r = append(r, shard.SeqStep{Seq: id, Q: vec(qh * d)})
				}
				reqs = append(reqs, r)
			}
			want := make([]shard.StepResult, len(reqs))
			got := make([]shard.StepResult, len(reqs))
			for i, r := range reqs {
				if err := sh.Step(ctx, i%layers, r, shard.StepOptions{}, &want[i]); err != nil {
					t.Fatal(err)
				}
			}
			for i, r := range reqs {
				if err := sh.Step(ctx, i%layers, r, shard.StepOptions{Queue: true}, &got[i]); err != nil {
					t.Fatal(err)
				}
				if !got[i].Queued {
					t.Fatalf("step %d not queued", i)
				}
			}
			if err := sh.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			for i := range reqs {
				if !slices.Equal(want[i].O, got[i].O) || !slices.Equal(want[i].LSE, got[i].LSE) {
					t.Fatalf("queued step %d (layer %d) differs from the synchronous step", i, i%layers)
				}
			}
		})
	}
}
