//go:build cuda

package cuda

import (
	"context"
	"os"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/plan"
)

// TestPrefillMatchesFloat64 runs the prefill conformance suite on the
// tensor-core prefill attention, bf16, f16 and fp8 pages, head
// dimensions 32, 64 and 128. The reference reads the pool's own values
// (fp8 records decoded as the CPU store decodes them). The tolerance
// covers q and the softmax weights rounded to the pages' type for the
// tensor cores (bf16: 8 bits of mantissa; fp8 pages are computed in bf16,
// their decoded keys and values rounded to it too).
func TestPrefillMatchesFloat64(t *testing.T) {
	for _, c := range []struct {
		dt  plan.DType
		tol float64
	}{{plan.BFloat16, 3e-2}, {plan.Float16, 5e-3}, {plan.FP8, 3e-2}} {
		t.Run(c.dt.String(), func(t *testing.T) {
			be := newBackend(t, c.dt)
			defer be.Close()
			backendtest.RunPrefill(t, be, []int{32, 64, 128}, c.tol)
			for _, a := range AttendKernels() {
				if a.DType == c.dt {
					t.Run(a.String(), func(t *testing.T) { backendtest.RunPrefill(t, variant{be, a}, []int{a.D}, c.tol) })
				}
			}
		})
	}
}

// variant runs PrefillTensor through one attention variant.
type variant struct {
	*Backend
	a AttendKernel
}

func (v variant) PrefillTensor(ctx context.Context, s kernels.Shape, pool, set any, seq uint64, start, n int, q, o decode.Tensor) error {
	return v.PrefillWith(ctx, v.a, s, pool, set, seq, start, n, q, o)
}

// TestGemmVariants checks every compiled GEMM variant on the projections
// of many rows (backendtest.RunGemmRows: odd shapes, split outputs, a
// residual, the norm).
func TestGemmVariants(t *testing.T) {
	be, err := New(Config{DType: plan.BFloat16, OwnGemm: true})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	for _, g := range GemmKernels() {
		t.Run(g.String(), func(t *testing.T) {
			be.SetGemm(g)
			backendtest.RunGemmRows(t, be)
		})
	}
}

// TestGemmCublas checks the projections of many rows through cuBLAS
// (backendtest.RunGemmRows); skipped where cuBLAS is not found.
func TestGemmCublas(t *testing.T) {
	be := newBackend(t, plan.BFloat16)
	defer be.Close()
	eng, why := be.GemmEngine(context.Background())
	if why != nil {
		t.Skipf("%s: %v", eng, why)
	}
	t.Logf("gemm: %s", eng)
	backendtest.RunGemmRows(t, be)
}

// TestBenchPrefill (QUESTRT_BENCH=1) times the prefill kernels on the
// shapes of a Llama-3.1-8B chunk of 2048 tokens: each projection as a
// GEMM (TFLOP/s), and the causal attention of the chunk (32 q heads, 8
// KV heads, D 128, bf16 pages) at the start of a sequence and after 30K
// and 126K earlier tokens, with CUDA events, median of 5.
func TestBenchPrefill(t *testing.T) {
	if os.Getenv("QUESTRT_BENCH") == "" {
		t.Skip("QUESTRT_BENCH not set")
	}
	ctx := context.Background()
	be, err := New(Config{DType: plan.BFloat16, OwnGemm: true})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	blas := newBackend(t, plan.BFloat16)
	defer blas.Close()
	eng, why := blas.GemmEngine(ctx)
	t.Logf("default gemm: %s (%v)", eng, why)
	const rows = 2048
	type shape struct {
		name string
		m, k int
	}
	for _, sh := range []shape{{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}} {
		w, err := be.RandomMatrix(ctx, sh.m, sh.k, plan.BFloat16, 1, 0.02, 0)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := be.AllocTensor(rows * sh.k)
		y, _ := be.AllocTensor(rows * sh.m)
		for _, g := range GemmKernels() {
			be.SetGemm(g)
			us, err := benchLaunches(ctx, be, 10, 5, func(int) error { return be.Gemv(ctx, y, w, x, decode.Tensor{}, rows) })
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("gemm %s %d x %d x %d %v: %.0f us, %.0f TFLOP/s", sh.name, rows, sh.m, sh.k, g, us, 2*float64(rows)*float64(sh.m)*float64(sh.k)/us/1e6)
		}
		be.SetGemm(defaultGemm)
		be.FreeTensor(x)
		be.FreeTensor(y)
		be.FreeMatrix(ctx, w)
		if why != nil {
			continue
		}
		w, _ = blas.RandomMatrix(ctx, sh.m, sh.k, plan.BFloat16, 1, 0.02, 0)
		x, _ = blas.AllocTensor(rows * sh.k)
		y, _ = blas.AllocTensor(rows * sh.m)
		us, err := benchLaunches(ctx, blas, 10, 5, func(int) error { return blas.Gemv(ctx, y, w, x, decode.Tensor{}, rows) })
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("gemm %s %d x %d x %d %s: %.0f us, %.0f TFLOP/s", sh.name, rows, sh.m, sh.k, eng, us, 2*float64(rows)*float64(sh.m)*float64(sh.k)/us/1e6)
		blas.FreeTensor(x)
		blas.FreeTensor(y)
		blas.FreeMatrix(ctx, w)
	}
	s := kernels.Shape{QHeads: 32, KVHeads: 8, HeadDim: 128, PageSize: 16}
	for _, start := range []int{0, 30720, 129024} {
		end := start + rows
		pages := end / s.PageSize
		pool, err := be.NewPool(ctx, pages, s.KVHeads, s.HeadDim, s.PageSize)
		if err != nil {
			t.Fatal(err)
		}
		set, _ := be.NewTables(ctx)
		table := make([]int32, pages)
		for i := range table {
			table[i] = int32(i)
		}
		if err := be.WriteTable(ctx, set, 1, 0, table, pages, pages); err != nil {
			t.Fatal(err)
		}
		q, _ := be.AllocTensor(rows * s.QHeads * s.HeadDim)
		o, _ := be.AllocTensor(rows * s.QHeads * s.HeadDim)
		for _, a := range AttendKernels() {
			if a.DType != plan.BFloat16 || a.D != s.HeadDim {
				continue
			}
			us, err := benchLaunches(ctx, be, 3, 5, func(int) error { return be.PrefillWith(ctx, a, s, pool, set, 1, start, rows, q, o) })
			if err != nil {
				t.Fatal(err)
			}
			// Causal FLOPs: 4 D per (query, key) pair over 32 heads.
			pairs := float64(rows)*float64(start) + float64(rows)*float64(rows+1)/2
			t.Logf("attend %d tokens after %d %v: %.0f us, %.0f TFLOP/s", rows, start, a, us, 4*float64(s.HeadDim)*float64(s.QHeads)*pairs/us/1e6)
		}
		be.FreeTensor(q)
		be.FreeTensor(o)
		be.FreeTables(ctx, set)
		be.FreePool(ctx, pool)
	}
}
