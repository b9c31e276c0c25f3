package plan

import (
	"fmt"
	"math"
)

// Placement maps a sequence's pages to CP ranks. Pages are placed whole,
// never striped by token (a token-striped layout breaks page summaries).
type Placement int

const (
	// Striped puts page p on rank p mod N (default): every rank gets an
	// even share of any window of the context.
	Striped Placement = iota
	// Contiguous puts blocks of Layout.BlockPages consecutive pages on one
	// rank, blocks going round-robin over the ranks.
	Contiguous
)

// String returns the placement's name.
func (p Placement) String() string {
	switch p {
	case Striped:
		return "striped"
	case Contiguous:
		return "contiguous"
	}
	return fmt.Sprintf("Placement(%d)", int(p))
}

// ParsePlacement parses striped|contiguous ("" means striped).
func ParsePlacement(s string) (Placement, error) {
	switch s {
	case "", "striped":
		return Striped, nil
	case "contiguous":
		return Contiguous, nil
	}
	return 0, fmt.Errorf("unknown placement %q (want striped or contiguous)", s)
}

// Layout is how one sequence is spread over shards: its pages over CP
// context-parallel ranks by Placement, its KV heads (with their query
// heads) over TP tensor-parallel ranks.
type Layout struct {
	CP, TP    int
	Placement Placement
	// BlockPages is the block of the Contiguous placement (the engine's
	// default is 64); Striped ignores it.
	BlockPages int
}

// Validate reports whether the layout is usable for kvHeads KV heads.
func (l Layout) Validate(kvHeads int) error {
	switch {
	case l.CP < 1 || l.TP < 1:
		return fmt.Errorf("layout: cp %d and tp %d must be positive", l.CP, l.TP)
	case l.Placement != Striped && l.Placement != Contiguous:
		return fmt.Errorf("layout: unknown placement %d", l.Placement)
	case l.Placement == Contiguous && l.BlockPages < 1:
		return fmt.Errorf("layout: contiguous placement needs a block of at least 1 page, not %d", l.BlockPages)
	case kvHeads%l.TP != 0:
		return fmt.Errorf("layout: %d KV heads do not split over tp %d", kvHeads, l.TP)
	}
	return nil
}

// Place returns CP rank cp's view of the page placement.
func (l Layout) Place(cp int) Place {
	b := 1
	if l.Placement == Contiguous {
		b = l.BlockPages
	}
	return Place{Ranks: l.CP, Rank: cp, Block: b}
}

// Owner returns the CP rank that holds global page g.
func (l Layout) Owner(g int) int { return l.Place(0).Owner(g) }

// Place is one CP rank's view of a sequence's page placement: blocks of
// Block consecutive pages go round-robin over Ranks ranks (Striped is
// Block = 1). The zero Place (Ranks <= 1) is the identity: one rank holds
// every page. All methods are O(1): no page map is kept or sent.
type Place struct {
	Ranks, Rank, Block int
}

func (p Place) one() bool { return p.Ranks <= 1 }

func (p Place) block() int { return max(p.Block, 1) }

// Owner returns the rank that holds global page g.
func (p Place) Owner(g int) int {
	if p.one() {
		return 0
	}
	return (g / p.block()) % p.Ranks
}

// Global returns the global page of this rank's local page l.
func (p Place) Global(l int) int {
	if p.one() {
		return l
	}
	b := p.block()
	return ((l/b)*p.Ranks+p.Rank)*b + l%b
}

// Local returns this rank's local index of global page g, or -1 when
// another rank holds it.
func (p Place) Local(g int) int {
	if p.one() {
		return g
	}
	b := p.block()
	blk := g / b
	if blk%p.Ranks != p.Rank {
		return -1
	}
	return (blk/p.Ranks)*b + g%b
}

// Count returns how many of the global pages [0, x) this rank holds: the
// local pages of a sequence of x pages, and the local index of the first
// of this rank's pages at or after x.
func (p Place) Count(x int) int {
	if x <= 0 {
		return 0
	}
	if p.one() {
		return x
	}
	b := p.block()
	round := b * p.Ranks
	return (x/round)*b + min(max(x%round-p.Rank*b, 0), b)
}

// Tokens returns how many of the token positions [0, n) this rank holds,
// with pages of pageSize tokens.
func (p Place) Tokens(pageSize, n int) int {
	if n <= 0 {
		return 0
	}
	full, rem := n/pageSize, n%pageSize
	c := p.Count(full) * pageSize
	if rem > 0 && p.Owner(full) == p.Rank {
		c += rem
	}
	return c
}

// LocalRange returns the local pages [a, b) whose global index lies in
// [lo, hi).
func (p Place) LocalRange(lo, hi int) (int, int) {
	if hi <= lo {
		a := p.Count(lo)
		return a, a
	}
	return p.Count(lo), p.Count(hi)
}

// MaxPages is the largest page count whose global indices fit int32 (the
// page-table element type).
const MaxPages = math.MaxInt32

// SelectMode is how the CP ranks of a TP group agree on the pages of a
// step.
type SelectMode int

const (
	// Exact all-gathers each rank's local top candidates; every rank
	// derives the same global top-K ([MergeTopK]). Default.
	Exact SelectMode = iota
	// Union exchanges nothing: each rank keeps its local top
	// [UnionQuota](K', N) pages, K' the page budget minus the forced
	// pages. An approximation: it misses global top-K pages when one rank
	// holds more than its quota of them, and reads up to N*ceil(K'/N)
	// ranked pages.
	Union
	// Replicated keeps a copy of every summary on every CP rank; each rank
	// computes the global top-K alone (N times the scoring work, no
	// selection exchange). Quest and dense selectors only.
	Replicated
)

var selectModeNames = []string{"exact", "union", "replicated"}

// String returns the mode's name.
func (m SelectMode) String() string {
	if m >= 0 && int(m) < len(selectModeNames) {
		return selectModeNames[m]
	}
	return fmt.Sprintf("SelectMode(%d)", int(m))
}

// ParseSelectMode parses exact|union|replicated ("" means exact).
func ParseSelectMode(s string) (SelectMode, error) {
	for i, n := range selectModeNames {
		if s == n {
			return SelectMode(i), nil
		}
	}
	if s == "" {
		return Exact, nil
	}
	return 0, fmt.Errorf("unknown selection %q (want exact, union or replicated)", s)
}
