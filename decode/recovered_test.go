package decode

import (
	"slices"
	"testing"
)

// TestRecoveredLost: what a recovered sequence lost, from its lengths
// now and at the stop: per layer from HadLens where known, from Had
// otherwise, never negative; LostTokens from the longest layer.
func TestRecoveredLost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		r      Recovered
		tokens int
		lost   []int
	}{
		{"graceful", Recovered{Lens: []int{32, 32}, Had: 32, HadLens: []int{32, 32}}, 0, []int{0, 0}},
		{"per layer", Recovered{Lens: []int{16, 16}, Had: 21, HadLens: []int{21, 20}}, 5, []int{5, 4}},
		{"no per-layer record", Recovered{Lens: []int{16, 12}, Had: 21}, 5, []int{5, 9}},
		{"a layer holding more than its record", Recovered{Lens: []int{16, 16}, Had: 16, HadLens: []int{16, 15}}, 0, []int{0, 0}},
		{"no layers", Recovered{Had: 3}, 3, []int{}},
	} {
		if got := tc.r.LostTokens(); got != tc.tokens {
			t.Errorf("%s: LostTokens %d, want %d", tc.name, got, tc.tokens)
		}
		if got := tc.r.Lost(); !slices.Equal(got, tc.lost) {
			t.Errorf("%s: Lost %v, want %v", tc.name, got, tc.lost)
		}
	}
	r := Recovered{Lens: []int{4, 3}, HadExact: []bool{true, false}}
	if r.Len() != 3 || !slices.Equal(r.LostExact(), []bool{true, false}) {
		t.Errorf("Len %d, LostExact %v; want 3, [true false]", r.Len(), r.LostExact())
	}
}
