package plan

import (
	"fmt"
	"slices"
)

// GQAMode says how the query heads of one KV head group share page
// selection.
type GQAMode int

const (
	// GroupMax gives each KV head one page set; a page's score is the max
	// over the group's query heads. Score rows are KV heads. Default.
	GroupMax GQAMode = iota
	// PerHead lets every query head select its own pages; the KV head reads
	// the union. Score rows are query heads.
	PerHead
)

// String returns the mode's name as used in configs and the replay format.
func (m GQAMode) String() string {
	switch m {
	case GroupMax:
		return "group_max"
	case PerHead:
		return "per_head"
	}
	return fmt.Sprintf("GQAMode(%d)", int(m))
}

// ParseGQAMode parses "group_max" or "per_head" ("" means group_max).
func ParseGQAMode(s string) (GQAMode, error) {
	switch s {
	case "", "group_max":
		return GroupMax, nil
	case "per_head":
		return PerHead, nil
	}
	return 0, fmt.Errorf("unknown gqa mode %q (want group_max or per_head)", s)
}

// Selector is the page-ranking rule of a step. Quest is the product; the
// others exist for ablations (notes 2.2).
type Selector int

const (
	// Quest ranks pages by the min/max upper bound of q.k. Default.
	Quest Selector = iota
	// Oracle ranks pages by the true max q.k over the page's keys (reads
	// every key: for diagnosis of the bound's looseness only).
	Oracle
	// Recent keeps the sink pages and the most recent pages
	// (StreamingLLM-like, query-agnostic).
	Recent
	// Dense reads every page.
	Dense
)

var selectorNames = []string{"quest", "oracle", "recent", "dense"}

// String returns the selector's name.
func (s Selector) String() string {
	if int(s) < len(selectorNames) && s >= 0 {
		return selectorNames[s]
	}
	return fmt.Sprintf("Selector(%d)", int(s))
}

// ParseSelector parses quest|oracle|recent|dense ("" means quest).
func ParseSelector(name string) (Selector, error) {
	if name == "" {
		return Quest, nil
	}
	if i := slices.Index(selectorNames, name); i >= 0 {
		return Selector(i), nil
	}
	return 0, fmt.Errorf("unknown selector %q (want quest, oracle, recent or dense)", name)
}

