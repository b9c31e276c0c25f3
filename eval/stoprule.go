package eval

import (
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/questrt/questrt/decode"
)

// StopRules collects the stop-rule rows (Config.StopRule) of the
// teacher-forced runs, per (length, selector, budget) and prompt, and
// reports them (notes 3.2, issue 32 item 4): the exact top-R
// branch-and-bound search's pages opened and fallback rate, how often
// the softmax-mass bound is tight, and the score-gap adaptive budget
// calibrated on a development split of the prompts (even prompt index)
// and tested on the held-out split (odd index).
type StopRules struct {
	runs []*stopRun
}

type stopRun struct {
	length, budget int
	selector       string
	dev, test      []StopSample
}

// Add records the rows of one prompt's teacher-forced runs; index is
// the prompt's index in its length group (its split: even development,
// odd test).
func (s *StopRules) Add(index int, r *PromptResult) {
	for _, run := range r.Runs {
		if len(run.Teacher.Stop) == 0 {
			continue
		}
		i := slices.IndexFunc(s.runs, func(x *stopRun) bool {
			return x.length == r.Prompt.Length && x.budget == run.Budget && x.selector == run.Selector.String()
		})
		if i < 0 {
			s.runs = append(s.runs, &stopRun{length: r.Prompt.Length, budget: run.Budget, selector: run.Selector.String()})
			i = len(s.runs) - 1
		}
		x := s.runs[i]
		if index%2 == 0 {
			x.dev = append(x.dev, run.Teacher.Stop...)
		} else {
			x.test = append(x.test, run.Teacher.Stop...)
		}
	}
}

// StopReport is the stop rules' summary of one (length, selector,
// budget) run.
type StopReport struct {
	Length   int    `json:"length"`
	Selector string `json:"selector"`
	Budget   int    `json:"budget"`
	// Rows are the (step, sparse layer, query head) rows (both splits).
	Rows int `json:"rows"`
	// Ranked is the mean candidate pages per row; Quest the mean pages
	// fixed-K Quest ranks into its selection (plan.Plan.Rank).
	Ranked float64 `json:"ranked_mean"`
	Quest  float64 `json:"quest_rank_mean"`
	// BnB per batch size (decode.StopBatches); Top1 the search for the
	// top-1 token alone, one page a round.
	BnB  []BnBSummary `json:"bnb"`
	Top1 BnBSummary   `json:"bnb_top1"`
	// Mass bound tightness: the share of rows whose bound is below 0.01
	// and 0.05 at the one-page search's certified stops (rows that fell
	// back read every page: bound 0) and after Quest's ranked pages;
	// DroppedAtQuest is the true dropped mass there (mean).
	// MassStop01 and MassStop05 are the share of rows where reading pages
	// by descending bound brings the bound below 0.01 (0.05) within
	// decode.StopGridMax ranked pages, and MassStopK01, MassStopK05 the
	// mean pages that took there.
	StopBoundBelow01  float64 `json:"stop_bound_below_0_01"`
	StopBoundBelow05  float64 `json:"stop_bound_below_0_05"`
	QuestBoundBelow01 float64 `json:"quest_bound_below_0_01"`
	QuestBoundBelow05 float64 `json:"quest_bound_below_0_05"`
	QuestBoundMean    float64 `json:"quest_bound_mean"`
	DroppedAtQuest    float64 `json:"dropped_at_quest"`
	Certified         int     `json:"certified_rows"`
	MassStop01        float64 `json:"mass_stop_0_01"`
	MassStop05        float64 `json:"mass_stop_0_05"`
	MassStopK01       float64 `json:"mass_stop_pages_0_01"`
	MassStopK05       float64 `json:"mass_stop_pages_0_05"`
	// Gap is the score-gap adaptive budget (dev-calibrated, test-scored).
	Gap *GapReport `json:"gap,omitempty"`
}

// BnBSummary is the exact top-R search at one batch size.
type BnBSummary struct {
	Batch int `json:"batch"`
	// Pages opened per row (ranked pages, forced ones not counted).
	Mean     float64 `json:"opened_mean"`
	P95, Max int
	// Share is the mean of opened / ranked.
	Share float64 `json:"opened_share"`
	// Fallback is the share of rows that opened every ranked page.
	Fallback float64 `json:"fallback"`
	// Inexact counts rows whose top-R differed from the dense scan's
	// (0 unless a bound failed).
	Inexact int `json:"inexact"`
}

// Insufficient is the top-R recall below which a row's coverage counts
// as insufficient in the gap calibration: fewer than half of the dense
// top-R tokens read.
const Insufficient = 0.5

