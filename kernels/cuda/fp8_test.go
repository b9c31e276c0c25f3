//go:build cuda

package cuda

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/plan"
)

func newFP8Backend(t *testing.T, dt plan.DType, scoreChunk int) *Backend {
	t.Helper()
	b, err := New(Config{DType: dt, SummaryDType: plan.SummaryFP8, ScoreChunk: scoreChunk})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFP8Conformance runs the backend suite with fp8 summaries (host-array
// inputs: uploaded, then encoded on the device) for f32 and bf16 K/V:
// scores against the brute-force fp8 reference of the stored keys' boxes,
// the upper bound on those scores, full budget equals dense, shuffle,
// tail lengths 1/15/16/17, steps and ranks.
func TestFP8Conformance(t *testing.T) {
	for _, c := range []struct {
		dt    plan.DType
		q     func(float32) float32
		chunk int
	}{{plan.Float32, nil, 0}, {plan.BFloat16, backendtest.RoundBF16, 0}, {plan.BFloat16, backendtest.RoundBF16, 5}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			backendtest.RunWith(t, func(t *testing.T) kernels.Backend { return newFP8Backend(t, c.dt, c.chunk) },
				backendtest.Options{Quantize: c.q, Tol: 10, SummaryFP8: true})
		})
	}
}

// refCode is the value of an E4M3fn code from the OCP FP8 definition.
func refCode(c uint8) float64 {
	e, m := int(c>>3&0xf), float64(c&7)
	v := math.Pow(2, -6) * m / 8
	if e > 0 {
		v = math.Pow(2, float64(e-7)) * (1 + m/8)
	}
	if e == 15 && m == 7 {
		v = math.NaN()
	}
	if c&0x80 != 0 {
		v = -v
	}
	return v
}

// checkStored reads back page phys's master records and fp8 records from
// dl and checks, per KV head: the fp8 record is the brute-force reference
// of the master box (backendtest.RefFP8Box), and (upper bound on the
// stored records) its box contains each of the page's first valid keys
// read back from the device, so the bound of random queries covers their
// q.k in float64.
func checkStored(t *testing.T, b *Backend, dl *DeviceLayer, phys int32, valid int, rng *rand.Rand) {
	t.Helper()
	ctx := context.Background()
	kvh, d, s := dl.KVHeads, dl.HeadDim, dl.PageSize
	got, err := b.ReadPages(ctx, dl, []int32{phys})
	if err != nil {
		t.Fatal(err)
	}
	codes, scales, err := b.ReadFP8(ctx, dl, []int32{phys})
	if err != nil {
		t.Fatal(err)
	}
	for h := range kvh {
		rec := got.Summary[h*2*d:][:2*d]
		cs, sc := codes[h*2*d:][:2*d], float64(scales[h])
		dec := make([]float64, 2*d)
		for i, c := range cs {
			if c&0x7f == 0x7f {
				t.Fatalf("page %d head %d: NaN code at %d", phys, h, i)
			}
			dec[i] = refCode(c) * sc
		}
		if valid == 0 {
			for i, x := range dec {
				if i < d && !math.IsInf(x, 1) || i >= d && !math.IsInf(x, -1) {
					t.Fatalf("page %d head %d: empty page's fp8 record decodes to %v (codes %x, scale %v)", phys, h, dec, cs, sc)
				}
			}
			continue
		}
		lo, hi := make([]float64, d), make([]float64, d)
		for j := range d {
			lo[j], hi[j] = float64(rec[j]), float64(rec[d+j])
		}
		wlo, whi := backendtest.RefFP8Box(lo, hi)
		for j := range d {
			if dec[j] != wlo[j] || dec[d+j] != whi[j] {
				t.Fatalf("page %d head %d dim %d: fp8 box [%v, %v], reference [%v, %v] of the master [%v, %v]", phys, h, j, dec[j], dec[d+j], wlo[j], whi[j], lo[j], hi[j])
			}
		}
		for range 8 {
			q := make([]float64, d)
			var u float64
			for j := range q {
				q[j] = rng.NormFloat64()
				u += max(q[j]*dec[j], q[j]*dec[d+j])
			}
			for tok := range valid {
				k := got.K[(h*s+tok)*d:][:d]
				var dot float64
				for j := range d {
					dot += q[j] * float64(k[j])
				}
				if dot > u {
					t.Fatalf("page %d head %d token %d: q.k = %v above the stored fp8 bound %v", phys, h, tok, dot, u)
				}
			}
		}
	}
}

