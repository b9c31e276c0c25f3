package plan

// RankPlan is one CP rank's part of a sequence's [Plan]: which of its
// local pages it attends whatever the selection (forced pages, or every
// page of a dense plan) and which it ranks. Ranges are local pages
// [a, b); a rank holds no page of a range when a == b.
type RankPlan struct {
	// Pages is the number of the sequence's pages on this rank.
	Pages int
	// Dense: the rank attends all its pages (Forced is [0, Pages)).
	Dense bool
	// Sink and Tail are the forced local ranges: this rank's pages among
	// the first Plan.Sink and the last Plan.Local pages.
	Sink, Tail [2]int
	// Cand is the local range of this rank's candidate pages (global
	// [Plan.Lo, Plan.Hi)); Rank of them are the rank's quota when it
	// proposes its best pages for the global top-K.
	Cand [2]int
}

// On returns rank p's part of pl.
func (pl Plan) On(p Place) RankPlan {
	n := p.Count(pl.Pages)
	rp := RankPlan{Pages: n, Dense: pl.Dense}
	if pl.Dense {
		rp.Sink = [2]int{0, n}
		rp.Tail = [2]int{n, n}
		rp.Cand = [2]int{n, n}
		return rp
	}
	a, b := p.LocalRange(0, pl.Lo())
	rp.Sink = [2]int{a, b}
	a, b = p.LocalRange(pl.Lo(), pl.Hi())
	rp.Cand = [2]int{a, b}
	a, b = p.LocalRange(pl.Hi(), pl.Pages)
	rp.Tail = [2]int{a, b}
	return rp
}

// Forced returns the number of local pages the rank attends whatever the
// selection.
func (rp RankPlan) Forced() int {
	return rp.Sink[1] - rp.Sink[0] + rp.Tail[1] - rp.Tail[0]
}

// Candidates returns the number of local candidate pages.
func (rp RankPlan) Candidates() int { return rp.Cand[1] - rp.Cand[0] }
