package backendtest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/kernels"
)

// PrefillDevice is what RunPrefill drives: a device store whose tensors
// the test allocates, and its prefill attention.
type PrefillDevice interface {
	kernels.DeviceStore
	kernels.PrefillAttender
	AllocTensor(n int) (decode.Tensor, error)
	FreeTensor(t decode.Tensor) error
	UploadTensor(t decode.Tensor, src []float32) error
	DownloadTensor(ctx context.Context, t decode.Tensor) ([]float32, error)
}

// RunPrefill checks dev's PrefillTensor against causal attention in
// float64 over the keys and values the pool holds (read back with
// ReadPages, so in the pool's own rounding): every output element within
// tol of the reference. Shapes: group sizes 1, 3 (rows of a device block
// left idle), 4 and 8, head dimensions dims; chunks that start at 0 and
// later, with the last page holding 1, 15, 16 and 17 mod 16 tokens, and
// pages in a shuffled order (the table must be followed). Bad calls (a
// table too short, q of the wrong length) are refused.
func RunPrefill(t *testing.T, dev PrefillDevice, dims []int, tol float64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	type shape struct{ qh, kvh, d int }
	var shapes []shape
	for _, d := range dims {
		shapes = append(shapes, shape{8, 2, d}, shape{4, 4, d}, shape{6, 2, d}, shape{16, 2, d})
	}
	chunks := []struct{ start, n int }{{0, 1}, {0, 15}, {0, 16}, {0, 17}, {16, 129}, {100, 60}, {0, 300}, {1000, 70}}
	const S = 16
	for _, sh := range shapes {
		for _, ch := range chunks {
			name := fmt.Sprintf("%dq%dkv_d%d_at%d_n%d", sh.qh, sh.kvh, sh.d, ch.start, ch.n)
			end := ch.start + ch.n
			pages := (end + S - 1) / S
			pool, err := dev.NewPool(ctx, pages+7, sh.kvh, sh.d, S)
			if err != nil {
				t.Fatal(err)
			}
			set, err := dev.NewTables(ctx)
			if err != nil {
				t.Fatal(err)
			}
			perm := rng.Perm(pages + 7)[:pages]
			table := make([]int32, pages)
			for i, p := range perm {
				table[i] = int32(p)
			}
			tok := sh.kvh * sh.d
			k, v := make([]float32, end*tok), make([]float32, end*tok)
			for i := range k {
				k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
			}
			if err := dev.WriteTokens(ctx, pool, table, 0, k, v); err != nil {
				t.Fatal(err)
			}
			if err := dev.WriteTable(ctx, set, 7, 0, table, pages, pages+7); err != nil {
				t.Fatal(err)
			}
			stored, err := dev.ReadPages(ctx, pool, table)
			if err != nil {
				t.Fatal(err)
			}
			width := sh.qh * sh.d
			q := make([]float32, ch.n*width)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			qt := alloc(t, dev, len(q))
			ot := alloc(t, dev, len(q))
			if err := dev.UploadTensor(qt, q); err != nil {
				t.Fatal(err)
			}
			s := kernels.Shape{QHeads: sh.qh, KVHeads: sh.kvh, HeadDim: sh.d, PageSize: S}
			if err := dev.PrefillTensor(ctx, s, pool, set, 7, ch.start, ch.n, qt, ot); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got, err := dev.DownloadTensor(ctx, ot)
			if err != nil {
				t.Fatal(err)
			}
			want := causalRef(stored, s, q, ch.start, ch.n)
			worst := 0.0
			for i, w := range want {
				d := math.Abs(float64(got[i]) - w)
				if !(d <= tol) { // NaN fails too
					row := i / width
					t.Fatalf("%s: o[token %d][head %d][%d] = %v, float64 %v", name, row, (i%width)/sh.d, i%sh.d, got[i], w)
				}
				worst = max(worst, d)
			}
			// Refusals.
			if err := dev.PrefillTensor(ctx, s, pool, set, 7, ch.start+S, ch.n, qt, ot); err == nil && (end+S+S-1)/S > pages {
				t.Errorf("%s: a chunk past the table's pages accepted", name)
			}
			if err := dev.PrefillTensor(ctx, s, pool, set, 7, ch.start, ch.n, qt.Slice(0, len(q)-1), ot.Slice(0, len(q)-1)); err == nil {
				t.Errorf("%s: q and o one float short accepted", name)
			}
			if err := dev.PrefillTensor(ctx, s, pool, set, 8, ch.start, ch.n, qt, ot); err == nil {
				t.Errorf("%s: a sequence without a table accepted", name)
			}
			t.Logf("%s: largest difference %.2g", name, worst)
			dev.FreeTensor(qt)
			dev.FreeTensor(ot)
			dev.FreeTables(ctx, set)
			dev.FreePool(ctx, pool)
		}
	}
}

func alloc(t *testing.T, dev PrefillDevice, n int) decode.Tensor {
	t.Helper()
	x, err := dev.AllocTensor(n)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// causalRef is the float64 causal attention of q (n tokens at positions
// start..) over the pages of l (page i holds positions i*S..), in the
// kernels.Layer layout.
func causalRef(l kernels.Layer, s kernels.Shape, q []float32, start, n int) []float64 {
	D, S, g := s.HeadDim, s.PageSize, s.Group()
	at := func(pos, h int) int { return ((pos/S*s.KVHeads+h)*S + pos%S) * D }
	out := make([]float64, n*s.QHeads*D)
	sc := make([]float64, start+n)
	for i := range n {
		end := start + i + 1
		for hq := range s.QHeads {
			h := hq / g
			qr := q[(i*s.QHeads+hq)*D:][:D]
			mx := math.Inf(-1)
			for pos := range end {
				dot := 0.0
				for j, x := range qr {
					dot += float64(x) * float64(l.K[at(pos, h)+j])
				}
				sc[pos] = dot / math.Sqrt(float64(D))
				mx = max(mx, sc[pos])
			}
			sum := 0.0
			dst := out[(i*s.QHeads+hq)*D:][:D]
			for pos := range end {
				e := math.Exp(sc[pos] - mx)
				sum += e
				for j := range dst {
					dst[j] += e * float64(l.V[at(pos, h)+j])
				}
			}
			for j := range dst {
				dst[j] /= sum
			}
		}
	}
	return out
}
