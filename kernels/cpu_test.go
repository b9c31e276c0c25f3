package kernels_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/plan"
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

// TestTopKBadPlan: malformed top-K plans are refused with an error and the
// output is left untouched (invariant 10); a good plan reports the output
// length it writes.
func TestTopKBadPlan(t *testing.T) {
	c := kernels.NewCPU(kernels.CPUConfig{})
	defer c.Close()
	scores := make([]float32, 10)
	good := func() *kernels.TopKPlan {
		var p kernels.TopKPlan
		p.Add(0, 6, 0, 3, 0)
		p.Add(6, 4, 0, 9, 3) // k > n writes n
		return &p
	}
	if n, err := good().Check(len(scores), 7); err != nil || n != 7 {
		t.Fatalf("good plan: output length %d, err %v; want 7, nil", n, err)
	}
	cases := []struct {
		name string
		edit func(*kernels.TopKPlan)
	}{
		{"ragged arrays", func(p *kernels.TopKPlan) { p.K = p.K[:1] }},
		{"candidates past the scores", func(p *kernels.TopKPlan) { p.N[1] = 5 }},
		{"negative offset", func(p *kernels.TopKPlan) { p.ScoreOff[0] = -1 }},
		{"negative k", func(p *kernels.TopKPlan) { p.K[0] = -1 }},
		{"output past the end", func(p *kernels.TopKPlan) { p.OutOff[1] = 4 }},
	}
	for _, tc := range cases {
		p := good()
		tc.edit(p)
		out := []int32{-7, -7, -7, -7, -7, -7, -7}
		if err := c.TopK(context.Background(), scores, p, out); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
		for i, x := range out {
			if x != -7 {
				t.Errorf("%s: output %d changed to %d", tc.name, i, x)
			}
		}
	}
}

// TestCPUConformanceFP8 runs the suite on emulated fp8 summaries: scores
// against the fp8 reference, the upper bound on the fp8 records, and
// every selection and attention test on top of them.
func TestCPUConformanceFP8(t *testing.T) {
	backendtest.RunWith(t, func(*testing.T) kernels.Backend {
		return kernels.NewCPU(kernels.CPUConfig{Workers: 3, AttendChunk: 8, ScoreChunk: 16, SummaryDType: plan.SummaryFP8})
	}, backendtest.Options{SummaryFP8: true})
}

// TestCPUConformanceKVFP8 runs the suite on fp8 K/V records (plan.FP8):
// the upper bound against exact scores on the dequantized stored keys,
// dense and sparse attention against float64 attention over them, tails
// 1/15/16/17, shuffled page tables; padding slots and unowned pages hold
// NaN codes, so reading one fails the test.
func TestCPUConformanceKVFP8(t *testing.T) {
	backendtest.RunWith(t, func(*testing.T) kernels.Backend {
		return kernels.NewCPU(kernels.CPUConfig{Workers: 3, AttendChunk: 8, ScoreChunk: 16})
	}, backendtest.Options{KVFP8: true})
}

// TestCPUNoAllocsFP8: scoring emulated fp8 records allocates nothing once
// warm (the per-worker record scratch is kept).
func TestCPUNoAllocsFP8(t *testing.T) {
	be := kernels.NewCPU(kernels.CPUConfig{Workers: 2, SummaryDType: plan.SummaryFP8})
	defer be.Close()
	rng := rand.New(rand.NewPCG(2, 2))
	s := kernels.Shape{QHeads: 8, KVHeads: 2, HeadDim: 32, PageSize: 16}
	f := backendtest.NewFixture(rng, s, []int{3000, 100})
	scores := make([]float32, len(f.Batch.Pages)*s.QHeads)
	score := func() {
		for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			if err := be.Score(context.Background(), s, f.Layer, &f.Batch, f.Q, mode, scores); err != nil {
				t.Fatal(err)
			}
		}
	}
	score()
	if n := testing.AllocsPerRun(20, score); n != 0 {
		t.Fatalf("a warm fp8 score allocates %v times", n)
	}
}

// TestTopKBestFirst: with TopKPlan.BestFirst the CPU backend writes each
// row's pages in plan.Compare's order (score descending, ties to the lower
// page, -0 tying with +0), exactly the first min(k, n) candidates of the
// row sorted that way, the same set as without BestFirst.
func TestTopKBestFirst(t *testing.T) {
	c := kernels.NewCPU(kernels.CPUConfig{Workers: 3})
	defer c.Close()
	rng := rand.New(rand.NewPCG(30, 1))
	type row struct{ n, k, levels int }
	rows := []row{{0, 3, 2}, {1, 1, 2}, {5, 0, 2}, {7, 7, 3}, {9, 20, 3}, {100, 7, 3}, {300, 64, 1}, {1000, 128, 1 << 20}, {4096, 128, 50}}
	for trial := range 20 {
		var pl kernels.TopKPlan
		var scores []float32
		outOff := 0
		for _, r := range rows {
			base := rng.IntN(50)
			pl.Add(len(scores), r.n, base, r.k, outOff)
			for range r.n {
				x := float32(rng.IntN(r.levels)-r.levels/2) * 0.5
				if x == 0 && rng.IntN(2) == 0 {
					x = float32(math.Copysign(0, -1)) // -0 ties with +0
				}
				scores = append(scores, x)
			}
			outOff += min(r.k, r.n)
		}
		asc := make([]int32, outOff)
		if err := c.TopK(context.Background(), scores, &pl, asc); err != nil {
			t.Fatal(err)
		}
		pl.BestFirst = true
		best := make([]int32, outOff)
		if err := c.TopK(context.Background(), scores, &pl, best); err != nil {
			t.Fatal(err)
		}
		for i, r := range rows {
			base := pl.Base[i]
			row := scores[pl.ScoreOff[i]:][:r.n]
			all := make([]plan.Candidate, r.n)
			for j, x := range row {
				all[j] = plan.Candidate{Score: x, Page: base + int32(j)}
			}
			slices.SortFunc(all, plan.Compare)
			m := min(r.k, r.n)
			got := best[pl.OutOff[i]:][:m]
			for j, c := range all[:m] {
				if got[j] != c.Page {
					t.Fatalf("trial %d row %d (n=%d k=%d): entry %d is page %d, want %d (%v)", trial, i, r.n, r.k, j, got[j], c.Page, got[:min(m, 10)])
				}
			}
			if a := asc[pl.OutOff[i]:][:m]; !slices.Equal(slices.Sorted(slices.Values(got)), a) {
				t.Fatalf("trial %d row %d: best first set %v, ascending %v", trial, i, got, a)
			}
		}
	}
}