// GapReport is the score-gap policy: k0 ranked pages (Quest's), raised
// to k1 = 2 k0 when U_(k0) - U_(k0+1) is below Threshold. Coverage is
// insufficient where the top-R recall is below [Insufficient].
type GapReport struct {
	K0, K1    int
	Threshold float64
	// Bins are the dev quintiles of the gap with P(insufficient | bin)
	// on each split.
	Bins []GapBin
	// DevRows and TestRows count the rows of the splits.
	DevRows, TestRows int
	// Test split: the policy's ranked pages per row (mean, p95, max),
	// its recall of the dense top-R and mass recall; fixed-K Quest at
	// the same mean pages (a mix of the two nearest integer K), at k0
	// and at k1.
	Mean               float64
	P95, Max           int
	Recall, Mass       float64
	FixedRecall        float64
	FixedMass          float64
	RecallK0, RecallK1 float64
	MassK0, MassK1     float64
	// DevGain is the recall gain over fixed K at equal mean pages on
	// the dev split at the chosen threshold.
	DevGain float64
}

// GapBin is one gap interval [Lo, Hi) and P(insufficient | gap) there
// (nil Lo or Hi: unbounded).
type GapBin struct {
	Lo, Hi         *float64
	DevP, TestP    float64
	DevNo, TestNo  int
	DevIns, TestIn int
}

// Reports summarizes every run recorded.
func (s *StopRules) Reports() []StopReport {
	var out []StopReport
	for _, x := range s.runs {
		out = append(out, x.report())
	}
	return out
}

func (x *stopRun) report() StopReport {
	all := append(slices.Clone(x.dev), x.test...)
	rep := StopReport{Length: x.length, Selector: x.selector, Budget: x.budget, Rows: len(all)}
	if len(all) == 0 {
		return rep
	}
	n := float64(len(all))
	for i, b := range decode.StopBatches {
		bs := BnBSummary{Batch: b}
		opened := make([]int, 0, len(all))
		for _, r := range all {
			o := r.Opened[i]
			opened = append(opened, o)
			bs.Mean += float64(o)
			if r.Ranked > 0 {
				bs.Share += float64(o) / float64(r.Ranked)
			}
			if !r.Certified[i] {
				bs.Fallback++
			}
			if !r.Exact {
				bs.Inexact++
			}
		}
		bs.Mean /= n
		bs.Share /= n
		bs.Fallback /= n
		slices.Sort(opened)
		bs.P95, bs.Max = quantileInt(opened, 0.95), opened[len(opened)-1]
		rep.BnB = append(rep.BnB, bs)
	}
	t1 := BnBSummary{Batch: 1}
	opened := make([]int, 0, len(all))
	for _, r := range all {
		opened = append(opened, r.OpenedTop1)
		t1.Mean += float64(r.OpenedTop1)
		if r.Ranked > 0 {
			t1.Share += float64(r.OpenedTop1) / float64(r.Ranked)
		}
		if !r.CertifiedTop1 {
			t1.Fallback++
		}
		if !r.Exact {
			t1.Inexact++
		}
	}
	t1.Mean /= n
	t1.Share /= n
	t1.Fallback /= n
	slices.Sort(opened)
	t1.P95, t1.Max = quantileInt(opened, 0.95), opened[len(opened)-1]
	rep.Top1 = t1
	for _, r := range all {
		rep.Ranked += float64(r.Ranked)
		rep.Quest += float64(r.Rank)
		if r.Certified[0] {
			rep.Certified++
			if r.StopMassBound < 0.01 {
				rep.StopBoundBelow01++
			}
			if r.StopMassBound < 0.05 {
				rep.StopBoundBelow05++
			}
		}
		// Reading every page (k = Ranked) makes the bound 0: not a stop.
		mb := r.MassBound[:min(len(r.MassBound), r.Ranked)]
		if k := slices.IndexFunc(mb, func(b float32) bool { return b < 0.01 }); k >= 0 {
			rep.MassStop01++
			rep.MassStopK01 += float64(k)
		}
		if k := slices.IndexFunc(mb, func(b float32) bool { return b < 0.05 }); k >= 0 {
			rep.MassStop05++
			rep.MassStopK05 += float64(k)
		}
		k := min(r.Rank, len(r.MassBound)-1)
		b := float64(r.MassBound[k])
		rep.QuestBoundMean += b
		rep.DroppedAtQuest += 1 - float64(r.Mass[k])
		if b < 0.01 {
			rep.QuestBoundBelow01++
		}
		if b < 0.05 {
			rep.QuestBoundBelow05++
		}
	}
	rep.Ranked /= n
	rep.Quest /= n
	if rep.Certified > 0 {
		rep.StopBoundBelow01 /= float64(rep.Certified)
		rep.StopBoundBelow05 /= float64(rep.Certified)
	}
	if rep.MassStop01 > 0 {
		rep.MassStopK01 /= rep.MassStop01
	}
	if rep.MassStop05 > 0 {
		rep.MassStopK05 /= rep.MassStop05
	}
	rep.MassStop01 /= n
	rep.MassStop05 /= n
	rep.QuestBoundBelow01 /= n
	rep.QuestBoundBelow05 /= n
	rep.QuestBoundMean /= n
	rep.DroppedAtQuest /= n
	if len(x.dev) > 0 && len(x.test) > 0 {
		rep.Gap = gapReport(x.dev, x.test)
	}
	return rep
}

