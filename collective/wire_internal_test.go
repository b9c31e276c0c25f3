package collective

import (
	"cmp"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

func FuzzParseSelectFrame(f *testing.F) {
	g := NewGroup(NewInprocGroup(1)[0])
	if err := g.encodeSelect([][]Candidate{{{Score: 1, Page: 2}, {Score: 3, Page: 4}}, {}}, []int{2, 3}); err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte(nil), g.buf...), uint8(2), uint8(2), uint8(3))
	f.Add([]byte{0, 2, 1, 0}, uint8(0), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, rows, k0, k1 uint8) {
		k := make([]int, rows)
		for i := range k {
			k[i] = int([]uint8{k0, k1}[i%2])
		}
		rowAt, cnt := make([]int, rows), make([]int, rows)
		var scratch []uint64
		keys, err := parseSelectFrame(b, int(rows), k, hashBudgets(k), rowAt, cnt, 1, &scratch)
		if err != nil {
			return
		}
		if selectHeaderLen+int(rows)*4+len(keys)*8 != len(b) {
			t.Fatalf("%d keys from %d bytes", len(keys), len(b))
		}
		for row, at := range rowAt {
			for n := range cnt[row] {
				c := fromKey(keys[at+n])
				if c.Score != c.Score || c.Page < 0 || (n > 0 && plan.Compare(fromKey(keys[at+n-1]), c) >= 0) {
					t.Fatalf("row %d: accepted bad candidate %d %+v", row, n, c)
				}
			}
			if cnt[row] > k[row] {
				t.Fatalf("row %d: %d candidates, budget %d", row, cnt[row], k[row])
			}
			if row > 0 && at != rowAt[row-1]+cnt[row-1] {
				t.Fatalf("row %d starts at %d, after %d keys", row, at, rowAt[row-1]+cnt[row-1])
			}
		}
	})
}

func FuzzCheckStateFrame(f *testing.F) {
	g := NewGroup(NewInprocGroup(1)[0])
	g.encodeState(OpReduce, 2, []float32{1, 2, 3, 4}, []float32{0, 1})
	f.Add(append([]byte(nil), g.buf...), uint8(2), uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, n, d uint8) {
		ob, lb, err := checkStateFrame(b, int(n), int(d))
		if err != nil {
			return
		}
		if len(ob) != 4*int(n)*int(d) || len(lb) != 4*int(n) {
			t.Fatalf("accepted %d o bytes and %d lse bytes for %d x %d", len(ob), len(lb), n, d)
		}
	})
}

func TestFloatCodecRoundTrip(t *testing.T) {
	in := []float32{0, -0, 1.5, -2.25, 3e38, 1e-45}
	b := make([]byte, 4*len(in))
	putF32s(b, in)
	if b[4*2+3] != 0x3f || b[4*2+2] != 0xc0 { // 1.5 = 0x3fc00000, little-endian
		t.Fatalf("1.5 encoded as % x, want little-endian 00 00 c0 3f", b[8:12])
	}
	out := make([]float32, len(in))
	getF32s(out, b)
	for i := range in {
		if out[i] != in[i] {
			t.Fatalf("round trip: %v, want %v", out, in)
		}
	}
}

// TestSortKeyOrder: the key order is Compare's order, and fromKey inverts
// sortKey.
func TestSortKeyOrder(t *testing.T) {
	inf := float32(math.Inf(1))
	scores := []float32{-inf, -3e38, -1, -1e-45, float32(math.Copysign(0, -1)), 0, 1e-45, 0.5, 1, 3e38, inf}
	pages := []int32{0, 1, 7, math.MaxInt32}
	var cs []Candidate
	for _, s := range scores {
		for _, p := range pages {
			cs = append(cs, Candidate{Score: s, Page: p})
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		cs = append(cs, Candidate{Score: math.Float32frombits(rng.Uint32() &^ (0xff << 23)), Page: int32(rng.Uint32() >> 1)})
	}
	for _, a := range cs {
		if back := fromKey(sortKey(a)); back.Page != a.Page || back.Score != a.Score {
			t.Fatalf("fromKey(sortKey(%v)) = %v", a, back)
		}
		for _, b := range cs[:60] {
			want := plan.Compare(a, b)
			ka, kb := sortKey(a), sortKey(b)
			got := cmp.Compare(ka, kb)
			if (want < 0) != (got < 0) || (want == 0) != (got == 0) {
				t.Fatalf("%v vs %v: Compare %d, keys %d", a, b, want, got)
			}
		}
	}
}

// TestValidKey: validKey accepts exactly the keys that sortKey makes (all
// non-NaN scores, both zeros folded, pages 0 to MaxInt32) and refuses the
// images of NaNs, the unfolded -0 and negative pages, checked against
// keyScore's inverse for every score part's neighbourhood that matters and
// random bits.
func TestValidKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	// A key is valid when decoding it gives a non-NaN score and a page
	// >= 0 and encoding that candidate gives the key back.
	ref := func(k uint64) bool {
		c := fromKey(k)
		return c.Score == c.Score && c.Page >= 0 && sortKey(c) == k
	}
	parts := []uint32{0, 1, 0x007ffffe, 0x007fffff, 0x00800000, 0x7ffffffe, 0x7fffffff, 0x80000000, 0x80000001, 0xff7fffff, 0xff800000, 0xff800001, 0xfffffffe, 0xffffffff}
	pages := []uint32{0, 1, 1<<31 - 1, 1 << 31, 0xffffffff}
	check := func(k uint64) {
		if got, want := validKey(k), ref(k); got != want {
			t.Fatalf("validKey(%#x) = %v, want %v (%+v)", k, got, want, fromKey(k))
		}
	}
	for _, sp := range parts {
		for _, p := range pages {
			check(uint64(sp)<<32 | uint64(p))
		}
	}
	for range 200000 {
		check(rng.Uint64())
		check(uint64(rng.Uint32()) << 32) // page 0
	}
	for _, f := range []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32} {
		if k := sortKey(Candidate{Score: f, Page: math.MaxInt32}); !validKey(k) {
			t.Fatalf("validKey(sortKey(%v)) = false", f)
		}
	}
}
