package collective

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSortKeys: sortKeys sorts like slices.Sort whatever the scores
// (clustered, tied, spread over every magnitude, infinite, zeros of both
// signs, the smallest subnormals), pages up to math.MaxInt32 and the row
// length, including rows that reuse a larger row's scratch, and leaves
// its input as it was; it reports a key given twice (rows with repeated
// candidates among them) exactly when the sorted row has one.
func TestSortKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	dists := []func() float32{
		func() float32 { return float32(rng.NormFloat64()) },
		func() float32 { return rng.Float32() },
		func() float32 { return float32(rng.IntN(3)) },
		func() float32 { return 1 + float32(rng.IntN(64))*0x1p-23 },
		func() float32 { return float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(70)-35))) },
		func() float32 { return math.Float32frombits(rng.Uint32() &^ (0xff << 23)) },
		func() float32 { return []float32{float32(math.Inf(1)), float32(math.Inf(-1)), 0, 1}[rng.IntN(4)] },
		func() float32 { return []float32{0, float32(math.Copysign(0, -1)), 0x1p-149, -0x1p-149}[rng.IntN(4)] },
		func() float32 {
			if rng.IntN(50) == 0 {
				return 3e38
			}
			return float32(rng.NormFloat64())
		},
	}
	var s keySorter
	for trial := range 3000 {
		n := rng.IntN(300)
		if trial%10 == 0 {
			n = rng.IntN(5000)
		}
		dist := dists[trial%len(dists)]
		keys := make([]uint64, n)
		for i := range keys {
			page := int32(rng.IntN(1 << 20))
			if trial%3 == 0 {
				page = math.MaxInt32 - page // the largest page ids
			}
			keys[i] = sortKey(Candidate{Score: dist(), Page: page})
		}
		if trial%4 == 1 && n > 1 { // some candidates given twice
			for range 1 + rng.IntN(3) {
				keys[rng.IntN(n)] = keys[rng.IntN(n)]
			}
		}
		want := slices.Clone(keys)
		slices.Sort(want)
		lo, hi := uint32(math.MaxUint32), uint32(0)
		for _, k := range keys {
			lo, hi = min(lo, uint32(k>>32)), max(hi, uint32(k>>32))
		}
		in := slices.Clone(keys)
		got := make([]uint64, n)
		strict := s.sortKeys(got, in, lo, hi)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: %d keys not sorted", trial, n)
		}
		if strict != strictlyAscending(want) {
			t.Fatalf("trial %d: strict %v for %d keys, want %v", trial, strict, n, !strict)
		}
		if !slices.Equal(in, keys) {
			t.Fatalf("trial %d: input changed", trial)
		}
	}
}

// TestInsertionSort: insertionSort sorts like slices.Sort any input, not
// only the nearly sorted rows sortKeys hands it: random, reversed,
// sorted, few distinct values, keys two or more places from home, and
// the lengths 0 to 3 around its first step; and it reports a repeated key
// exactly when the sorted input has one.
func TestInsertionSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	for trial := range 20000 {
		n := rng.IntN(70)
		if trial < 64 {
			n = trial % 4
		}
		a := make([]uint64, n)
		vals := uint64(1) << uint(rng.IntN(64))
		for i := range a {
			a[i] = rng.Uint64N(vals)
		}
		switch trial % 5 {
		case 1:
			slices.Sort(a)
		case 2:
			slices.Sort(a)
			slices.Reverse(a)
		case 3: // sorted, then a few keys moved
			slices.Sort(a)
			for range rng.IntN(4) {
				if n > 1 {
					i, j := rng.IntN(n), rng.IntN(n)
					a[i], a[j] = a[j], a[i]
				}
			}
		case 4:
			for i := range a {
				a[i] = []uint64{0, 1, math.MaxUint64}[rng.IntN(3)]
			}
		}
		want := slices.Sorted(slices.Values(a))
		strict := insertionSort(a)
		if !slices.Equal(a, want) {
			t.Fatalf("trial %d: got %v, want %v", trial, a, want)
		}
		if strict != strictlyAscending(want) {
			t.Fatalf("trial %d: strict %v for %v", trial, strict, want)
		}
	}
}
