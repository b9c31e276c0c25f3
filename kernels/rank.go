package kernels

import (
	"context"
	"fmt"
	"slices"
)

// Ranker is implemented by backends that score pages and select among
// them in one call, handing back only the chosen pages and their scores:
// what a CP rank proposes to the selection collective. The CUDA backend
// keeps the full scores on the device, so a call moves O(K) bytes back
// instead of O(pages) each way.
type Ranker interface {
	// Rank scores the pages of b for every row of mode (as Score), runs
	// plan over those scores (as TopK, writing out) and writes the score
	// of each chosen page to outScores at the same position: for plan row
	// r and output j, outScores[j] = scores[ScoreOff[r] + out[j] -
	// Base[r]]. Entries outside the plan's output ranges are left alone.
	Rank(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, mode GQAMode, plan *TopKPlan, out []int32, outScores []float32) error
}

// CheckRank validates the arguments of a Ranker call that do not depend on
// the backend: the plan against the batch's scores and the outputs. It
// returns the output length the plan writes (see TopKPlan.Check).
func CheckRank(s Shape, b *Batch, mode GQAMode, plan *TopKPlan, out []int32, outScores []float32) (int, error) {
	if err := b.checkIndptr(); err != nil {
		return 0, fmt.Errorf("rank: %w", err)
	}
	if len(outScores) != len(out) {
		return 0, fmt.Errorf("rank: %d output pages but %d output scores", len(out), len(outScores))
	}
	outLen, err := plan.Check(b.Total()*s.Rows(mode), len(out))
	if err != nil {
		return 0, fmt.Errorf("rank: %w", err)
	}
	return outLen, nil
}

// ComposeRank runs a Ranker call as Score and TopK calls of be, with the
// scores in the caller's buffer (grown as needed and returned): the
// reference for Ranker implementations, and the CPU backend's Rank.
func ComposeRank(ctx context.Context, be Backend, scores []float32, s Shape, l Layer, b *Batch, q []float32, mode GQAMode, plan *TopKPlan, out []int32, outScores []float32) ([]float32, error) {
	if _, err := CheckRank(s, b, mode, plan, out, outScores); err != nil {
		return scores, err
	}
	n := b.Total() * s.Rows(mode)
	scores = slices.Grow(scores[:0], n)[:n]
	if err := be.Score(ctx, s, l, b, q, mode, scores); err != nil {
		return scores, err
	}
	if err := be.TopK(ctx, scores, plan, out); err != nil {
		return scores, err
	}
	for r := range plan.Rows() {
		oo, m := int(plan.OutOff[r]), min(int(plan.K[r]), int(plan.N[r]))
		for j := oo; j < oo+max(m, 0); j++ {
			outScores[j] = scores[int(plan.ScoreOff[r])+int(out[j]-plan.Base[r])]
		}
	}
	return scores, nil
}
