package decode

// Diagnostics describe one sequence's selection in one step, measured
// against dense attention on the same data.
type Diagnostics struct {
	// Selected lists, per query head, the logical pages attended
	// (selected and forced), ascending.
	Selected [][]int32
	// Scores lists, per query head, every page's score under the step's
	// selector (group max for group_max; nil for recent and dense).
	Scores [][]float32
	// Recall is the fraction of the dense top-R tokens (per query head,
	// averaged) whose pages were attended.
	Recall float64
	// MassRecall is 1 - eps: the dense softmax mass inside the attended
	// pages (per query head, averaged); MinMassRecall is the worst head.
	MassRecall, MinMassRecall float64
	// HeadRecall and HeadMassRecall are Recall and MassRecall per query
	// head (index = query head).
	HeadRecall, HeadMassRecall []float64
	// RelL2 is ||o - o_dense|| / ||o_dense|| over all query heads; NaN
	// when o_dense is zero and o is not (see [RelL2]). AbsL2 is
	// ||o - o_dense||.
	RelL2, AbsL2 float64
	// PagesRead and PagesTotal count (KV head, page) pairs read by the
	// step's attention vs by dense attention.
	PagesRead, PagesTotal int
	// SlackP50, SlackP90 and SlackMax summarize the page slack g_p(q) =
	// U_p(q) - max_r q.k_r (see shard.PageSlack; logit units) over the
	// (query head, page) pairs of the step: how loose the Quest bound is.
	// Sequences of more than shard.SlackPages pages are sampled: every
	// shard.SlackStride-th page (their quantiles and maximum are the
	// sample's).
	SlackP50, SlackP90, SlackMax float64
	// Stop holds, with Options.StopRule on a sparse step, one row per
	// query head: the stop rules of notes 3.2 replayed on the step's
	// pages (see StopRow).
	Stop []StopRow
}

// StopBatches are the pages per round of the branch-and-bound searches
// a StopRow records (notes 3.2: batching trades certificate tightness
// for fewer rounds).
var StopBatches = [...]int{1, 4, 16}

// StopGridMax bounds the ranked-page counts k whose coverage a StopRow
// records (0..min(Ranked, StopGridMax)).
const StopGridMax = 256

// StopRow is one query head of one sparse step under the stop rules of
// notes 3.2, in float64 from the keys: every page's Quest bound U_p
// computed for this head alone (per_head bounds, scaled by 1/sqrt(D)),
// the forced pages (sink and local) always read, the other Ranked pages
// ranked by descending bound.
type StopRow struct {
	// Head is the query head; Ranked the pages ranked (not forced).
	Head, Ranked int
	// Opened, per StopBatches entry, counts the ranked pages the
	// branch-and-bound exact top-R search opened; Certified tells whether
	// it stopped on the certificate (false: it opened every page, the
	// fallback). R is Options.TopR.
	Opened    [len(StopBatches)]int
	Certified [len(StopBatches)]bool
	// OpenedTop1 and CertifiedTop1 are the one-page-a-round search for
	// the exact top-1 token (R = 1).
	OpenedTop1    int
	CertifiedTop1 bool
	// Exact tells whether the searches' top-R equalled the dense scan's
	// (always, unless a bound was violated).
	Exact bool
	// StopMassBound is the softmax-mass bound (kernels.MassBound) at the
	// one-page-a-round search's stop.
	StopMassBound float64
	// Gap[k], Recall[k], Mass[k] and MassBound[k], for k ranked pages
	// read by descending bound (k = 0..min(Ranked, StopGridMax)): the
	// score gap U_(k) - U_(k+1) (+Inf at k = 0 and k = Ranked), the
	// recall of the dense top-R tokens, the dense softmax mass read and
	// the mass bound of the unread pages, with the forced pages read.
	Gap, Recall, Mass, MassBound []float32
}

// CountPages sets PagesRead and PagesTotal from Selected: each KV head
// (every group of g consecutive query heads) reads the union of its query
// heads' pages, out of pages.
func (dg *Diagnostics) CountPages(g, pages int) {
	dg.PagesRead, dg.PagesTotal = 0, 0
	union := make([]bool, pages)
	for h0 := 0; h0 < len(dg.Selected); h0 += g {
		clear(union)
		for _, sel := range dg.Selected[h0:min(h0+g, len(dg.Selected))] {
			for _, p := range sel {
				union[p] = true
			}
		}
		dg.PagesTotal += pages
		for _, u := range union {
			if u {
				dg.PagesRead++
			}
		}
	}
}
