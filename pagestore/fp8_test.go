package pagestore_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// fp8 store geometry: 2 layers, 2 KV heads, D = 8, S = 16.
const f8L, f8H, f8D, f8S = 2, 2, 8, 16

func fp8Config() pagestore.Config {
	return pagestore.Config{
		Layers:   f8L,
		Geometry: plan.Geometry{QHeads: 4, KVHeads: f8H, HeadDim: f8D, PageSize: f8S, DType: plan.FP8},
		Capacity: 32, MemoryLimit: -1,
	}
}

// fp8Seq appends tokens to a sequence of an fp8 store and remembers the
// float32 originals of every token (per layer), so that tests check the
// stored records against them.
type fp8Seq struct {
	id   pagestore.SeqID
	orig [f8L][][]float32 // [layer][token] K row (KVHeads*D)
}

func (q *fp8Seq) append(t *testing.T, s *pagestore.Store, rng *rand.Rand, n int, mag float64) {
	t.Helper()
	for l := range f8L {
		k := make([]float32, n*f8H*f8D)
		v := make([]float32, len(k))
		for i := range k {
			k[i] = float32(rng.NormFloat64() * mag)
			v[i] = float32(rng.NormFloat64() * mag)
		}
		if err := s.Append(q.id, l, k, v); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			q.orig[l] = append(q.orig[l], k[i*f8H*f8D:(i+1)*f8H*f8D])
		}
	}
}

// checkFP8 checks every page of the sequence: (1) each record's scale is
// amax/448 over the tokens appended to it since the page started (when
// exact is set: no rollback since); (2) every stored key is within the
// error of at most two nearest roundings of its original; (3) the
// summaries are exactly the min and max of the dequantized stored keys
// (ReadKV); (4) the Quest bound of random queries from the summaries is
// >= every exact score on those keys (float64).
func checkFP8(t *testing.T, s *pagestore.Store, q *fp8Seq, exact bool, rng *rand.Rand) {
	t.Helper()
	table, err := s.AppendPageTable(nil, q.id)
	if err != nil {
		t.Fatal(err)
	}
	blk := f8H * f8S * f8D
	k, v := make([]float32, blk), make([]float32, blk)
	for l := range f8L {
		n := len(q.orig[l])
		ld := s.Layer(l)
		for pi := 0; pi*f8S < n; pi++ {
			p := table[pi]
			valid := min(f8S, n-pi*f8S)
			if err := s.ReadKV(context.Background(), l, p, k, v); err != nil {
				t.Fatal(err)
			}
			for h := range f8H {
				rec := int(p)*f8H + h
				sc := ld.KScale[rec]
				var amax float32
				for r := range valid {
					o := q.orig[l][pi*f8S+r][h*f8D:][:f8D]
					for j, x := range o {
						amax = max(amax, float32(math.Abs(float64(x))))
						got := k[(h*f8S+r)*f8D+j]
						// Two nearest roundings: 2 x (1/16 of the
						// magnitude, or half a subnormal step 2^-10).
						tol := 2 * (math.Abs(float64(x))/16 + float64(sc)*math.Pow(2, -10)) * 1.001
						if math.Abs(float64(got-x)) > tol {
							t.Fatalf("layer %d page %d head %d token %d dim %d: stored %v, original %v (scale %v)", l, pi, h, r, j, got, x, sc)
						}
					}
				}
				if exact && sc != amax/448 {
					t.Fatalf("layer %d page %d head %d: K scale %v, want amax/448 = %v", l, pi, h, sc, amax/448)
				}
				mn, mx := s.PageSummary(l, int(p), h)
				for j := range f8D {
					lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
					for r := range valid {
						x := k[(h*f8S+r)*f8D+j]
						lo, hi = min(lo, x), max(hi, x)
					}
					if mn[j] != lo || mx[j] != hi {
						t.Fatalf("layer %d page %d head %d dim %d: summary [%v, %v], dequantized keys span [%v, %v]", l, pi, h, j, mn[j], mx[j], lo, hi)
					}
				}
				for range 8 {
					qv := make([]float64, f8D)
					var u float64
					for j := range qv {
						qv[j] = rng.NormFloat64()
						u += max(qv[j]*float64(mn[j]), qv[j]*float64(mx[j]))
					}
					for r := range valid {
						var dot float64
						for j := range qv {
							dot += qv[j] * float64(k[(h*f8S+r)*f8D+j])
						}
						if dot > u+1e-12*max(1, math.Abs(u)) {
							t.Fatalf("layer %d page %d head %d: bound %v below the exact score %v of token %d", l, pi, h, u, dot, r)
						}
					}
				}
			}
		}
	}
}

// TestFP8Records appends tokens in chunks that cross pages and grow in
// magnitude (so records are re-quantized), and checks the records.
func TestFP8Records(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s, err := pagestore.New(fp8Config())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	q := &fp8Seq{id: s.Create()}
	mag := 0.01
	for _, n := range []int{1, 14, 1, 1, 17, 15, 16, 3, 40} {
		q.append(t, s, rng, n, mag)
		mag *= 3 // later tokens raise amax: earlier ones re-quantized
		checkFP8(t, s, q, true, rng)
	}
	kv, _, err := s.Config().PoolBytes()
	if err != nil {
		t.Fatal(err)
	}
	// 1 byte per element plus a float32 scale per (page, layer, K or V,
	// KV head).
	if want := 32 * f8L * 2 * (f8H*f8S*f8D + 4*f8H); kv != want {
		t.Fatalf("fp8 K/V pool bytes %d, want %d", kv, want)
	}
}

