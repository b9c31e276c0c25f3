//go:build cuda

package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/kernels/backendtest"
	"github.com/questrt/questrt/kernels/fp8"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// TestKVFP8Conformance runs the backend suite on fp8 K/V records
// (backendtest.Options.KVFP8): the upper bound on the stored records,
// full budget equal to dense attention over the dequantized cache,
// shuffled page tables, tails 1/15/16/17, against float64 references of
// the dequantized values (10x the CPU's fp32 tolerances for __expf); with
// the default attention (tensor cores where the shape allows) and with the
// CUDA-core kernel (quest_attend_fp8) for every shape.
func TestKVFP8Conformance(t *testing.T) {
	for _, kernel := range []string{"", fp8CoreAttend} {
		for _, chunk := range []int{0, 3} {
			t.Run(fmt.Sprintf("kernel=%q/chunk=%d", kernel, chunk), func(t *testing.T) {
				backendtest.RunWith(t, func(t *testing.T) kernels.Backend {
					b, err := New(Config{DType: plan.FP8, AttendChunk: chunk, AttendKernel: kernel})
					if err != nil {
						t.Fatal(err)
					}
					return b
				}, backendtest.Options{KVFP8: true, Tol: 10})
			})
		}
	}
}

// TestKVFP8AppendMatchesStore appends the same tokens to the CPU page
// store (plan.FP8, pagestore/fp8.go over package kernels/fp8) and to a
// device pool through the same page table, with later tokens of larger
// magnitude so that the scales grow and earlier slots are re-encoded:
// codes and scales read back are byte-identical to the store's and the
// summaries equal. Then a page copy (fork) equals its source, a rescan
// (rollback) gives the box of the remaining dequantized keys, a recycled
// page written from slot 0 gets a fresh scale (fp8.EncodeKV of the new
// tokens alone), and attention over the pool matches float64 attention
// over the store's dequantized records.
func TestKVFP8AppendMatchesStore(t *testing.T) {
	ctx := context.Background()
	b := newBackend(t, plan.FP8)
	defer b.Close()
	const kvh, qh, d, s, capPages = 2, 4, 64, 16, 24
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1, 15, 16, 17, 40} {
		st, err := pagestore.New(pagestore.Config{Layers: 1, Geometry: plan.Geometry{KVHeads: kvh, HeadDim: d, PageSize: s, DType: plan.FP8}, Capacity: capPages})
		if err != nil {
			t.Fatal(err)
		}
		noise := st.Create() // shifts the physical ids
		if err := st.Append(noise, 0, make([]float32, 20*kvh*d), make([]float32, 20*kvh*d)); err != nil {
			t.Fatal(err)
		}
		id := st.Create()
		pool, err := b.NewPool(ctx, capPages, kvh, d, s)
		if err != nil {
			t.Fatal(err)
		}
		dl := pool.(*DeviceLayer)
		// A prefill, then one-token steps whose magnitude grows (scale
		// up, re-encode) or shrinks (no re-encode).
		pre := n - min(n, 4)
		var steps []int
		if pre > 0 {
			steps = append(steps, pre)
		}
		for range n - pre {
			steps = append(steps, 1)
		}
		pos := 0
		for i, m := range steps {
			mag := []float64{1, 4, 0.25, 16, 1}[i%5]
			k, v := make([]float32, m*kvh*d), make([]float32, m*kvh*d)
			for j := range k {
				k[j], v[j] = float32(rng.NormFloat64()*mag), float32(rng.NormFloat64()*mag)
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
		pt, _ := st.AppendPageTable(nil, id)
		want := st.Layer(0)
		got, err := b.ReadRecords(ctx, pool, pt)
		if err != nil {
			t.Fatal(err)
		}
		gotL, err := b.ReadPages(ctx, pool, pt)
		if err != nil {
			t.Fatal(err)
		}
		blk := s * d
		for lp, phys := range pt {
			valid := min(s, n-lp*s)
			for h := range kvh {
				rec, grec := int(phys)*kvh+h, lp*kvh+h
				if math.Float32bits(got.KScale[grec]) != math.Float32bits(want.KScale[rec]) || math.Float32bits(got.VScale[grec]) != math.Float32bits(want.VScale[rec]) {
					t.Fatalf("n=%d page %d head %d: scales K %v V %v, store %v %v", n, lp, h, got.KScale[grec], got.VScale[grec], want.KScale[rec], want.VScale[rec])
				}
				for i := range valid * d {
					if got.K[grec*blk+i] != want.K8[rec*blk+i] || got.V[grec*blk+i] != want.V8[rec*blk+i] {
						t.Fatalf("n=%d page %d head %d elem %d: codes K %#x V %#x, store %#x %#x", n, lp, h, i,
							got.K[grec*blk+i], got.V[grec*blk+i], want.K8[rec*blk+i], want.V8[rec*blk+i])
					}
				}
				for j := range 2 * d {
					if g, w := gotL.Summary[grec*2*d+j], want.Summary[rec*2*d+j]; g != w {
						t.Fatalf("n=%d page %d head %d summary %d: %v, store %v", n, lp, h, j, g, w)
					}
				}
			}
		}
		checkAttend8(t, b, pool, pt, n, want, rng)

		// Fork: copy the tail page to a free page.
		tail := pt[len(pt)-1]
		free := int32(capPages - 1)
		if err := b.CopyPage(ctx, pool, free, tail); err != nil {
			t.Fatal(err)
		}
		pair, err := b.ReadRecords(ctx, pool, []int32{tail, free})
		if err != nil {
			t.Fatal(err)
		}
		last := n - (len(pt)-1)*s
		for h := range kvh {
			a, c := h*blk, (kvh+h)*blk
			for i := range last * d {
				if pair.K[a+i] != pair.K[c+i] || pair.V[a+i] != pair.V[c+i] {
					t.Fatalf("n=%d copy: head %d elem %d differs", n, h, i)
				}
			}
			if pair.KScale[h] != pair.KScale[kvh+h] || pair.VScale[h] != pair.VScale[kvh+h] {
				t.Fatalf("n=%d copy: head %d scales differ", n, h)
			}
		}

		// Rollback: rescan the copy over one token fewer.
		if keep := last - 1; keep >= 0 {
			if err := b.Rescan(ctx, pool, []int32{free}, keep); err != nil {
				t.Fatal(err)
			}
			sum, err := b.ReadPages(ctx, pool, []int32{free})
			if err != nil {
				t.Fatal(err)
			}
			for h := range kvh {
				x := make([]float32, keep*d)
				fp8.Decode(x, pair.K[(kvh+h)*blk:][:keep*d], pair.KScale[kvh+h])
				for j := range d {
					lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
					for r := range keep {
						lo, hi = min(lo, x[r*d+j]), max(hi, x[r*d+j])
					}
					if g := sum.Summary[h*2*d+j]; g != lo {
						t.Fatalf("n=%d rescan to %d: head %d min %d = %v, want %v", n, keep, h, j, g, lo)
					}
					if g := sum.Summary[h*2*d+d+j]; g != hi {
						t.Fatalf("n=%d rescan to %d: head %d max %d = %v, want %v", n, keep, h, j, g, hi)
					}
				}
			}
		}

		// Recycle: the copy gets new small tokens from slot 0; its old
		// (larger) scale must not survive.
		m := 3
		k, v := make([]float32, m*kvh*d), make([]float32, m*kvh*d)
		for j := range k {
			k[j], v[j] = float32(rng.NormFloat64()*0.01), float32(rng.NormFloat64()*0.01)
		}
		if err := b.WriteTokens(ctx, pool, []int32{free}, 0, k, v); err != nil {
			t.Fatal(err)
		}
		fresh, err := b.ReadRecords(ctx, pool, []int32{free})
		if err != nil {
			t.Fatal(err)
		}
		for h := range kvh {
			for _, a := range []struct {
				src   []float32
				codes []uint8
				scale float32
			}{{k, fresh.K[h*blk:], fresh.KScale[h]}, {v, fresh.V[h*blk:], fresh.VScale[h]}} {
				x := make([]float32, m*d)
				for r := range m {
					copy(x[r*d:(r+1)*d], a.src[(r*kvh+h)*d:])
				}
				sc := fp8.KVScale(fp8.AbsMax(x))
				codes := make([]uint8, m*d)
				fp8.EncodeKV(codes, x, sc)
				if a.scale != sc {
					t.Fatalf("n=%d recycled page head %d: scale %v, fresh %v", n, h, a.scale, sc)
				}
				for i := range codes {
					if a.codes[i] != codes[i] {
						t.Fatalf("n=%d recycled page head %d elem %d: code %#x, fresh %#x", n, h, i, a.codes[i], codes[i])
					}
				}
			}
		}
		if err := b.FreePool(ctx, pool); err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
}

// checkAttend8 compares dense attention over the device pool's pages pt
// (n tokens) with float64 attention over the store's records want,
// decoded with fp8.Decode.
func checkAttend8(t *testing.T, b *Backend, pool any, pt []int32, n int, want pagestore.LayerData, rng *rand.Rand) {
	t.Helper()
	dl := pool.(*DeviceLayer)
	kvh, d, s := dl.KVHeads, dl.HeadDim, dl.PageSize
	sh := kernels.Shape{QHeads: 2 * kvh, KVHeads: kvh, HeadDim: d, PageSize: s}
	q := make([]float32, sh.QHeads*d)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	bt := &kernels.Batch{Indptr: []int32{0, int32(len(pt))}, Pages: pt, LastLen: []int32{int32(n - (len(pt)-1)*s)}}
	o, lse := make([]float32, len(q)), make([]float32, sh.QHeads)
	if err := b.Attend(context.Background(), sh, kernels.Layer{Device: pool}, bt, q, &kernels.Lists{Mode: kernels.GroupMax, All: true}, o, lse); err != nil {
		t.Fatal(err)
	}
	blk := s * d
	decode := func(codes []uint8, scales []float32, phys int32, h, r int) []float32 {
		rec := int(phys)*kvh + h
		x := make([]float32, d)
		fp8.Decode(x, codes[rec*blk+r*d:][:d], scales[rec])
		return x
	}
	for qi := range sh.QHeads {
		h := qi / sh.Group()
		var logits []float64
		var vals [][]float32
		for tok := range n {
			phys, r := pt[tok/s], tok%s
			kx := decode(want.K8, want.KScale, phys, h, r)
			var dot float64
			for j := range d {
				dot += float64(q[qi*d+j]) * float64(kx[j])
			}
			logits = append(logits, dot/math.Sqrt(float64(d)))
			vals = append(vals, decode(want.V8, want.VScale, phys, h, r))
		}
		mx := math.Inf(-1)
		for _, x := range logits {
			mx = max(mx, x)
		}
		var sum float64
		ref := make([]float64, d)
		for i, x := range logits {
			p := math.Exp(x - mx)
			sum += p
			for j := range d {
				ref[j] += p * float64(vals[i][j])
			}
		}
		if g, w := float64(lse[qi]), mx+math.Log(sum); math.Abs(g-w) > 1e-4*(1+math.Abs(w)) {
			t.Fatalf("n=%d head %d: lse %v, float64 %v", n, qi, g, w)
		}
		for j := range d {
			w := ref[j] / sum
			if g := float64(o[qi*d+j]); math.Abs(g-w) > 1e-4*(1+math.Abs(w)) {
				t.Fatalf("n=%d head %d dim %d: o %v, float64 %v", n, qi, j, g, w)
			}
		}
	}
}
