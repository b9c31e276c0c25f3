package kernels

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Top-p pruning after the page selection (plan.Policy.TopP, issue 32):
// the exact scaled logits of the tokens a sparse step would read
// (TopPLogits), per query head the smallest set of them whose softmax
// mass reaches p (TopPSelect, a cut), and attention over the kept tokens
// only (AttendTopP). A KV head (a group_max row) reads the union of its
// query heads' sets; a per_head row reads its head's set. Only the CPU
// backend implements it.

// ErrTopPUnsupported is returned where top-p pruning is asked of a
// backend or a pool that cannot run it (anything but the CPU backend
// reading host pools).
var ErrTopPUnsupported = errors.New("top-p pruning needs the CPU backend with host pools")

// TopPToken is one candidate token of one query head: its scaled logit
// q.k/sqrt(D) and its global position in the sequence (global page x S
// + slot).
type TopPToken struct {
	Logit float32
	Pos   int32
}

// topPBefore orders tokens by descending logit, ties by ascending
// position: the order in which the smallest set is taken.
func topPBefore(a, b TopPToken) int {
	if c := cmp.Compare(b.Logit, a.Logit); c != 0 {
		return c
	}
	return cmp.Compare(a.Pos, b.Pos)
}

// TopPCut is a query head's kept set: the tokens at or before the cut
// token in topPBefore's order.
type TopPCut struct {
	Logit float32
	Pos   int32
}

// TopPKeepAll is the cut that keeps every token (a head that is not
// pruned).
var TopPKeepAll = TopPCut{Logit: float32(math.Inf(-1)), Pos: math.MaxInt32}

// Keeps reports whether the token (logit, pos) is in the cut's set.
func (c TopPCut) Keeps(logit float32, pos int32) bool {
	return logit > c.Logit || logit == c.Logit && pos <= c.Pos
}

// TopPSelect returns the cut of the smallest set of toks whose softmax
// mass over toks reaches p (0 < p <= 1) and its size: toks sorted by
// descending logit (ties: ascending position, so every rank and layout
// takes the same set), the shortest prefix whose mass, summed in float64
// in that order, is at least p times the total. It sorts toks in place.
// With no tokens it keeps nothing (n = 0).
func TopPSelect(toks []TopPToken, p float64) (cut TopPCut, n int) {
	if len(toks) == 0 {
		return TopPCut{Logit: float32(math.Inf(1)), Pos: math.MinInt32}, 0
	}
	slices.SortFunc(toks, topPBefore)
	m := float64(toks[0].Logit)
	var total float64
	for _, t := range toks {
		total += math.Exp(float64(t.Logit) - m)
	}
	goal := p * total
	var cum float64
	for i, t := range toks {
		cum += math.Exp(float64(t.Logit) - m)
		if cum >= goal {
			return TopPCut(t), i + 1
		}
	}
	// Unreachable for p <= 1: cum reaches total, summed in the same
	// order, at the last token.
	last := toks[len(toks)-1]
	return TopPCut(last), len(toks)
}

// TopPKeep says which tokens AttendTopP reads: Global[i] is the global
// page of the list entry lists.Pages[i] (the position of its slot j is
// Global[i]*S + j), and Cuts[seq*QHeads + h] query head h's cut. A
// token is read by a row when the cut of any of the row's query heads
// keeps it.
type TopPKeep struct {
	Global []int32
	Cuts   []TopPCut
}

// mask sets to -Inf the logits (logits[h*sz+tok], heads heads, n tokens)
// of the tokens that none of the row's heads (cuts from head index c0)
// keeps; pos0 is the position of slot 0. It reports whether any token
// is kept.
func (k *TopPKeep) mask(logits []float32, heads, n, sz int, c0, pos0 int32) bool {
	any := false
	ninf := float32(math.Inf(-1))
	for tok := range n {
		pos := pos0 + int32(tok)
		kept := false
		for h := range heads {
			if k.Cuts[c0+int32(h)].Keeps(logits[h*sz+tok], pos) {
				kept = true
				break
			}
		}
		if kept {
			any = true
			continue
		}
		for h := range heads {
			logits[h*sz+tok] = ninf
		}
	}
	return any
}

