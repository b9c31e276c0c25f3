//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gorgonia.org/cu"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/replay"
)

func newBackend(t *testing.T, dt plan.DType) *Backend {
	t.Helper()
	b, err := New(Config{DType: dt})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestConformanceSmallChunks runs the suite with small work items (many
// items per row: the split-K merge and the score chunking get exercised).
func TestConformanceSmallChunks(t *testing.T) {
	backendtest.RunWith(t, func(t *testing.T) kernels.Backend {
		b, err := New(Config{DType: plan.BFloat16, AttendChunk: 3, ScoreChunk: 5})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, backendtest.Options{Quantize: backendtest.RoundBF16, Tol: 10})
}

// TestConformance runs the backend suite against float64 references of
// the stored (rounded) data, for every storage type. __expf and a
// different summation order allow 10x the CPU's fp32 tolerances.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		dt plan.DType
		q  func(float32) float32
	}{{plan.Float32, nil}, {plan.BFloat16, backendtest.RoundBF16}, {plan.Float16, backendtest.RoundF16}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			backendtest.RunWith(t, func(t *testing.T) kernels.Backend { return newBackend(t, c.dt) },
				backendtest.Options{Quantize: c.q, Tol: 10})
		})
	}
}

// TestAppendMatchesStore appends the same tokens to the CPU page store and
// to a device layer through the same page table (prefill, then one-token
// decode steps, tail lengths 1, 15, 16, 17): K, V and summaries read back
// equal the store's, rounded to the storage type.
func TestAppendMatchesStore(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		dt plan.DType
		q  func(float32) float32
	}{{plan.Float32, func(x float32) float32 { return x }}, {plan.BFloat16, backendtest.RoundBF16}, {plan.Float16, backendtest.RoundF16}} {
		b := newBackend(t, c.dt)
		const kvh, d, s = 2, 64, 16
		rng := rand.New(rand.NewPCG(1, uint64(c.dt)))
		for _, n := range []int{1, 15, 16, 17, 100} {
			st, err := pagestore.New(pagestore.Config{Layers: 1, Geometry: plan.Geometry{KVHeads: kvh, HeadDim: d, PageSize: s}, Capacity: 16})
			if err != nil {
				t.Fatal(err)
			}
			noise := st.Create() // shifts the physical ids
			st.Append(noise, 0, make([]float32, 20*kvh*d), make([]float32, 20*kvh*d))
			id := st.Create()
			dl, err := b.NewLayer(ctx, 16, kvh, d, s, c.dt)
			if err != nil {
				t.Fatal(err)
			}
			pre := n - min(n, 3)
			var steps []int
			if pre > 0 {
				steps = append(steps, pre)
			}
			for range n - pre {
				steps = append(steps, 1)
			}
			pos := 0
			for _, m := range steps {
				k := make([]float32, m*kvh*d)
				v := make([]float32, m*kvh*d)
				for i := range k {
					k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
				}
				if err := st.Append(id, 0, k, v); err != nil {
					t.Fatal(err)
				}
				pt, _ := st.AppendPageTable(nil, id)
				if err := b.Append(ctx, dl, pt, pos, k, v); err != nil {
					t.Fatal(err)
				}
				pos += m
			}
			got, err := b.Read(ctx, dl)
			if err != nil {
				t.Fatal(err)
			}
			pt, _ := st.AppendPageTable(nil, id)
			want := st.Layer(0)
			for lp, phys := range pt {
				valid := min(s, n-lp*s)
				for h := range kvh {
					blk := ((int(phys)*kvh + h) * s) * d
					for i := 0; i < valid*d; i++ {
						if got.K[blk+i] != c.q(want.K[blk+i]) || got.V[blk+i] != c.q(want.V[blk+i]) {
							t.Fatalf("%v n=%d page %d head %d elem %d: K/V differ", c.dt, n, lp, h, i)
						}
					}
					rec := (int(phys)*kvh + h) * 2 * d
					for j := range 2 * d {
						if got.Summary[rec+j] != c.q(want.Summary[rec+j]) {
							t.Fatalf("%v n=%d page %d head %d summary %d: %v, store %v", c.dt, n, lp, h, j, got.Summary[rec+j], want.Summary[rec+j])
						}
					}
				}
			}
			b.FreeLayer(ctx, dl)
		}
		b.Close()
	}
}