// TestFP8StoredRecords appends tokens to a device pool (a prefill, then
// one-token steps: tail lengths 1, 15, 16, 17 and longer), rescans,
// copies and resets pages, and after each checks the fp8 records read
// back from the device (checkStored): encoded from the master records
// exactly as the reference encodes them, and an upper bound of every
// stored key. The device scores of the pool then match the float64
// scores of those records.
func TestFP8StoredRecords(t *testing.T) {
	ctx := context.Background()
	for _, dt := range []plan.DType{plan.Float32, plan.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			b := newFP8Backend(t, dt, 0)
			defer b.Close()
			const kvh, d, s, pool = 2, 128, 16, 24
			rng := rand.New(rand.NewPCG(7, uint64(dt)))
			for _, n := range []int{1, 15, 16, 17, 100} {
				dl, err := b.NewLayer(ctx, pool, kvh, d, s, dt)
				if err != nil {
					t.Fatal(err)
				}
				perm := rng.Perm(pool)
				np := (n + s - 1) / s
				pt := make([]int32, np)
				for i := range pt {
					pt[i] = int32(perm[i])
				}
				// Keys of very different magnitudes per page and head.
				scale := math.Pow(2, float64(rng.IntN(30)-15))
				pos := 0
				for pos < n {
					m := 1
					if pos == 0 {
						m = max(n-3, 1)
					}
					k := make([]float32, m*kvh*d)
					v := make([]float32, m*kvh*d)
					for i := range k {
						k[i], v[i] = float32(rng.NormFloat64()*scale), float32(rng.NormFloat64())
					}
					if err := b.Append(ctx, dl, pt, pos, k, v); err != nil {
						t.Fatal(err)
					}
					pos += m
					for lp := range (pos + s - 1) / s {
						checkStored(t, b, dl, pt[lp], min(s, pos-lp*s), rng)
					}
				}
				// Scores of the pool against the stored records.
				q := make([]float32, 4*d)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				sh := kernels.Shape{QHeads: 4, KVHeads: kvh, HeadDim: d, PageSize: s}
				bt := &kernels.Batch{Indptr: []int32{0, int32(np)}, Pages: pt, LastLen: []int32{int32(n - (np-1)*s)}}
				out := make([]float32, np*4)
				if err := b.Score(ctx, sh, kernels.Layer{Device: dl}, bt, q, kernels.PerHead, out); err != nil {
					t.Fatal(err)
				}
				codes, scales, err := b.ReadFP8(ctx, dl, pt)
				if err != nil {
					t.Fatal(err)
				}
				for lp := range np {
					for qh := range 4 {
						h := qh / 2
						cs := codes[(lp*kvh+h)*2*d:][:2*d]
						var u float64
						for j := range d {
							x := float64(q[qh*d+j])
							u += max(x*refCode(cs[j]), x*refCode(cs[d+j])) * float64(scales[lp*kvh+h])
						}
						if got := float64(out[qh*np+lp]); math.Abs(got-u) > 1e-4*max(1, math.Abs(u)) {
							t.Fatalf("n=%d page %d head %d: device score %v, float64 score of the stored record %v", n, lp, qh, got, u)
						}
					}
				}
				// Rescan to fewer keys, copy, reset.
				last := pt[np-1]
				valid := n - (np-1)*s
				if valid > 1 {
					if err := b.Rescan(ctx, dl, []int32{last}, valid-1); err != nil {
						t.Fatal(err)
					}
					checkStored(t, b, dl, last, valid-1, rng)
				}
				dst := int32(perm[pool-1])
				if err := b.CopyPage(ctx, dl, dst, pt[0]); err != nil {
					t.Fatal(err)
				}
				c0, s0, _ := b.ReadFP8(ctx, dl, []int32{pt[0]})
				c1, s1, err := b.ReadFP8(ctx, dl, []int32{dst})
				if err != nil {
					t.Fatal(err)
				}
				if string(c0) != string(c1) || s0[0] != s1[0] || s0[1] != s1[1] {
					t.Fatalf("n=%d: the copied page's fp8 records differ from the source's", n)
				}
				if err := b.Rescan(ctx, dl, []int32{last}, 0); err != nil {
					t.Fatal(err)
				}
				checkStored(t, b, dl, last, 0, rng)
				if err := b.FreeLayer(ctx, dl); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestFP8MatchesCPU: the CUDA backend's fp8 scores on a device pool equal
// the CPU backend's emulated fp8 scores of the same data (f32 storage:
// the same master records, so the same codes), within fp32 summation
// error, for both GQA modes and several group sizes; at full budget the
// fused step equals the CPU's dense attention.
func TestFP8MatchesCPU(t *testing.T) {
	for _, kernel := range []string{"", ScoreFP8CUDACores} {
		t.Run("kernel="+kernel, func(t *testing.T) {
			b, err := New(Config{DType: plan.Float32, SummaryDType: plan.SummaryFP8, ScoreKernel: kernel})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			testFP8MatchesCPU(t, b)
		})
	}
}

func testFP8MatchesCPU(t *testing.T, b *Backend) {
	ctx := context.Background()
	cpu := kernels.NewCPU(kernels.CPUConfig{SummaryDType: plan.SummaryFP8})
	defer cpu.Close()
	rng := rand.New(rand.NewPCG(9, 9))
	// The tensor-core kernel takes D 64 and 128 up to 16 query heads per
	// KV head (one or two row halves, partly empty with 12); D 32 runs
	// the CUDA-core kernel. Query scales of 3e4 and 1e-7 leave fp16's
	// range without the kernel's per-row power-of-two scaling.
	for _, c := range []struct {
		s      kernels.Shape
		qscale float32
	}{
		{kernels.Shape{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}, 1},
		{kernels.Shape{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}, 3e4},
		{kernels.Shape{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}, 1e-7},
		{kernels.Shape{QHeads: 8, KVHeads: 1, HeadDim: 64, PageSize: 16}, 1},
		{kernels.Shape{QHeads: 32, KVHeads: 2, HeadDim: 128, PageSize: 16}, 1},
		{kernels.Shape{QHeads: 24, KVHeads: 2, HeadDim: 64, PageSize: 16}, 1},
		{kernels.Shape{QHeads: 6, KVHeads: 2, HeadDim: 32, PageSize: 4}, 1},
	} {
		s := c.s
		f := backendtest.NewFixture(rng, s, []int{3000, 17, 1})
		for i := range f.Q {
			f.Q[i] *= c.qscale
		}
		pool := len(f.Layer.Summary) / (s.KVHeads * 2 * s.HeadDim)
		dl, err := b.NewLayer(ctx, pool, s.KVHeads, s.HeadDim, s.PageSize, plan.Float32)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Upload(ctx, dl, f.Layer); err != nil {
			t.Fatal(err)
		}
		for _, mode := range []kernels.GQAMode{kernels.GroupMax, kernels.PerHead} {
			rows := s.Rows(mode)
			want := make([]float32, len(f.Batch.Pages)*rows)
			got := make([]float32, len(want))
			if err := cpu.Score(ctx, s, f.Layer, &f.Batch, f.Q, mode, want); err != nil {
				t.Fatal(err)
			}
			if err := b.Score(ctx, s, kernels.Layer{Device: dl}, &f.Batch, f.Q, mode, got); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Abs(float64(got[i]-want[i])) > 1e-4*max(float64(c.qscale), math.Abs(float64(want[i]))) {
					t.Fatalf("%+v q x%g %v: score %d: cuda %v, cpu %v", s, c.qscale, mode, i, got[i], want[i])
				}
			}
			if c.qscale != 1 {
				continue // the scale tests the scores; attention has its own tests
			}
			// Full budget: every page ranked and chosen (fp8 scores
			// decide nothing), the fused step equals dense attention.
			tp, lists := backendtest.StepLists(f, mode, 0, []int{1 << 20, 1 << 20, 1 << 20})
			dense := backendtest.DenseLists(f, mode)
			o, lse := make([]float32, len(f.Q)), make([]float32, f.Batch.Len()*s.QHeads)
			wo, wl := make([]float32, len(o)), make([]float32, len(lse))
			if err := cpu.Attend(ctx, s, f.Layer, &f.Batch, f.Q, dense, wo, wl); err != nil {
				t.Fatal(err)
			}
			if err := b.Step(ctx, s, kernels.Layer{Device: dl}, &f.Batch, f.Q, tp, lists, o, lse); err != nil {
				t.Fatal(err)
			}
			for i := range o {
				if math.Abs(float64(o[i]-wo[i])) > 1e-3*max(1, math.Abs(float64(wo[i]))) {
					t.Fatalf("%+v %v: full-budget step o[%d] = %v, dense %v", s, mode, i, o[i], wo[i])
				}
			}
			for i := range lse {
				if math.Abs(float64(lse[i]-wl[i])) > 1e-3*max(1, math.Abs(float64(wl[i]))) {
					t.Fatalf("%+v %v: full-budget step lse[%d] = %v, dense %v", s, mode, i, lse[i], wl[i])
				}
			}
		}
		b.FreeLayer(ctx, dl)
	}
}

// TestFP8DeviceResidentEngine runs one workload (prefill, decode steps
// with new tokens, fork, rollback inside a page, release and recycling)
// on a CPU engine emulating fp8 summaries and on a CP 2 x TP 2 engine
// whose shards keep their pages (and fp8 records) only in GPU memory
// (f32 storage: the same master records, so the same codes), with exact
// and replicated selection: selections must match and outputs agree to
// fp32 tolerance. The page operations the shards make on the device
// (writes, rescans, copies on fork, recycled pages) all go through the
// fp8 re-encoding.
func TestFP8DeviceResidentEngine(t *testing.T) {
	for _, sel := range []engine.Selection{engine.Exact, engine.Replicated} {
		t.Run(sel.String(), func(t *testing.T) {
			b := newFP8Backend(t, plan.Float32, 0)
			defer b.Close()
			rng := rand.New(rand.NewPCG(11, 11))
			const layers, qh, kvh, d = 2, 16, 4, 64
			mk := func(gpu bool) *engine.Engine {
				cfg := engine.DefaultConfig()
				cfg.Layers, cfg.QHeads, cfg.KVHeads, cfg.HeadDim, cfg.PageSize = layers, qh, kvh, d, 16
				cfg.CP, cfg.TP, cfg.CapacityPages, cfg.Selection = 2, 2, 200, sel
				cfg.Policy.DenseLayers = 1
				cfg.Policy.BudgetTokens = 128
				cfg.Policy.SummaryDType = plan.SummaryFP8 // the CPU engine's own backend emulates fp8
				if gpu {
					cfg.Backend, cfg.DeviceResident = b, true
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
			both := []*engine.Engine{cpu, gpu}
			vec := func(n int) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				return v
			}
			for _, e := range both {
				if id, err := e.Create(plan.Striped); err != nil || id != 1 {
					t.Fatalf("create: %v %v", id, err)
				}
			}
			appendAll := func(id engine.SeqID, n int) {
				for l := range layers {
					k, v := vec(n*kvh*d), vec(n*kvh*d)
					for _, e := range both {
						if err := e.Append(id, l, k, v); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			appendAll(1, 1000)
			step := func(seqs []engine.SeqID, token bool) {
				t.Helper()
				for l := range layers {
					var reqs []engine.Request
					for _, id := range seqs {
						r := engine.Request{Seq: id, Q: vec(qh * d)}
						if token {
							r.K, r.V = vec(kvh*d), vec(kvh*d)
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
						for h := range qh {
							if !slices.Equal(rc.Diag[i].Selected[h], rg.Diag[i].Selected[h]) {
								t.Fatalf("layer %d seq %d head %d: pages %v (cpu) vs %v (cuda)", l, i, h, rc.Diag[i].Selected[h], rg.Diag[i].Selected[h])
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
			for _, e := range both {
				if c, err := e.Fork(1); err != nil || c != 2 {
					t.Fatalf("fork: %v %v", c, err)
				}
			}
			step([]engine.SeqID{1, 2}, true)
			step([]engine.SeqID{1, 2}, true)
			for _, e := range both {
				if err := e.Rollback(2, 7); err != nil {
					t.Fatal(err)
				}
			}
			step([]engine.SeqID{1, 2}, false)
			step([]engine.SeqID{2}, true)
			for _, e := range both {
				if err := e.Release(1); err != nil {
					t.Fatal(err)
				}
			}
			appendAll(2, 300) // recycles the released pages
			step([]engine.SeqID{2}, true)
		})
	}
}
