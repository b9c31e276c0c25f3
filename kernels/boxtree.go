package kernels

import (
	"errors"
	"fmt"
	"math"
)

// BoxTree holds hierarchical boxes over the page summaries of one
// sequence (issue 32, notes 3.1): a level-1 box covers Group consecutive
// logical pages and holds, per KV head, the element-wise minimum of their
// minima and maximum of their maxima; a level-i box covers Group boxes of
// level i-1. A box's Quest score bounds the score of every page under it
// (the box contains each member's box), which lets [CPU.HierRank] skip
// whole groups whose bound cannot beat the running K-th page score.
//
// Boxes are float32 (min and max are exact in float32). The search scores
// a box with the flat kernel's own float32 code (scoreHeads on the box's
// record) and that rounded value bounds the rounded score of every member
// page, with no margin: the computation is monotone in every record
// element in the direction the box moves it. The split query pairs each
// w_j <= 0 with a minimum and each w_j >= 0 with a maximum, so a box
// element (smaller minimum, larger maximum) never lowers a product; every
// step after that (a rounded product, a rounded sum, a fused multiply-add
// with a fixed-sign factor, the max over heads) is a monotone function of
// its inputs under round-to-nearest. The same instructions in the same
// order run for a box and a page (scoreHeads picks dot4 or dot by the
// head's position only), so fl32(U_box) >= fl32(U_page) for every member,
// ties included; TestBoxTreeBounds checks it against float64 references.
//
// The tree is caller-owned and not safe for concurrent use; Sync keeps it
// consistent with the summaries when pages are appended or a tail page's
// summary changes.
type BoxTree struct {
	group  int
	kvh, d int
	pages  int
	// levels[i] are the boxes of level i+1: [nodes][KVHeads][2][D].
	levels [][]float32
	// memo is HierRank's fallback memory per score row of the sequence.
	memo []hierMemo
}

// ErrHierConfig is returned for a hierarchical configuration that cannot
// work (a group below 2, a tree of another shape).
var ErrHierConfig = errors.New("kernels: bad hierarchical selection configuration")

// NewBoxTree returns an empty tree whose boxes cover group pages (or
// group boxes of the level below) each; group must be at least 2.
func NewBoxTree(group int) (*BoxTree, error) {
	if group < 2 {
		return nil, fmt.Errorf("%w: group %d < 2", ErrHierConfig, group)
	}
	return &BoxTree{group: group}, nil
}

// Group is the number of children of a box.
func (t *BoxTree) Group() int { return t.group }

// Pages is the number of logical pages the tree covers (as of the last
// Sync).
func (t *BoxTree) Pages() int { return t.pages }

// Levels is the number of box levels: level 1 boxes pages, the top level
// holds at most Group boxes. A tree over at most Group pages has one level;
// an empty tree none.
func (t *BoxTree) Levels() int { return len(t.levels) }

// Nodes is the number of boxes of level (1..Levels()).
func (t *BoxTree) Nodes(level int) int {
	return len(t.levels[level-1]) / max(2*t.d*t.kvh, 1)
}

// Box returns the minima and maxima of box node of level (1..Levels())
// for KV head kvh. The slices alias the tree.
func (t *BoxTree) Box(level, node, kvh int) (mins, maxs []float32) {
	rec := 2 * t.d
	r := t.levels[level-1][(node*t.kvh+kvh)*rec:][:rec]
	return r[:t.d], r[t.d:]
}

// Sync makes the tree cover the logical pages of a sequence whose
// physical ids are pages, reading their summaries from summary (the
// layer's pool, [physical pages][KVHeads][2][HeadDim]). The caller
// promises that the summaries of logical pages below from are the ones
// the tree was last synced with (from = 0 rebuilds everything); every box
// covering a page at or after from is recomputed, ancestors included, so
// an append costs O(levels * Group) records. A from above the pages the
// tree covers is taken as that count. The shape must not change between
// calls (or from must be 0).
func (t *BoxTree) Sync(s Shape, summary []float32, pages []int32, from int) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("box tree: %w", err)
	}
	rec := 2 * s.HeadDim
	if len(summary)%(s.KVHeads*rec) != 0 {
		return fmt.Errorf("box tree: summary pool of %d floats is not whole %d-float pages", len(summary), s.KVHeads*rec)
	}
	pool := len(summary) / (s.KVHeads * rec)
	for i, p := range pages {
		if p < 0 || int(p) >= pool {
			return fmt.Errorf("box tree: physical page %d at %d outside pool of %d", p, i, pool)
		}
	}
	if t.kvh != s.KVHeads || t.d != s.HeadDim {
		t.kvh, t.d, from = s.KVHeads, s.HeadDim, 0
	}
	from = max(min(from, t.pages, len(pages)), 0)
	t.pages = len(pages)
	g := t.group
	n := len(pages) // nodes of the level below
	lvl := 0
	for n > 1 || (lvl == 0 && n == 1) {
		nodes := (n + g - 1) / g
		if lvl == len(t.levels) {
			t.levels = append(t.levels, nil)
		}
		t.levels[lvl] = growF(t.levels[lvl], nodes*s.KVHeads*rec)
		first := from / g
		for node := first; node < nodes; node++ {
			for kvh := range s.KVHeads {
				dst := t.levels[lvl][(node*s.KVHeads+kvh)*rec:][:rec]
				for j := range s.HeadDim {
					dst[j], dst[s.HeadDim+j] = float32(math.Inf(1)), float32(math.Inf(-1))
				}
				for c := node * g; c < min(node*g+g, n); c++ {
					var src []float32
					if lvl == 0 {
						src = summary[(int(pages[c])*s.KVHeads+kvh)*rec:][:rec]
					} else {
						src = t.levels[lvl-1][(c*s.KVHeads+kvh)*rec:][:rec]
					}
					for j := range s.HeadDim {
						dst[j] = min(dst[j], src[j])
						dst[s.HeadDim+j] = max(dst[s.HeadDim+j], src[s.HeadDim+j])
					}
				}
			}
		}
		from, n = first, nodes
		lvl++
		if nodes <= g {
			break
		}
	}
	t.levels = t.levels[:lvl]
	return nil
}

func growF(s []float32, n int) []float32 {
	if cap(s) < n {
		ns := make([]float32, n)
		copy(ns, s)
		return ns
	}
	return s[:n]
}