// TopPLogits writes the scaled logits of the listed pages' valid tokens
// for every query head of each row into dst: entry lists.Pages[i] of a
// row with heads query heads (the group for group_max, 1 for per_head)
// fills dst[(i*heads+h)*S + slot], -Inf in the slots past a tail page's
// valid length. dst must hold len(lists.Pages)*heads*S floats; lists
// must not be All. The bits equal those AttendTopP compares with the
// cuts. It runs on one goroutine (the attention that follows is the
// parallel part).
func (c *CPU) TopPLogits(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, lists *Lists, dst []float32) error {
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := s.Validate(); err != nil {
		return fmt.Errorf("top-p logits: %w", err)
	}
	if err := b.Validate(s, l); err != nil {
		return fmt.Errorf("top-p logits: %w", err)
	}
	n := b.Len()
	d, sz := s.HeadDim, s.PageSize
	if len(q) != n*s.QHeads*d {
		return fmt.Errorf("top-p logits: query has %d floats, want %d", len(q), n*s.QHeads*d)
	}
	rows := s.Rows(lists.Mode)
	if lists.All || len(lists.Indptr) != n*rows+1 || lists.Indptr[0] != 0 || int(lists.Indptr[n*rows]) != len(lists.Pages) {
		return fmt.Errorf("top-p logits: lists (all %v) indptr has %d entries for %d rows and %d pages", lists.All, len(lists.Indptr), n*rows, len(lists.Pages))
	}
	heads := s.Group()
	if lists.Mode == PerHead {
		heads = 1
	}
	if len(dst) != len(lists.Pages)*heads*sz {
		return fmt.Errorf("top-p logits: dst has %d floats, want %d", len(dst), len(lists.Pages)*heads*sz)
	}
	t := &c.attend
	var err error
	if t.seen, err = lists.Check(b, rows, t.seen); err != nil {
		return fmt.Errorf("top-p logits: %w", err)
	}
	if len(t.scratch) == 0 {
		t.scratch = make([]attendScratch, 1)
	}
	sc := &t.scratch[0]
	if l.FP8() && cap(sc.k) < sz*d {
		sc.k = make([]float32, sz*d)
		sc.v = make([]float32, sz*d)
	}
	scale := float32(1 / math.Sqrt(float64(d)))
	ninf := float32(math.Inf(-1))
	for row := range n * rows {
		seq, r := row/rows, row%rows
		kvh, h0 := r, r*heads
		if lists.Mode == PerHead {
			kvh, h0 = r/s.Group(), r
		}
		qh := q[(seq*s.QHeads+h0)*d:][:heads*d]
		np := b.NumPages(seq)
		pages := b.Pages[b.Indptr[seq]:b.Indptr[seq+1]]
		for i := lists.Indptr[row]; i < lists.Indptr[row+1]; i++ {
			lp := lists.Pages[i]
			nt := sz
			if int(lp) == np-1 {
				nt = int(b.LastLen[seq])
			}
			kp, _ := pageKV(l, int(pages[lp])*s.KVHeads+kvh, nt, sz, d, sc)
			out := dst[int(i)*heads*sz:][:heads*sz]
			pageLogits(qh, kp, nt, heads, d, sz, scale, out)
			for h := range heads {
				for j := nt; j < sz; j++ {
					out[h*sz+j] = ninf
				}
			}
		}
	}
	return nil
}

// AttendTopP is Attend reading only the tokens keep keeps (see
// TopPKeep): each row's partial state is normalised over its kept
// tokens, and a row that keeps none of its listed tokens contributes
// the empty state. lists must not be All.
func (c *CPU) AttendTopP(ctx context.Context, s Shape, l Layer, b *Batch, q []float32, lists *Lists, keep *TopPKeep, o, lse []float32) error {
	if lists.All || len(keep.Global) != len(lists.Pages) || len(keep.Cuts) != b.Len()*s.QHeads {
		return fmt.Errorf("attend top-p: lists (all %v) of %d pages, keep has %d global pages and %d cuts (want %d)",
			lists.All, len(lists.Pages), len(keep.Global), len(keep.Cuts), b.Len()*s.QHeads)
	}
	return c.attendKeep(ctx, s, l, b, q, lists, keep, o, lse)
}
