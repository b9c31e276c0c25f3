package kernels_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
)

func newCPU(t *testing.T) kernels.Backend {
	return kernels.NewCPU(kernels.CPUConfig{Workers: 3, AttendChunk: 8, ScoreChunk: 16})
}

func TestCPUConformance(t *testing.T) {
	backendtest.Run(t, newCPU)
}

func TestCPUConformanceDefaultChunks(t *testing.T) {
	backendtest.Run(t, func(*testing.T) kernels.Backend { return kernels.NewCPU(kernels.CPUConfig{}) })
}

// TestCPUNoAllocs checks that the hot path allocates nothing once warm.
func TestCPUNoAllocs(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2})
	defer be.Close()
	rng := rand.New(rand.NewPCG(1, 1))
	s := kernels.Shape{QHeads: 8, KVHeads: 2, HeadDim: 32, PageSize: 16}
	f := backendtest.NewFixture(rng, s, []int{3000, 100})
	ctx := context.Background()
	scores := make([]float32, len(f.Batch.Pages)*s.KVHeads)
	lists := backendtest.DenseLists(f, kernels.GroupMax)
	o := make([]float32, len(f.Q))
	lse := make([]float32, 2*s.QHeads)
	var plan kernels.TopKPlan
	plan.Add(0, f.Batch.NumPages(0), 0, 16, 0)
	sel := make([]int32, 16)
	o2, lse2 := make([]float32, len(o)), make([]float32, len(lse))
	step := func() {
		if err := be.Score(ctx, s, f.Layer, &f.Batch, f.Q, kernels.GroupMax, scores); err != nil {
			t.Fatal(err)
		}
		if err := be.TopK(ctx, scores, &plan, sel); err != nil {
			t.Fatal(err)
		}
		if err := be.Attend(ctx, s, f.Layer, &f.Batch, f.Q, lists, o, lse); err != nil {
			t.Fatal(err)
		}
		if err := be.Merge(ctx, s.HeadDim, o, lse, o2, lse2); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if n := testing.AllocsPerRun(20, step); n != 0 {
		t.Fatalf("a warm step allocates %v times", n)
	}
}
