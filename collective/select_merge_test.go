package collective

import (
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