// TestFP8ForkRollbackRecycle: a write in a fork never changes the
// parent's records; a rollback inside the tail page recomputes its
// summary from the remaining dequantized keys; a recycled page starts
// with a fresh scale and summary.
func TestFP8ForkRollbackRecycle(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s, err := pagestore.New(fp8Config())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := &fp8Seq{id: s.Create()}
	a.append(t, s, rng, 37, 1)
	id, err := s.Fork(a.id)
	if err != nil {
		t.Fatal(err)
	}
	b := &fp8Seq{id: id}
	for l := range f8L {
		b.orig[l] = slices.Clone(a.orig[l])
	}
	snap := func() (out [][]float32) {
		tb, _ := s.AppendPageTable(nil, a.id)
		for l := range f8L {
			for _, p := range tb {
				k, v := make([]float32, f8H*f8S*f8D), make([]float32, f8H*f8S*f8D)
				if err := s.ReadKV(context.Background(), l, p, k, v); err != nil {
					t.Fatal(err)
				}
				mn, mx := s.PageSummary(l, int(p), 0)
				out = append(out, k, v, slices.Clone(mn), slices.Clone(mx))
			}
		}
		return out
	}
	before := snap()
	b.append(t, s, rng, 5, 100) // a larger amax: the fork's tail is re-quantized
	checkFP8(t, s, b, true, rng)
	after := snap()
	for i := range before {
		if !slices.Equal(before[i], after[i]) {
			t.Fatalf("a write in the fork changed the parent's page data (block %d)", i)
		}
	}
	checkFP8(t, s, a, true, rng)

	// Rollback inside the fork's tail page (42 tokens -> 34).
	if err := s.Rollback(b.id, 8); err != nil {
		t.Fatal(err)
	}
	for l := range f8L {
		b.orig[l] = b.orig[l][:34]
	}
	checkFP8(t, s, b, false, rng) // the scale stays that of the 42 tokens

	// Recycle: release both, take the pages again with small values.
	if err := s.Release(b.id); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(a.id); err != nil {
		t.Fatal(err)
	}
	c := &fp8Seq{id: s.Create()}
	for range 12 {
		c.append(t, s, rng, 17, 0.001)
	}
	checkFP8(t, s, c, true, rng) // scales from the new tokens only
}

// TestFP8Persistence: an fp8 store's records (codes, scales) and
// summaries survive a restart bit for bit; a directory of fp8 pages is
// refused by an f32 store.
func TestFP8Persistence(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	dir := t.TempDir()
	cfg := fp8Config()
	cfg.DataDir = dir
	s, err := pagestore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	q := &fp8Seq{id: s.Create()}
	for _, n := range []int{20, 3, 30} {
		q.append(t, s, rng, n, float64(n))
	}
	table, _ := s.AppendPageTable(nil, q.id)
	type rec struct {
		k8, v8         []uint8
		ks, vs, summar []float32
	}
	// grab copies the records of the sequence's pages: the codes of the
	// valid slots of each head (the rest are unspecified), the scales
	// and the summaries.
	grab := func(s *pagestore.Store, table []int32) (out []rec) {
		blk, sum := f8H*f8S*f8D, f8H*2*f8D
		for l := range f8L {
			ld := s.Layer(l)
			for i, p := range table {
				n := min(53-i*f8S, f8S) * f8D
				r := rec{ks: slices.Clone(ld.KScale[int(p)*f8H:][:f8H]), vs: slices.Clone(ld.VScale[int(p)*f8H:][:f8H]), summar: slices.Clone(ld.Summary[int(p)*sum:][:sum])}
				for h := range f8H {
					o := int(p)*blk + h*f8S*f8D
					r.k8 = append(r.k8, ld.K8[o:o+n]...)
					r.v8 = append(r.v8, ld.V8[o:o+n]...)
				}
				out = append(out, r)
			}
		}
		return out
	}
	want := grab(s, table)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := pagestore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if n, err := s2.Len(q.id); err != nil || n != 53 {
		t.Fatalf("recovered length %d, %v; want 53", n, err)
	}
	table2, _ := s2.AppendPageTable(nil, q.id)
	got := grab(s2, table2)
	for i := range want {
		if !slices.Equal(got[i].k8, want[i].k8) || !slices.Equal(got[i].v8, want[i].v8) || !slices.Equal(got[i].ks, want[i].ks) ||
			!slices.Equal(got[i].vs, want[i].vs) || !slices.Equal(got[i].summar, want[i].summar) {
			t.Fatalf("page record %d (layer-major) differs after the restart", i)
		}
	}
	checkFP8(t, s2, q, true, rng)
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}

	f32 := cfg
	f32.DType = plan.Float32
	_, err = pagestore.New(f32)
	if err == nil || !strings.Contains(err.Error(), "holds fp8 pages, the config asks for f32") || !errors.Is(err, pagestore.ErrOtherFormat) {
		t.Fatalf("an f32 store opening a directory of fp8 pages: %v; want an error naming both types", err)
	}
	// And the other way round: a directory of f32 pages with fp8.
	f32.DataDir = t.TempDir()
	s3, err := pagestore.New(f32)
	if err != nil {
		t.Fatal(err)
	}
	id := s3.Create()
	for l := range f8L {
		if err := s3.Append(id, l, make([]float32, 20*f8H*f8D), make([]float32, 20*f8H*f8D)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s3.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = f32.DataDir
	_, err = pagestore.New(cfg)
	if err == nil || !strings.Contains(err.Error(), "holds f32 pages, the config asks for fp8") || !errors.Is(err, pagestore.ErrOtherFormat) {
		t.Fatalf("an fp8 store opening a directory of f32 pages: %v; want an error naming both types", err)
	}
}

func TestFP8ConfigErrors(t *testing.T) {
	c := fp8Config()
	c.DType = plan.BFloat16
	if _, err := pagestore.New(c); err == nil {
		t.Fatal("a bf16 CPU store: want an error")
	}
}
