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
		rowAt := make([]int, rows)
		keys, err := parseSelectFrame(b, int(rows), k, hashBudgets(k), rowAt, 1, nil)
		if err != nil {
			return
		}
		if int(rows)*4+(len(keys)-int(rows))*8 > len(b) {
			t.Fatalf("%d keys from %d bytes", len(keys), len(b))
		}
		for row, at := range rowAt {
			n := 0
			for ; keys[at+n] != noKey; n++ {
				c := fromKey(keys[at+n])
				if c.Score != c.Score || c.Page < 0 || (n > 0 && plan.Compare(fromKey(keys[at+n-1]), c) >= 0) {
					t.Fatalf("row %d: accepted bad candidate %d %+v", row, n, c)
				}
			}
			if n > k[row] {
				t.Fatalf("row %d: %d candidates, budget %d", row, n, k[row])
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
