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
}

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
	}
	for l, b := range p.LayerBudget {
		if b < p.PageSize {
			return fmt.Errorf("policy: layer %d budget %d is below one page (%d tokens)", l, b, p.PageSize)
		}
	}
	return nil
}

// Plan is the page plan of one sequence for one layer. Logical pages
// [0, Sink) and [Pages-Local, Pages) are forced; Rank pages are chosen from
// the candidates [Sink, Pages-Local). Dense plans read every page.
type Plan struct {
	Pages int  // P, pages holding at least one valid token
	Dense bool // read every page (dense layer, dense selector, or K >= P)
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
	if layer < p.DenseLayers || p.Selector == Dense || k >= pages {
		pl.Dense = true
		return pl, nil
	}
	pl.Sink = min(p.SinkPages, pages)
	pl.Local = min(p.LocalPages, pages-pl.Sink)
	pl.Rank = min(max(k-pl.Sink-pl.Local, 0), pl.Hi()-pl.Lo())
	return pl, nil
}
