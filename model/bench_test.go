package model

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// BenchmarkMatmul measures the Linear products of passkey-llama-v2's
// shapes (hidden 384, MLP 1024) for one token (decode) and 256 tokens
// (a prefill chunk), reporting GFLOP/s.
func BenchmarkMatmul(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, c := range []struct{ n, in, out int }{{1, 384, 1024}, {1, 1024, 384}, {256, 384, 1024}, {256, 1024, 384}} {
		x := randVecs(rng, c.n*c.in, 1)
		w := randVecs(rng, c.out*c.in, 1)
		y := make([]float32, c.n*c.out)
		b.Run(fmt.Sprintf("n%d_%dx%d", c.n, c.in, c.out), func(b *testing.B) {
			for b.Loop() {
				matmulT(0, y, x, w, c.n, c.in, c.out)
			}
			b.ReportMetric(2*float64(c.n*c.in*c.out)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkMatmulGonum runs BenchmarkMatmul's shapes through gonum's
// BLAS (blas32.Gemv for one token, blas32.Gemm otherwise; y = x W^T as
// the model's Linear layers compute it), the library the model executor
// would use instead of its own tiled kernel: run both in one `go test
// -bench 'Matmul'` to compare.
func BenchmarkMatmulGonum(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, c := range []struct{ n, in, out int }{{1, 384, 1024}, {1, 1024, 384}, {256, 384, 1024}, {256, 1024, 384}} {
		x := randVecs(rng, c.n*c.in, 1)
		w := randVecs(rng, c.out*c.in, 1)
		y := make([]float32, c.n*c.out)
		W := blas32.General{Rows: c.out, Cols: c.in, Stride: c.in, Data: w}
		b.Run(fmt.Sprintf("n%d_%dx%d", c.n, c.in, c.out), func(b *testing.B) {
			for b.Loop() {
				if c.n == 1 {
					blas32.Gemv(blas.NoTrans, 1, W, blas32.Vector{N: c.in, Inc: 1, Data: x}, 0, blas32.Vector{N: c.out, Inc: 1, Data: y})
				} else {
					X := blas32.General{Rows: c.n, Cols: c.in, Stride: c.in, Data: x}
					Y := blas32.General{Rows: c.n, Cols: c.out, Stride: c.out, Data: y}
					blas32.Gemm(blas.NoTrans, blas.Trans, 1, X, W, 0, Y)
				}
			}
			b.ReportMetric(2*float64(c.n*c.in*c.out)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// TestMatmulMatchesGonum: the model's product equals gonum's BLAS on the
// benchmark's shapes (float32 rounding).
func TestMatmulMatchesGonum(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, c := range []struct{ n, in, out int }{{1, 384, 1024}, {3, 100, 37}, {256, 1024, 384}} {
		x := randVecs(rng, c.n*c.in, 1)
		w := randVecs(rng, c.out*c.in, 1)
		y, ref := make([]float32, c.n*c.out), make([]float32, c.n*c.out)
		matmulT(0, y, x, w, c.n, c.in, c.out)
		blas32.Gemm(blas.NoTrans, blas.Trans, 1, blas32.General{Rows: c.n, Cols: c.in, Stride: c.in, Data: x},
			blas32.General{Rows: c.out, Cols: c.in, Stride: c.in, Data: w}, 0, blas32.General{Rows: c.n, Cols: c.out, Stride: c.out, Data: ref})
		for i := range y {
			if d := y[i] - ref[i]; d > 1e-3 || d < -1e-3 {
				t.Fatalf("%+v: y[%d] = %v, gonum %v", c, i, y[i], ref[i])
			}
		}
	}
}

// BenchmarkCausal measures the prefill attention kernel for the shapes of
// v1 (8 query heads, 2 KV heads, D 32) and v2 (6 query heads, 2 KV
// heads, D 64) over n tokens, reporting GFLOP/s (2 x 2 x n^2/2 x heads
// x D).
func BenchmarkCausal(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, g := range []Geometry{{1, 8, 2, 32}, {1, 6, 2, 64}} {
		for _, n := range []int{1024, 4096} {
			q := randVecs(rng, n*g.Heads*g.HeadDim, 1)
			k := randVecs(rng, n*g.KVHeads*g.HeadDim, 1)
			v := randVecs(rng, n*g.KVHeads*g.HeadDim, 1)
			out := make([]float32, len(q))
			b.Run(fmt.Sprintf("d%d/%d", g.HeadDim, n), func(b *testing.B) {
				for b.Loop() {
					causalAttention(context.Background(), 0, g, q, n, k, v, 0, out)
				}
				b.ReportMetric(2*float64(n)*float64(n)*float64(g.Heads*g.HeadDim)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkPrefill measures prefill throughput of the shared checkpoints
// with the dense float32 cache (tokens/s).
func BenchmarkPrefill(b *testing.B) {
	for _, name := range []string{"passkey-llama-v1", "passkey-llama-v2"} {
		m, _ := testModel(b, name)
		rng := rand.New(rand.NewPCG(1, 1))
		for _, n := range []int{1024, 4096} {
			ids := randTokens(rng, n)
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				var tm Timing
				for b.Loop() {
					if _, err := m.Forward(context.Background(), NewDense(m.Geometry(), 0), ids, ForwardOptions{Timing: &tm}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
				b.ReportMetric(tm.Attention.Seconds()/tm.Total.Seconds(), "attn-share")
			})
		}
	}
}

// BenchmarkVec measures the attention kernel's vector loops over a tile
// of 128 keys of D = 64 (v2's shape, 2 KV heads interleaved).
func BenchmarkVec(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	q := randVecs(rng, 64, 1)
	k := randVecs(rng, 128*128, 1)
	s := make([]float32, 128)
	acc := make([]float32, 64)
	b.Run("scores128", func(b *testing.B) {
		for b.Loop() {
			scores(q, k, 128, 0.1, s)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/128, "ns/key")
	})
	b.Run("exp128", func(b *testing.B) {
		for b.Loop() {
			for i := range s {
				s[i] = -float32(i) * 0.01
			}
			expSum(s, 0)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/128, "ns/key")
	})
	b.Run("accum128", func(b *testing.B) {
		for b.Loop() {
			accum(s, k, 128, acc)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/128, "ns/key")
	})
}