// Policy decides, for one sequence and layer, which pages a step reads. It
// is the one place that turns budgets into page counts; every backend and
// every layout (single shard, CP x TP) uses it.
type Policy struct {
	// PageSize is S, tokens per page. Default 16.
	PageSize int
	// BudgetTokens is the default token budget B per head per step; the
	// page budget is K = B / S pages, forced pages included. Default 2048.
	BudgetTokens int
	// SinkPages are the first pages of a sequence, always read and never
	// ranked. Default 0.
	SinkPages int
	// LocalPages are the last pages (the tail page is the last one),
	// always read and never ranked. Default 1.
	LocalPages int
	// DenseLayers: layers below this index attend over every page.
	// Default 2 (the notes' measurement on LongChat/Yarn-Llama-2).
	DenseLayers int
	// DenseRho makes a sparse layer's step read every page while Quest
	// would read at least this share of the dense bytes: rho = 1/S + K/P
	// (every page's summary plus K of the P pages) >= DenseRho. Below the
	// context where rho falls under it, dense attention costs no more than
	// the score, the top-K and the sparse read together (a backend's
	// measured crossover). 0 (the default) is off: a layer is dense by
	// context only when K >= P. At most 2.
	DenseRho float64
	// LayerBudget overrides BudgetTokens per layer (layer -> tokens).
	// A per-request budget still wins over both.
	LayerBudget map[int]int
	// GQA is how the query heads of a group share a page set. Default
	// group_max.
	GQA GQAMode
	// Selector ranks pages. Default Quest.
	Selector Selector
	// SummaryDType is the storage type of the page summaries the score
	// reads (default SummaryKV: the K/V type). It is a property of the
	// backend's pools: a component that makes its own backend (the
	// engine's CPU backend) configures it from here; a backend given
	// from outside must have been made with the same type.
	SummaryDType SummaryDType
	// HierGroup > 0 ranks the quest selector's pages by a best-first
	// search over hierarchical min/max boxes of HierGroup pages (issue
	// 32): exactly the same pages as flat scoring, fewer summary records
	// read where the bounds prune. At least 2 (at most MaxHierGroup)
	// when set. Where a shard cannot search (a backend other than the
	// CPU one, device-resident or offloaded pools, prefetch), it scores
	// flat. Default 0: flat scoring.
	HierGroup int
	// TopP in (0, 1) prunes a sparse step's tokens after the page
	// selection (issue 32, as Twilight): the exact scaled logits of the
	// tokens the step would read (forced and selected pages) are
	// computed, and each KV head keeps the union over its query heads
	// of each head's smallest set of tokens whose softmax mass (over
	// those tokens) reaches TopP; attention then reads only the kept
	// tokens, normalised over them. The union keeps the guarantee per
	// query head (every head keeps at least TopP of its mass), where the
	// smallest set by the group's summed probabilities would only bound
	// the group's mean and could starve a head whose attention differs
	// from its group's. Dense plans are not pruned. Only the CPU
	// backend with host pools runs it; others refuse the policy. 0 (the
	// default) and 1 are off: every token is read.
	TopP float64
	// SubBoxes > 1 keeps, per page and KV head, SubBoxes contiguous
	// min/max boxes of PageSize/SubBoxes token slots each (issue 32,
	// multi-box summaries) and ranks a quest page by the largest bound
	// over its non-empty sub-boxes: never above the single box's bound
	// and still an upper bound of every key's score (invariant 1). A page
	// is read once however many of its sub-boxes score high. The score
	// reads SubBoxes x 2 x HeadDim values per page and KV head. Must
	// divide PageSize, at most MaxSubBoxes; not with HierGroup. Only the
	// CPU backend with host float32 pools (no offload, no persistence,
	// no fp8 K/V) keeps sub-boxes; others refuse the policy. 0 (the
	// default) and 1 are off: one box per page.
	SubBoxes int
	// ReuseSteps > 1 reuses a sparse layer's page selection across the
	// decode steps of a sequence (issue 32 item 5): the layer ranks
	// pages afresh at one step and, at the next ReuseSteps-1 steps of
	// that sequence, scores nothing and runs no selection collective;
	// it attends, per selection row, over the pages it ranked at the
	// ranking step plus every page that has become a candidate since
	// (pages that were forced as local then, or appended since: the
	// newest pages are never dropped), and the forced pages as always.
	// A reuse step therefore reads Rank + (P - P0) ranked pages, P0 the
	// pages at the ranking step. A layer ranks afresh at its first
	// sparse step of a sequence; at a step whose token is not exactly one
	// past the previous step's of that layer (a rollback, tokens appended
	// outside steps, a step without a token; a rollback followed by
	// re-appending as many tokens outside steps is the one change this
	// rule does not see); whenever its plan's shape (K, sink, local,
	// rank: a request's budget) differs from the ranking step's or its
	// plan is dense; on a fork's new branch (the original keeps its
	// state); after a failed step; and on a worker that restarted or
	// adopted the sequence (the state lives in the worker's memory
	// only). A step forced dense as a whole (the dense pass of
	// diagnostics) neither counts nor changes the state. Every CP rank
	// keeps the same global selection, decides from the same step
	// messages and attends its own pages of it, so a CP x TP layout
	// reads the pages the single shard reads. The device tensor path
	// (a fused step on the GPU) refuses it: the host step program runs
	// it. 0 (the default) and 1 are off: every step ranks. At most
	// MaxReuseSteps.
	ReuseSteps int
	// ReuseLayers lists, ascending, the layers that reuse the page
	// selection of the layer before them at the same step instead of
	// ranking (issue 32 item 5, across adjacent layers): such a layer
	// scores nothing and runs no selection collective; it attends, per
	// selection row, the pages layer-1 attended as ranked pages at this
	// token (what it ranked, or itself reused), and the forced pages as
	// always. It ranks afresh when layer-1 has no such selection at this
	// token: its plan was dense or ranked nothing, its plan's shape (K,
	// sink, local, rank, pages: a layer budget of its own) differs, the
	// step brings no token, or layer-1's selection is from another
	// token (the layer's length at the step must equal the length
	// layer-1 stepped at). A listed layer never reuses across steps
	// (ReuseSteps applies to the others); a chain (layers 3 and 4
	// listed) carries layer 2's selection to layer 4. A step forced
	// dense as a whole (the dense pass of diagnostics) neither uses nor
	// changes the kept selection; a failed step, a fork's new branch
	// and a restarted worker start without one. Every CP rank keeps the
	// same global selection and decides from the same step messages, so
	// a CP x TP layout reads the pages the single shard reads. The
	// device tensor path refuses it. Each listed layer must be at least
	// 1 and follow a layer that is not dense by policy (IsDenseLayer);
	// at most MaxReuseLayers entries. Empty (the default): every sparse
	// layer ranks.
	ReuseLayers []int
}

