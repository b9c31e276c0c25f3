package collective

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestCuts: the cut of a row (two ranks: split2; more: cutN) takes t keys
// in all, none of them above a key left behind, also when many keys are
// equal (one page proposed by several ranks with one score).
func TestCuts(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 20000 {
		n := 2 + trial%5
		g := &Group{size: n, pos: make([]int, n)}
		at, cnt := make([]int, n), make([]int, n)
		total := 0
		vals := 1 + rng.IntN(40)
		for r := range n {
			c := rng.IntN(30)
			if rng.IntN(5) == 0 {
				c = 0
			}
			list := make([]uint64, c)
			for i := range list {
				list[i] = minKey + uint64(rng.IntN(vals))
			}
			slices.Sort(list)
			at[r], cnt[r] = len(g.all), c
			g.all = append(append(g.all, list...), noKey)
			total += c
		}
		want := rng.IntN(total + 1)
		cut := g.pos
		if n == 2 {
			cut[0] = split2(g.all[at[0]:][:cnt[0]], g.all[at[1]:][:cnt[1]], want)
			cut[1] = want - cut[0]
		} else {
			g.keys = slices.Repeat([][]uint64{g.all}, n) // every rank's list in g.all
			g.cutN(at, cnt, want, cut)
		}
		sum, hiTaken, loLeft := 0, uint64(0), noKey
		for r := range n {
			if cut[r] < 0 || cut[r] > cnt[r] {
				t.Fatalf("trial %d: rank %d: cut %d of %d", trial, r, cut[r], cnt[r])
			}
			sum += cut[r]
			if cut[r] > 0 {
				hiTaken = max(hiTaken, g.all[at[r]+cut[r]-1])
			}
			if cut[r] < cnt[r] {
				loLeft = min(loLeft, g.all[at[r]+cut[r]])
			}
		}
		if sum != want || hiTaken > loLeft {
			t.Fatalf("trial %d (n=%d t=%d): took %d, largest taken %#x, smallest left %#x", trial, n, want, sum, hiTaken, loLeft)
		}
	}
}

// TestMinKey: minKey is the smallest valid key and above 0, which the
// strict-order checks use as the key before the first.
func TestMinKey(t *testing.T) {
	if got := sortKey(Candidate{Score: float32(math.Inf(1)), Page: 0}); got != minKey || minKey == 0 {
		t.Fatalf("sortKey(+Inf, 0) = %#x, minKey %#x", got, minKey)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 100000 {
		c := Candidate{Score: math.Float32frombits(rng.Uint32()), Page: int32(rng.Uint32() >> 1)}
		if c.Score != c.Score {
			continue
		}
		if k := sortKey(c); k < minKey || k == noKey {
			t.Fatalf("sortKey(%v) = %#x, outside [minKey, noKey)", c, k)
		}
	}
}

// TestEmitBitmap: emitBitmap puts the taken pages of every rank's list in
// ascending order exactly as slices.Sort does, for pages spread thinly or
// packed (words of more than 4 pages), at the ends of the page range
// (0 and math.MaxInt32), with the bitmap left zero, and reports a page
// taken twice instead of emitting it.
func TestEmitBitmap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	g := &Group{}
	for trial := range 20000 {
		n := 1 + trial%5
		span := 1 + rng.IntN(1<<uint(rng.IntN(14)))
		lo := uint32(rng.IntN(1 << 20))
		switch trial % 7 {
		case 0:
			lo = 0
		case 1:
			lo = math.MaxInt32 - uint32(span) + 1
		}
		g.all = g.all[:0]
		at, cut := make([]int, n), make([]int, n)
		var pages []int32
		seen := map[int32]bool{}
		for r := range n {
			at[r] = len(g.all)
			c := rng.IntN(40)
			for range c {
				p := int32(lo + uint32(rng.IntN(span)))
				if seen[p] && rng.IntN(20) != 0 {
					continue // mostly distinct pages, a duplicate now and then
				}
				seen[p] = true
				pages = append(pages, p)
				g.all = append(g.all, sortKey(Candidate{Score: rng.Float32(), Page: p}))
			}
			cut[r] = len(g.all) - at[r]
			g.all = append(g.all, noKey)
			if rng.IntN(3) == 0 && cut[r] > 0 {
				cut[r] = rng.IntN(cut[r]) // a prefix of the list is taken
				pages = pages[:len(pages)-(len(g.all)-1-at[r]-cut[r])]
			}
		}
		// The duplicate may have been dropped with an untaken tail.
		want := slices.Clone(pages)
		slices.Sort(want)
		dup := len(slices.Compact(slices.Clone(want))) != len(want)
		base := lo // the bitmap starts at the range's first page or below it
		if trial%2 == 0 {
			base = lo &^ 63
		}
		words := int(lo-base+uint32(span)-1)>>6 + 1
		out := make([]int32, len(pages))
		g.keys = slices.Repeat([][]uint64{g.all}, n) // every rank's list in g.all
		ok := g.emitBitmap(at, cut, base, words, out)
		if ok == dup {
			t.Fatalf("trial %d: emitBitmap = %v with duplicate %v", trial, ok, dup)
		}
		if ok && !slices.Equal(out, want) {
			t.Fatalf("trial %d: got %v, want %v", trial, out, want)
		}
		if slices.ContainsFunc(g.bits, func(w uint64) bool { return w != 0 }) {
			t.Fatalf("trial %d: bitmap not left zero", trial)
		}
	}
}

// TestEmitAnyStamps: emitAny writes the taken pages in rank order, each
// rank's list in order, and reports a page taken twice in the row (not
// one taken in an earlier row), across rows that reuse the stamps and
// across the wrap of their generation.
func TestEmitAnyStamps(t *testing.T) {
	rng := rand.New(rand.NewPCG(30, 3))
	const n = 2
	g := &Group{size: n, plo: make([]uint32, n), phi: make([]uint32, n), keys: make([][]uint64, n)}
	g.gen = math.MaxUint32 - 50
	for trial := range 200 {
		span := 1 + rng.IntN(300)
		lo := uint32(rng.IntN(1000))
		at, cut := make([]int, n), make([]int, n)
		var want []int32
		seen := map[int32]bool{}
		dup := false
		for r := range n {
			g.keys[r] = g.keys[r][:0]
			g.plo[r], g.phi[r] = math.MaxUint32, 0
			for range rng.IntN(40) {
				p := int32(lo + uint32(rng.IntN(span)))
				if seen[p] && rng.IntN(10) != 0 {
					continue
				}
				dup = dup || seen[p]
				seen[p] = true
				want = append(want, p)
				g.keys[r] = append(g.keys[r], sortKey(Candidate{Score: 1, Page: p}))
				g.plo[r], g.phi[r] = min(g.plo[r], uint32(p)), max(g.phi[r], uint32(p))
			}
			cut[r] = len(g.keys[r])
		}
		out, err := g.emitAny(0, at, cut, len(want), nil)
		if dup != (err != nil) || (dup && !errors.Is(err, ErrDuplicatePage)) {
			t.Fatalf("trial %d (gen %d): duplicate %v, error %v", trial, g.gen, dup, err)
		}
		if !dup && !slices.Equal(out, want) {
			t.Fatalf("trial %d: got %v, want %v", trial, out, want)
		}
	}
	if g.gen > 1000 {
		t.Fatalf("generation %d: the test did not wrap it", g.gen)
	}
}