// TestReplayMatchesCPU: replay cases on the CUDA backend (f32 storage) give
// the CPU's selections and outputs, also with the pages and page tables
// only on the device (one shard and CP 2).
func TestReplayMatchesCPU(t *testing.T) {
	b := newBackend(t, plan.Float32)
	defer b.Close()
	for i, g := range []replay.GenConfig{
		{Tokens: 1, PageSize: 16, BudgetTokens: 32, QHeads: 4, KVHeads: 2, HeadDim: 8},
		{Tokens: 17, PageSize: 16, BudgetTokens: 16, QHeads: 2, KVHeads: 1, HeadDim: 16, LocalPages: 1},
		{Tokens: 3000, PageSize: 16, BudgetTokens: 256, QHeads: 32, KVHeads: 8, HeadDim: 128, LocalPages: 1},
		{Tokens: 3000, PageSize: 16, BudgetTokens: 256, QHeads: 32, KVHeads: 4, HeadDim: 64, GQA: "per_head", SinkPages: 1, LocalPages: 1},
	} {
		g.Seed = uint64(i + 1)
		c := replay.Generate(g)
		cpu, err := replay.Run(context.Background(), c, replay.Options{Selector: plan.Quest})
		if err != nil {
			t.Fatal(err)
		}
		gpu, err := replay.Run(context.Background(), c, replay.Options{Selector: plan.Quest, Backend: b})
		if err != nil {
			t.Fatal(err)
		}
		compareResults(t, i, cpu, gpu)
		// Pages and page tables only on the GPU: one shard, and CP 2
		// (where the case has at least a page per rank).
		for _, cp := range []int{1, 2} {
			if cp > c.Pages() {
				continue
			}
			dev, err := replay.Run(context.Background(), c, replay.Options{Selector: plan.Quest, Backend: b, DeviceResident: true, CP: cp, Selection: engine.Exact})
			if err != nil {
				t.Fatal(err)
			}
			compareResults(t, i, cpu, dev)
		}
	}
}

func compareResults(t *testing.T, i int, a, b *replay.Result) {
	t.Helper()
	for h := range a.SelectedPages {
		if !slices.Equal(a.SelectedPages[h], b.SelectedPages[h]) {
			t.Fatalf("case %d head %d: pages %v vs %v", i, h, a.SelectedPages[h], b.SelectedPages[h])
		}
		for j := range a.Output[h] {
			if math.Abs(float64(a.Output[h][j]-b.Output[h][j])) > 1e-4*max(1, math.Abs(float64(a.Output[h][j]))) {
				t.Fatalf("case %d head %d: output %v vs %v", i, h, a.Output[h][j], b.Output[h][j])
			}
		}
	}
}