// ReuseLayersOn reports whether some layer reuses the selection of the
// layer before it (ReuseLayers).
func (p Policy) ReuseLayersOn() bool { return len(p.ReuseLayers) > 0 }

// ReusesLayer reports whether layer reuses the selection of layer-1
// (ReuseLayers).
func (p Policy) ReusesLayer(layer int) bool { return slices.Contains(p.ReuseLayers, layer) }

// MaxReuseLayers bounds the entries of Policy.ReuseLayers.
const MaxReuseLayers = 1024

// ReuseOn reports whether the policy reuses selections across steps
// (ReuseSteps > 1).
func (p Policy) ReuseOn() bool { return p.ReuseSteps > 1 }

// MaxReuseSteps is the largest Policy.ReuseSteps.
const MaxReuseSteps = 4096

// SubBoxesOn reports whether the policy keeps multi-box summaries
// (SubBoxes > 1).
func (p Policy) SubBoxesOn() bool { return p.SubBoxes > 1 }

// MaxSubBoxes is the largest Policy.SubBoxes.
const MaxSubBoxes = 64

// TopPOn reports whether the policy prunes tokens by top-p (0 < TopP < 1).
func (p Policy) TopPOn() bool { return p.TopP > 0 && p.TopP < 1 }

// MaxHierGroup is the largest Policy.HierGroup.
const MaxHierGroup = 1024

// DefaultPolicy returns the defaults documented on Policy (those of the
// official Quest code).
func DefaultPolicy() Policy {
	return Policy{PageSize: 16, BudgetTokens: 2048, LocalPages: 1, DenseLayers: 2}
}

// Validate reports whether the policy is usable.
func (p Policy) Validate() error {
	switch {
	case p.PageSize < 1:
		return fmt.Errorf("policy: page size %d < 1", p.PageSize)
	case p.BudgetTokens < p.PageSize:
		return fmt.Errorf("policy: token budget %d is below one page (%d tokens)", p.BudgetTokens, p.PageSize)
	case p.SinkPages < 0 || p.LocalPages < 0 || p.DenseLayers < 0:
		return fmt.Errorf("policy: sink %d, local %d and dense layers %d must not be negative", p.SinkPages, p.LocalPages, p.DenseLayers)
	case p.GQA != GroupMax && p.GQA != PerHead:
		return fmt.Errorf("policy: unknown GQA mode %d", p.GQA)
	case p.Selector < Quest || p.Selector > Dense:
		return fmt.Errorf("policy: unknown selector %d", p.Selector)
	case !p.SummaryDType.Known():
		return fmt.Errorf("policy: unknown summary dtype %d", p.SummaryDType)
	case !(p.DenseRho >= 0 && p.DenseRho <= MaxDenseRho):
		return fmt.Errorf("policy: dense rho %v outside 0..%v", p.DenseRho, MaxDenseRho)
	case p.HierGroup != 0 && (p.HierGroup < 2 || p.HierGroup > MaxHierGroup):
		return fmt.Errorf("policy: hierarchical group %d outside 2..%d (0: off)", p.HierGroup, MaxHierGroup)
	case p.TopP != 0 && !(p.TopP > 0 && p.TopP <= 1):
		return fmt.Errorf("policy: top-p %v outside (0, 1] (0: off)", p.TopP)
	case p.SubBoxes < 0 || p.SubBoxes > MaxSubBoxes || (p.SubBoxes > 1 && p.PageSize%p.SubBoxes != 0):
		return fmt.Errorf("policy: sub-boxes %d: want 0 or 1 (off) or a divisor of the page size %d up to %d", p.SubBoxes, p.PageSize, MaxSubBoxes)
	case p.ReuseSteps < 0 || p.ReuseSteps > MaxReuseSteps:
		return fmt.Errorf("policy: reuse steps %d outside 0..%d (0 and 1: off)", p.ReuseSteps, MaxReuseSteps)
	case p.SubBoxesOn() && p.HierGroup != 0:
		return fmt.Errorf("policy: sub-boxes %d with hierarchical group %d: the box trees are built over single page boxes", p.SubBoxes, p.HierGroup)
	}
	if len(p.ReuseLayers) > MaxReuseLayers {
		return fmt.Errorf("policy: %d reuse layers, at most %d", len(p.ReuseLayers), MaxReuseLayers)
	}
	for i, l := range p.ReuseLayers {
		switch {
		case l < 1:
			return fmt.Errorf("policy: reuse layer %d: want a layer >= 1 (it reuses the layer before it)", l)
		case i > 0 && l <= p.ReuseLayers[i-1]:
			return fmt.Errorf("policy: reuse layers %v: want ascending, each once", p.ReuseLayers)
		case p.IsDenseLayer(l - 1):
			return fmt.Errorf("policy: reuse layer %d follows dense layer %d, which selects nothing", l, l-1)
		}
	}
	for l, b := range p.LayerBudget {
		if b < p.PageSize {
			return fmt.Errorf("policy: layer %d budget %d is below one page (%d tokens)", l, b, p.PageSize)
		}
	}
	return nil
}

