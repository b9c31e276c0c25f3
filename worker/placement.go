package worker

import "github.com/questrt/questrt/plan"

// Token counts from the placement alone, O(1): a rank checks the lengths
// and shapes of what the coordinator sends it against them, and takes its
// share of a sequence-wide operation (an append's tokens, a rollback's
// drop) without any page map.

// owned returns how many of the token positions [0, n) of a sequence lie
// on pages that rank place owns: O(1), from the placement alone.
func owned(p plan.Place, pageSize, n int) int { return p.Tokens(pageSize, n) }

// ownedRange returns how many of the positions [lo, hi) rank place owns.
func ownedRange(p plan.Place, pageSize, lo, hi int) int {
	return owned(p, pageSize, hi) - owned(p, pageSize, lo)
}