// at returns the row's value v[k], k clamped to the rows recorded.
func at(v []float32, k int) float64 { return float64(v[min(k, len(v)-1)]) }

// fixedAt returns the mean recall and mass of fixed-K at mean pages m
// (real): the mix of floor(m) and ceil(m) that reads m pages on
// average.
func fixedAt(rows []StopSample, m float64) (recall, mass float64) {
	lo := int(math.Floor(m))
	w := m - float64(lo)
	for _, r := range rows {
		recall += (1-w)*at(r.Recall, lo) + w*at(r.Recall, lo+1)
		mass += (1-w)*at(r.Mass, lo) + w*at(r.Mass, lo+1)
	}
	n := float64(len(rows))
	return recall / n, mass / n
}

// gapPolicy applies threshold t: k1 pages where the gap at k0 is below
// t, else k0 (both clamped to the pages recorded); it returns the pages
// per row, the mean recall and mass.
func gapPolicy(rows []StopSample, k0, k1 int, t float64) (pages []int, recall, mass float64) {
	for _, r := range rows {
		k := k0
		if at(r.Gap, k0) < t {
			k = k1
		}
		k = min(k, len(r.Recall)-1)
		pages = append(pages, k)
		recall += at(r.Recall, k)
		mass += at(r.Mass, k)
	}
	n := float64(len(rows))
	return pages, recall / n, mass / n
}

func meanInt(v []int) float64 {
	var s float64
	for _, x := range v {
		s += float64(x)
	}
	return s / float64(len(v))
}

func gapReport(dev, test []StopSample) *GapReport {
	k0 := dev[0].Rank
	if k0 <= 0 {
		return nil
	}
	g := &GapReport{K0: k0, K1: 2 * k0, DevRows: len(dev), TestRows: len(test)}
	// Rows with k0 pages or fewer to rank have no gap (+Inf): they are
	// never raised and take no part in the quantiles.
	gaps := make([]float64, 0, len(dev))
	for _, r := range dev {
		if x := at(r.Gap, k0); !math.IsInf(x, 1) {
			gaps = append(gaps, x)
		}
	}
	if len(gaps) == 0 {
		return nil
	}
	slices.Sort(gaps)
	// P(insufficient | gap quintile), edges from dev.
	edges := []float64{math.Inf(-1)}
	for _, q := range []float64{0.2, 0.4, 0.6, 0.8} {
		edges = append(edges, gaps[min(len(gaps)-1, int(q*float64(len(gaps))))])
	}
	edges = append(edges, math.Inf(1))
	for b := range len(edges) - 1 {
		lo, hi := edges[b], edges[b+1]
		bin := GapBin{}
		if !math.IsInf(lo, 0) {
			bin.Lo = &lo
		}
		if !math.IsInf(hi, 0) {
			bin.Hi = &hi
		}
		in := func(x float64) bool { return x >= lo && (x < hi || math.IsInf(hi, 1)) }
		for _, r := range dev {
			if x := at(r.Gap, k0); in(x) {
				bin.DevNo++
				if at(r.Recall, k0) < Insufficient {
					bin.DevIns++
				}
			}
		}
		for _, r := range test {
			if x := at(r.Gap, k0); in(x) {
				bin.TestNo++
				if at(r.Recall, k0) < Insufficient {
					bin.TestIn++
				}
			}
		}
		if bin.DevNo > 0 {
			bin.DevP = float64(bin.DevIns) / float64(bin.DevNo)
		}
		if bin.TestNo > 0 {
			bin.TestP = float64(bin.TestIn) / float64(bin.TestNo)
		}
		g.Bins = append(g.Bins, bin)
	}
	// The threshold: the dev gap decile with the best recall gain over
	// fixed K at equal mean pages.
	g.DevGain = math.Inf(-1)
	for _, q := range []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9} {
		t := gaps[min(len(gaps)-1, int(q*float64(len(gaps))))]
		pages, rec, _ := gapPolicy(dev, g.K0, g.K1, t)
		fr, _ := fixedAt(dev, meanInt(pages))
		if rec-fr > g.DevGain {
			g.DevGain, g.Threshold = rec-fr, t
		}
	}
	pages, rec, mass := gapPolicy(test, g.K0, g.K1, g.Threshold)
	g.Recall, g.Mass = rec, mass
	g.Mean = meanInt(pages)
	slices.Sort(pages)
	g.P95, g.Max = quantileInt(pages, 0.95), pages[len(pages)-1]
	g.FixedRecall, g.FixedMass = fixedAt(test, g.Mean)
	g.RecallK0, g.MassK0 = fixedAt(test, float64(g.K0))
	g.RecallK1, g.MassK1 = fixedAt(test, float64(g.K1))
	return g
}

