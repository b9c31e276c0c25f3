package kernels

import (
	"cmp"
	"container/heap"
	"math"
	"slices"
)

// Stop rules beyond a fixed top-K (notes 3.2, issue 32 item 4): the
// branch-and-bound search that certifies the exact token top-R from the
// page bounds (BranchBound), the bound on the softmax mass of the unread
// pages (MassBound) and the score-gap feature U_(K) - U_(K+1) of the
// sorted bounds (ScoreGap). These are pure functions over float64 page
// bounds and logits, all in the units softmax uses (scaled by
// 1/sqrt(D)): no backend runs them on the serving path yet; the
// diagnostics replay them on every sparse step (decode.Options.StopRule).

// StopPage is one page as the stop rules see it: its upper bound U_p on
// every valid token's scaled logit, and its count of valid tokens S_p.
type StopPage struct {
	Bound  float64
	Tokens int
}

// BnBConfig tunes BranchBound.
type BnBConfig struct {
	// R is the number of tokens whose exact top set is certified (at
	// least 1).
	R int
	// Batch is the pages opened per round before the certificate is
	// checked (notes 3.2: batching trades certificate tightness for
	// fewer rounds). Default (0): 1.
	Batch int
}

// StopToken is one token found by BranchBound: its scaled logit, its
// page and its slot in the page.
type StopToken struct {
	Logit float64
	Page  int
	Slot  int
}

// StopBefore orders tokens by descending logit, ties by ascending page
// then slot (the order of the exact top-R).
func StopBefore(a, b StopToken) int {
	if c := cmp.Compare(b.Logit, a.Logit); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Page, b.Page); c != 0 {
		return c
	}
	return cmp.Compare(a.Slot, b.Slot)
}

// BnBResult is what one BranchBound search did.
type BnBResult struct {
	// Opened counts the ranked (not forced) pages opened; Rounds the
	// rounds of Batch pages.
	Opened, Rounds int
	// Certified is true when the search stopped on the certificate
	// U_next < tau_R with ranked pages left unread; false when it opened
	// every page (the fallback to a full scan).
	Certified bool
	// Tau is tau_R at the stop: the R-th largest logit read (-Inf when
	// fewer than R tokens exist).
	Tau float64
	// Top is the exact top-R, in StopBefore order (fewer when the pages
	// hold fewer than R tokens).
	Top []StopToken
	// MassBound is the notes' bound on the softmax mass outside the
	// pages read ([MassBound]); 0 when every page was read.
	MassBound float64
	// Open lists the ranked pages opened, in the order opened.
	Open []int
}

// BranchBound runs the notes' exact top-R search over pages: the forced
// pages (forced[p] true; may be nil) are read first, then the other pages
// in descending bound (ties: lower index first), cfg.Batch at a time;
// after each round, when the next unread page's bound is below tau_R
// (the R-th largest logit read so far), no unread token can enter the
// top-R and the search stops. open(p) returns page p's scaled logits
// (len = pages[p].Tokens); it is called once per page read and never for
// a page left unread. The bounds must be true upper bounds of the
// logits; the result's Top is then the exact top-R of all tokens.
func BranchBound(pages []StopPage, forced []bool, open func(p int) []float64, cfg BnBConfig) BnBResult {
	r := max(cfg.R, 1)
	batch := cfg.Batch
	if batch <= 0 {
		batch = 1
	}
	var top stopHeap // min-heap of the best r read, worst at the root
	logZ := math.Inf(-1)
	read := func(p int) {
		for t, x := range open(p) {
			logZ = LogAddExp(logZ, x)
			tok := StopToken{Logit: x, Page: p, Slot: t}
			if len(top) < r {
				heap.Push(&top, tok)
			} else if StopBefore(tok, top[0]) < 0 {
				top[0] = tok
				heap.Fix(&top, 0)
			}
		}
	}
	order := make([]int, 0, len(pages))
	for p := range pages {
		if forced != nil && forced[p] {
			read(p)
			continue
		}
		order = append(order, p)
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(pages[b].Bound, pages[a].Bound); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	res := BnBResult{Tau: math.Inf(-1)}
	i := 0
	for i < len(order) {
		if len(top) == r {
			res.Tau = top[0].Logit
			if pages[order[i]].Bound < res.Tau {
				res.Certified = true
				break
			}
		}
		for end := min(i+batch, len(order)); i < end; i++ {
			read(order[i])
			res.Open = append(res.Open, order[i])
		}
		res.Rounds++
	}
	if len(top) == r {
		res.Tau = top[0].Logit
	}
	res.Opened = i
	unread := make([]StopPage, 0, len(order)-i)
	for _, p := range order[i:] {
		unread = append(unread, pages[p])
	}
	res.MassBound = MassBound(logZ, unread)
	res.Top = append([]StopToken(nil), top...)
	slices.SortFunc(res.Top, StopBefore)
	return res
}

// MassBound returns the notes' bound on the softmax mass of the unread
// tokens: with Z_C = exp(logZC) the exponential sum of the tokens read
// and A = sum over unread pages of S_p exp(U_p),
//
//	eps <= A / (Z_C + A).
//
// It is 0 when no unread page holds a token and 1 when nothing was read
// (logZC = -Inf) and something is unread. Computed in float64 relative
// to the largest exponent, so large logits do not overflow.
func MassBound(logZC float64, unread []StopPage) float64 {
	m := logZC
	for _, p := range unread {
		if p.Tokens > 0 {
			m = max(m, p.Bound+math.Log(float64(p.Tokens)))
		}
	}
	if math.IsInf(m, -1) {
		return 0
	}
	var a float64
	for _, p := range unread {
		if p.Tokens > 0 {
			a += float64(p.Tokens) * math.Exp(p.Bound-m)
		}
	}
	if a == 0 {
		return 0
	}
	return a / (math.Exp(logZC-m) + a)
}

// ScoreGap returns the notes' score-gap feature U_(k) - U_(k+1) of
// bounds sorted in descending order (1-based ranks): +Inf when k is 0 or
// at least len(sorted) (no page on one side of the cut).
func ScoreGap(sorted []float64, k int) float64 {
	if k <= 0 || k >= len(sorted) {
		return math.Inf(1)
	}
	return sorted[k-1] - sorted[k]
}

// LogAddExp returns log(exp(a) + exp(b)) without overflow (-Inf is an
// empty sum).
func LogAddExp(a, b float64) float64 {
	if math.IsInf(a, -1) {
		return b
	}
	if math.IsInf(b, -1) {
		return a
	}
	if a < b {
		a, b = b, a
	}
	return a + math.Log1p(math.Exp(b-a))
}

// stopHeap is a heap whose root is the worst token kept (the last in
// StopBefore order).
type stopHeap []StopToken

func (h stopHeap) Len() int           { return len(h) }
func (h stopHeap) Less(i, j int) bool { return StopBefore(h[i], h[j]) > 0 }
func (h stopHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *stopHeap) Push(x any)        { *h = append(*h, x.(StopToken)) }
func (h *stopHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