// TestShardsShareOneGPU: a CP x TP engine whose shards use two backends (two
// contexts) on one GPU gives the single-CPU-shard result.
func TestShardsShareOneGPU(t *testing.T) {
	b0, b1 := newBackend(t, plan.Float32), newBackend(t, plan.Float32)
	defer b0.Close()
	defer b1.Close()
	c := replay.Generate(replay.GenConfig{Tokens: 5000, PageSize: 16, BudgetTokens: 320, QHeads: 16, KVHeads: 4, HeadDim: 64, LocalPages: 1, Seed: 7})
	cpu, err := replay.Run(context.Background(), c, replay.Options{Selector: plan.Quest})
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.DefaultConfig()
	cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 1, 16, 4, 64, 16
	cfg.CP, cfg.TP, cfg.CapacityPages = 2, 2, 400
	cfg.Policy = c.Policy(plan.Quest)
	cfg.Backends = func(tp, cp int) kernels.Backend {
		if (tp+cp)%2 == 0 {
			return b0
		}
		return b1
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	id, _ := e.Create(plan.Striped)
	if err := e.Append(id, 0, replay.TokenMajor(c.Keys, 64), replay.TokenMajor(c.Values, 64)); err != nil {
		t.Fatal(err)
	}
	var q []float32
	for _, r := range c.Query {
		q = append(q, r...)
	}
	var res engine.Result
	if err := e.Step(context.Background(), 0, []engine.Request{{Seq: id, Q: q}}, engine.StepOptions{Diagnostics: true}, &res); err != nil {
		t.Fatal(err)
	}
	gpu := replay.NewResult(plan.Quest, 16, 64, cpu.Pages, res.O, res.LSE, res.Diag[0])
	compareResults(t, 0, cpu, gpu)
}

// TestTopKPaths checks the threshold top-K, the sliced two-stage top-K, the
// multi-block radix select and the one-block radix select against a full
// sort, with many ties (rows of one level make every score a candidate,
// which sends the threshold kernel to its radix fallback), rows of different lengths and budgets, partial
// last tiles, k >= n, k >= the number of tiles, and slices shorter than k.
func TestTopKPaths(t *testing.T) {
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	rng := rand.New(rand.NewPCG(3, 3))
	type row struct{ n, k, levels int }
	check := func(name string, rows []row, path string) {
		t.Helper()
		var plan kernels.TopKPlan
		var scores []float32
		off := 0
		for _, r := range rows {
			plan.Add(len(scores), r.n, 3, r.k, off)
			for range r.n {
				scores = append(scores, float32(rng.IntN(r.levels))*0.5-100)
			}
			off += r.k
		}
		if got := topkPath(&plan); got != path {
			t.Fatalf("%s: path %s, want %s", name, topkPath(&plan), path)
		}
		out := make([]int32, off)
		if err := b.TopK(context.Background(), scores, &plan, out); err != nil {
			t.Fatal(err)
		}
		for i, r := range rows {
			want := backendtest.RefTopK(scores[plan.ScoreOff[i]:][:r.n], r.k)
			got := out[plan.OutOff[i]:][:min(r.k, r.n)]
			for j := range want {
				if got[j] != want[j]+3 {
					t.Fatalf("%s row %d (n=%d k=%d): entry %d is %d, want %d", name, i, r.n, r.k, j, got[j], want[j]+3)
				}
			}
		}
	}
	check("thr: one long row", []row{{65536, 255, 1 << 20}}, "thr")
	check("thr: mixed budgets, ties, partial tiles", []row{{65536, 255, 1 << 20}, {65535, 127, 7}, {60001, 2, 1}, {50003, 200, 1000}, {9, 3, 2}, {17, 16, 1 << 20}, {1000, 511, 50}, {4099, 300, 1 << 20}}, "thr")
	check("thr: k >= tiles, k >= n", []row{{1000, 200, 1 << 20}, {30, 40, 3}, {8191, 512, 1 << 20}, {3000, 100, 5}}, "thr")
	check("thr: k = 1", []row{{40000, 1, 3}, {40000, 1, 1 << 20}}, "thr")
	check("thr: a few large scores", []row{{65536, 255, 3}, {65536, 64, 2}}, "thr")
	check("two stages", []row{{100000, 255, 1 << 20}, {70000, 127, 7}, {65536, 2, 1}}, "two-stage")
	check("too long for two stages", []row{{100000, 511, 1000}}, "radix")
	check("radix: long rows, mixed budgets, ties", []row{{200000, 255, 1 << 20}, {100000, 4096, 7}, {70000, 1, 1}, {9, 3, 2}, {17, 40, 3}}, "radix")
	check("k too large for thr", []row{{3000, 600, 5}, {1000, 200, 1 << 20}, {30, 40, 3}, {17, 16, 1 << 20}}, "one-block")
}

// TestDeviceResidentEngine runs the same workload (prefill, decode steps
// with new tokens, fork, rollback inside a page, release and recycling)
// on a CPU engine and on a CP 2 x TP 2 engine whose shards keep their
// pages only in GPU memory (f32), with exact and replicated selection:
// selections must match and outputs agree to fp32 tolerance. The GPU
// engine's four ranks share one backend, or each has its own (a context
// each, as on four devices; on one GPU they share it).
func TestDeviceResidentEngine(t *testing.T) {
	for _, sel := range []engine.Selection{engine.Exact, engine.Replicated} {
		for _, contexts := range []int{1, 4} {
			t.Run(fmt.Sprintf("%v/contexts=%d", sel, contexts), func(t *testing.T) { testDeviceResidentEngine(t, sel, contexts) })
		}
	}
}

func testDeviceResidentEngine(t *testing.T, sel engine.Selection, contexts int) {
	bes := make([]*Backend, contexts)
	for i := range bes {
		bes[i] = newBackend(t, plan.Float32)
		defer bes[i].Close()
	}
	rng := rand.New(rand.NewPCG(9, 9))
	mk := func(gpu bool) *engine.Engine {
		cfg := engine.DefaultConfig()
		cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = 2, 16, 4, 64, 16
		cfg.CP, cfg.TP, cfg.CapacityPages, cfg.Selection = 2, 2, 200, sel
		cfg.Policy.DenseLayers = 1
		cfg.Policy.BudgetTokens = 128
		if gpu {
			cfg.Backends = func(tp, cp int) kernels.Backend { return bes[(tp*cfg.CP+cp)%len(bes)] }
			cfg.DeviceResident = true
		}
		e, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	cpu, gpu := mk(false), mk(true)
	defer cpu.Close()
	defer gpu.Close()
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	for _, e := range []*engine.Engine{cpu, gpu} {
		if id, err := e.Create(plan.Striped); err != nil || id != 1 {
			t.Fatalf("create: %v %v", id, err)
		}
	}
	for l := range 2 {
		k, v := vec(1000*4*64), vec(1000*4*64)
		for _, e := range []*engine.Engine{cpu, gpu} {
			if err := e.Append(1, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	step := func(seqs []engine.SeqID, token bool) {
		t.Helper()
		for l := range 2 {
			var reqs []engine.Request
			for _, id := range seqs {
				r := engine.Request{Seq: id, Q: vec(16 * 64)}
				if token {
					r.K, r.V = vec(4*64), vec(4*64)
				}
				reqs = append(reqs, r)
			}
			var rc, rg engine.Result
			if err := cpu.Step(context.Background(), l, reqs, engine.StepOptions{Diagnostics: true}, &rc); err != nil {
				t.Fatal(err)
			}
			if err := gpu.Step(context.Background(), l, reqs, engine.StepOptions{Diagnostics: true}, &rg); err != nil {
				t.Fatal(err)
			}
			for i := range seqs {
				for h := range 16 {
					if !slices.Equal(rc.Diag[i].Selected[h], rg.Diag[i].Selected[h]) {
						t.Fatalf("layer %d seq %d head %d: pages %v vs %v", l, i, h, rc.Diag[i].Selected[h], rg.Diag[i].Selected[h])
					}
				}
			}
			for j := range rc.O {
				if math.Abs(float64(rc.O[j]-rg.O[j])) > 1e-4*max(1, math.Abs(float64(rc.O[j]))) {
					t.Fatalf("layer %d: output %d %v vs %v", l, j, rc.O[j], rg.O[j])
				}
			}
		}
	}
	step([]engine.SeqID{1}, true)
	for _, e := range []*engine.Engine{cpu, gpu} {
		if c, err := e.Fork(1); err != nil || c != 2 {
			t.Fatalf("fork: %v %v", c, err)
		}
	}
	step([]engine.SeqID{1, 2}, true)
	step([]engine.SeqID{1, 2}, true)
	for _, e := range []*engine.Engine{cpu, gpu} {
		if err := e.Rollback(2, 7); err != nil {
			t.Fatal(err)
		}
	}
	step([]engine.SeqID{1, 2}, false)
	step([]engine.SeqID{2}, true)
	for _, e := range []*engine.Engine{cpu, gpu} {
		if err := e.Release(1); err != nil {
			t.Fatal(err)
		}
	}
	for l := range 2 { // recycles the released pages
		k, v := vec(300*4*64), vec(300*4*64)
		for _, e := range []*engine.Engine{cpu, gpu} {
			if err := e.Append(2, l, k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	step([]engine.SeqID{2}, true)
}

// TestTopKNaN: NaN scores (from non-finite data in 16-bit storage, say)
// are ranked the same way by the threshold kernel as by the radix select,
// which orders them by their key; the threshold kernel must not leave
// output slots unwritten when NaNs hide among the tile maxima.
func TestTopKNaN(t *testing.T) {
	b := newBackend(t, plan.BFloat16)
	defer b.Close()
	rng := rand.New(rand.NewPCG(4, 4))
	nan := float32(math.NaN())
	var plan kernels.TopKPlan
	var scores []float32
	off := 0
	for i, r := range []struct{ n, k, nans int }{{20000, 255, 20000}, {20000, 255, 19000}, {4000, 50, 3}, {65536, 511, 100}, {800, 100, 795}} {
		row := make([]float32, r.n)
		for j := range row {
			row[j] = rng.Float32()
		}
		for _, j := range rng.Perm(r.n)[:r.nans] {
			row[j] = nan
		}
		plan.Add(len(scores), r.n, i, r.k, off)
		scores = append(scores, row...)
		off += r.k
	}
	if !topkThr(&plan) {
		t.Fatal("plan does not take the threshold top-K")
	}
	thr := make([]int32, off)
	radix := make([]int32, off)
	for i := range thr {
		thr[i], radix[i] = -7, -7
	}
	if err := b.TopK(context.Background(), scores, &plan, thr); err != nil {
		t.Fatal(err)
	}
	err := b.do(context.Background(), func() error {
		sp, err := upload(b, "nan.scores", scores)
		if err != nil {
			return err
		}
		var ptrs [5]cu.DevicePtr
		for i, a := range [][]int32{plan.ScoreOff, plan.N, plan.Base, plan.K, plan.OutOff} {
			if ptrs[i], err = upload(b, fmt.Sprintf("nan.plan%d", i), a); err != nil {
				return err
			}
		}
		op, err := upload(b, "nan.out", radix)
		if err != nil {
			return err
		}
		if err := b.launch("quest_topk", [3]int{plan.Rows(), 1, 1}, 1024, 0, u(sp), u(ptrs[0]), u(ptrs[1]), u(ptrs[2]), u(ptrs[3]), u(ptrs[4]), u(op)); err != nil {
			return err
		}
		return download(b, radix, op)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range thr {
		if thr[i] != radix[i] || thr[i] < 0 {
			t.Fatalf("entry %d: threshold kernel %d, radix select %d", i, thr[i], radix[i])
		}
	}
}