// quantileInt returns the q-quantile of sorted v (nearest rank).
func quantileInt(v []int, q float64) int {
	i := int(math.Ceil(q*float64(len(v)))) - 1
	return v[max(0, min(len(v)-1, i))]
}

// WriteStopReport writes rep as text.
func WriteStopReport(w io.Writer, rep StopReport) {
	fmt.Fprintf(w, "stop rules: length %d, %s budget %d: %d rows (step x sparse layer x query head), %.1f ranked pages per row, Quest ranks %.1f\n",
		rep.Length, rep.Selector, rep.Budget, rep.Rows, rep.Ranked, rep.Quest)
	for _, b := range rep.BnB {
		fmt.Fprintf(w, "  exact top-R branch and bound, batch %2d: opened mean %.1f p95 %d max %d (share %.3f), fallback %.3f, inexact %d\n",
			b.Batch, b.Mean, b.P95, b.Max, b.Share, b.Fallback, b.Inexact)
	}
	fmt.Fprintf(w, "  exact top-1 branch and bound, batch  1: opened mean %.1f p95 %d max %d (share %.3f), fallback %.3f\n",
		rep.Top1.Mean, rep.Top1.P95, rep.Top1.Max, rep.Top1.Share, rep.Top1.Fallback)
	fmt.Fprintf(w, "  mass bound at the %d certified stops: < 0.01 in %.3f, < 0.05 in %.3f of them; after Quest's pages: mean %.3f (true dropped %.3f), < 0.01 in %.3f, < 0.05 in %.3f of rows\n",
		rep.Certified, rep.StopBoundBelow01, rep.StopBoundBelow05, rep.QuestBoundMean, rep.DroppedAtQuest, rep.QuestBoundBelow01, rep.QuestBoundBelow05)
	fmt.Fprintf(w, "  mass-bound stop before the last of at most %d ranked pages: bound < 0.01 reached in %.3f of rows (mean %.1f pages), < 0.05 in %.3f (mean %.1f pages)\n",
		decode.StopGridMax, rep.MassStop01, rep.MassStopK01, rep.MassStop05, rep.MassStopK05)
	g := rep.Gap
	if g == nil {
		return
	}
	fmt.Fprintf(w, "  score gap at k0 = %d (dev %d rows, test %d): P(top-R recall < 0.5 | gap quintile) dev / test:", g.K0, g.DevRows, g.TestRows)
	bound := func(x *float64, inf string) string {
		if x == nil {
			return inf
		}
		return fmt.Sprintf("%.3g", *x)
	}
	for _, b := range g.Bins {
		fmt.Fprintf(w, " [%s,%s) %.3f/%.3f (n %d/%d)", bound(b.Lo, "-inf"), bound(b.Hi, "inf"), b.DevP, b.TestP, b.DevNo, b.TestNo)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  gap policy k0 %d -> k1 %d below %.4g (dev gain %+.4f): test pages mean %.2f p95 %d max %d, recall %.4f mass %.4f; fixed K at equal mean pages recall %.4f mass %.4f; fixed k0 %.4f/%.4f, k1 %.4f/%.4f\n",
		g.K0, g.K1, g.Threshold, g.DevGain, g.Mean, g.P95, g.Max, g.Recall, g.Mass, g.FixedRecall, g.FixedMass, g.RecallK0, g.MassK0, g.RecallK1, g.MassK1)
}