// MaxDenseRho bounds Policy.DenseRho: rho = 1/S + K/P stays below 2
// whenever K < P, so a larger threshold could never be reached.
const MaxDenseRho = 2

// Plan is the page plan of one sequence for one layer. Logical pages
// [0, Sink) and [Pages-Local, Pages) are forced; Rank pages are chosen from
// the candidates [Sink, Pages-Local). Dense plans read every page.
type Plan struct {
	Pages int  // P, pages holding at least one valid token
	Dense bool // read every page (dense layer, dense selector, K >= P, or rho >= DenseRho)
	K     int  // page budget B/S
	Sink  int  // forced first pages
	Local int  // forced last pages
	Rank  int  // pages the selector chooses among the candidates
}

// Lo is the first candidate page.
func (p Plan) Lo() int { return p.Sink }

// Hi is one past the last candidate page.
func (p Plan) Hi() int { return p.Pages - p.Local }

// Reads is the number of pages the plan attends.
func (p Plan) Reads() int {
	if p.Dense {
		return p.Pages
	}
	return p.Sink + p.Local + p.Rank
}

// AsDense returns the plan turned into a dense read of every page.
func (p Plan) AsDense() Plan { return Plan{Pages: p.Pages, K: p.K, Dense: true} }

// denseByRho reports whether a sparse read of k of pages pages would
// read at least DenseRho of the dense bytes (Policy.DenseRho).
func (p Policy) denseByRho(k, pages int) bool {
	return p.DenseRho > 0 && pages > 0 && 1/float64(p.PageSize)+float64(k)/float64(pages) >= p.DenseRho
}

// Plan computes the plan for a sequence of pages pages at layer; budget is
// the request's token budget (0: the layer's or the default budget).
func (p Policy) Plan(layer, pages, budget int) (Plan, error) {
	if budget == 0 {
		budget = p.BudgetTokens
		if b, ok := p.LayerBudget[layer]; ok {
			budget = b
		}
	}
	k := budget / p.PageSize
	if k < 1 {
		return Plan{}, fmt.Errorf("token budget %d gives %d pages of %d tokens: need at least one page", budget, k, p.PageSize)
	}
	pl := Plan{Pages: pages, K: k}
	if layer < p.DenseLayers || p.Selector == Dense || k >= pages || p.denseByRho(k, pages) {
		pl.Dense = true
		return pl, nil
	}
	pl.Sink = min(p.SinkPages, pages)
	pl.Local = min(p.LocalPages, pages-pl.Sink)
	pl.Rank = min(max(k-pl.Sink-pl.Local, 0), pl.Hi()-pl.Lo())
	return pl, nil
}
