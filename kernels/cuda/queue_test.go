//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/shard"
)

// TestQueuedStepsMatchStep queues every layer of a decode step on the GPU
// (Shard.Step with Queue, one Sync) and compares with the same steps run
// synchronously: bit-identical outputs. The staging buffer is cut back to
// 1 MiB before each queue, so that 40 queued steps of 8 sequences (about
// 280 KB each) make it start over in the middle of the queue (queued
// outputs settled there; checked), and a synchronous step in the middle
// of the queue settles the ones before it.
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
			if err := be.do(ctx, func() error {
				if err := cu.Synchronize(); err != nil {
					return err
				}
				be.settle()
				be.pin.free()
				var err error
				be.pin, err = allocPinned(1 << 20)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			wraps := be.stageWraps
			mid := len(reqs) / 2
			var midRes shard.StepResult
			for i, r := range reqs {
				if err := sh.Step(ctx, i%layers, r, shard.StepOptions{Queue: true}, &got[i]); err != nil {
					t.Fatal(err)
				}
				if !got[i].Queued {
					t.Fatalf("step %d not queued", i)
				}
				if i == mid { // a synchronous step settles the queue so far
					if err := sh.Step(ctx, i%layers, r, shard.StepOptions{}, &midRes); err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(midRes.O, want[i].O) || !slices.Equal(got[i].O, want[i].O) {
						t.Fatalf("step %d: the synchronous step in the queue, or the queued output it settled, differs", i)
					}
				}
			}
			if err := sh.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if c.batch == 8 && be.stageWraps == wraps {
				t.Fatal("the staging buffer never started over inside the queue")
			}
			for i := range reqs {
				if !slices.Equal(want[i].O, got[i].O) || !slices.Equal(want[i].LSE, got[i].LSE) {
					t.Fatalf("queued step %d (layer %d) differs from the synchronous step", i, i%layers)
				}
			}
		})
	}
}
