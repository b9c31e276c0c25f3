package plots

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Attention layout, in pixels.
const (
	attentionPanelWidth  = 520
	attentionPanelHeight = 400
	attentionLegend      = 230
	attentionTitle       = 90
	yLabelWidth          = 30
)

// AttentionSize is the size in pixels of the attention figure with the
// given grid of panels.
func AttentionSize(rows, cols int) (width, height int) {
	return attentionLegend + max(cols, 1)*attentionPanelWidth, attentionTitle + max(rows, 1)*attentionPanelHeight
}

// attentionSeries are the timings drawn, in legend order.
var attentionSeries = []struct {
	name   string
	get    func(*AttentionRow) *float64
	color  color.Color
	width  float64
	dash   []vg.Length
	glyph  draw.GlyphDrawer
	radius float64
}{
	{"dense", func(r *AttentionRow) *float64 { return r.DenseUS }, color.Black, 2.2, nil, draw.CircleGlyph{}, 2.8},
	{"Quest step (as served)", func(r *AttentionRow) *float64 { return r.QuestUS }, rgb(0xd62728), 2.2, nil, draw.CircleGlyph{}, 2.8},
	{"Quest step, three calls", func(r *AttentionRow) *float64 { return r.PhasedUS }, rgb(0xd62728), 1.4, []vg.Length{vg.Points(6), vg.Points(3)}, nil, 0},
	{"phase: score", func(r *AttentionRow) *float64 { return r.ScoreUS }, rgb(0x1f77b4), 1.3, nil, draw.TriangleGlyph{}, 2.6},
	{"phase: top-K", func(r *AttentionRow) *float64 { return r.TopKUS }, rgb(0x2ca02c), 1.3, nil, draw.SquareGlyph{}, 2.4},
	{"phase: sparse attention", func(r *AttentionRow) *float64 { return r.AttendUS }, rgb(0x9467bd), 1.3, nil, draw.PyramidGlyph{}, 2.6},
}

// attentionGroup is what a panel's rows share but the budget: one row of
// the grid.
type attentionGroup struct {
	backend, dtype                          string
	batch, pageSize, qHeads, kvHeads, headD int
}

// Attention draws step time against context length, log-log, from
// `questctl bench attention` lines (see the package doc).
func Attention(rows []AttentionRow) (*Figure, error) {
	if len(rows) == 0 {
		return nil, ErrNoRecords
	}
	type key struct {
		g       attentionGroup
		budget  int
		context int
	}
	rs := lastOf(rows, func(r AttentionRow) key { return key{groupOf(&r), r.Budget, r.Context} })
	var groups []attentionGroup
	var budgets []int
	xlo, xhi := math.Inf(1), math.Inf(-1)
	ylo, yhi := map[attentionGroup]float64{}, map[attentionGroup]float64{} // per grid row
	present := make([]bool, len(attentionSeries))
	for i := range rs {
		r := &rs[i]
		g := groupOf(r)
		if !slices.Contains(groups, g) {
			groups = append(groups, g)
			ylo[g], yhi[g] = math.Inf(1), math.Inf(-1)
		}
		if !slices.Contains(budgets, r.Budget) {
			budgets = append(budgets, r.Budget)
		}
		for si, s := range attentionSeries {
			if v := s.get(r); v != nil && *v > 0 {
				present[si] = true
				xlo, xhi = min(xlo, float64(r.Context)), max(xhi, float64(r.Context))
				ylo[g], yhi[g] = min(ylo[g], *v), max(yhi[g], *v)
			}
		}
	}
	if math.IsInf(xlo, 0) {
		return nil, fmt.Errorf("attention: no positive timing in %d lines", len(rs))
	}
	if len(groups) > MaxPanels || len(budgets) > MaxPanels {
		return nil, fmt.Errorf("attention: %d budgets and %d (batch, geometry) groups: at most %d of each in one figure (split the lines)", len(budgets), len(groups), MaxPanels)
	}
	slices.SortStableFunc(groups, func(a, b attentionGroup) int { return cmp.Compare(a.batch, b.batch) })
	slices.Sort(budgets)
	if xlo == xhi {
		xlo, xhi = xlo/2, xhi*2
	}

	varies := func(f func(attentionGroup) string) bool {
		for _, g := range groups {
			if f(g) != f(groups[0]) {
				return true
			}
		}
		return false
	}
	describe := []struct {
		get func(attentionGroup) string
	}{
		{func(g attentionGroup) string { return g.backend }},
		{func(g attentionGroup) string { return g.dtype }},
		{func(g attentionGroup) string { return fmt.Sprintf("page size %d", g.pageSize) }},
		{func(g attentionGroup) string { return fmt.Sprintf("%d q / %d KV heads", g.qHeads, g.kvHeads) }},
		{func(g attentionGroup) string { return fmt.Sprintf("head dim %d", g.headD) }},
	}
	var shared []string
	for _, d := range describe {
		if !varies(d.get) && strings.TrimSpace(d.get(groups[0])) != "" {
			shared = append(shared, d.get(groups[0]))
		}
	}
	title := "bench attention: step time vs context"
	if len(shared) > 0 {
		title += titleSep + strings.Join(shared, ", ")
	}
	if iters := rs[0].Iters; iters > 0 && !slices.ContainsFunc(rs, func(r AttentionRow) bool { return r.Iters != iters }) {
		title += titleSep + fmt.Sprintf("median of %d steps", iters)
	}

	grid := make([][]*plot.Plot, len(groups))
	for gi, g := range groups {
		grid[gi] = make([]*plot.Plot, len(budgets))
		for bi, b := range budgets {
			var cell []AttentionRow
			for _, r := range rs {
				if groupOf(&r) == g && r.Budget == b {
					cell = append(cell, r)
				}
			}
			if len(cell) == 0 {
				continue
			}
			slices.SortFunc(cell, func(a, b AttentionRow) int { return cmp.Compare(a.Context, b.Context) })
			var name []string
			for _, d := range describe {
				if v := d.get(g); varies(d.get) && v != "" {
					name = append(name, v)
				}
			}
			name = append(name, fmt.Sprintf("batch %d", g.batch), fmt.Sprintf("budget %d", b))
			xLabel, yLabel := "", ""
			if gi == len(groups)-1 {
				xLabel = "context (tokens, log2)"
			}
			p := newPlot(strings.Join(name, ", "), xLabel, yLabel)
			p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
			p.X.Tick.Marker, p.Y.Tick.Marker = pow2Ticks{}, log10Ticks{}
			for _, s := range attentionSeries {
				var xys plotter.XYs
				for i := range cell {
					if v := s.get(&cell[i]); v != nil && *v > 0 {
						xys = append(xys, plotter.XY{X: float64(cell[i].Context), Y: *v})
					}
				}
				if len(xys) == 0 {
					continue
				}
				sr, err := newSeries(xys, s.color, s.width, s.dash, s.glyph, s.radius)
				if err != nil {
					return nil, fmt.Errorf("attention: %s: %w", s.name, err)
				}
				sr.add(p)
			}
			if math.IsInf(ylo[g], 0) {
				continue // no positive timing in this row
			}
			p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = xlo, xhi, ylo[g]/1.25, yhi[g]*1.25
			grid[gi][bi] = p
		}
	}
	var legend []legendEntry
	for si, s := range attentionSeries {
		if present[si] {
			sr, _ := newSeries(plotter.XYs{{}}, s.color, s.width, s.dash, s.glyph, s.radius)
			legend = append(legend, legendEntry{s.name, sr.thumbs()})
		}
	}

	w, h := AttentionSize(len(groups), len(budgets))
	return &Figure{Width: w, Height: h, draw: func(c draw.Canvas) {
		c = drawTitle(c, title)
		c = draw.Crop(c, px(10), -px(10), px(8), 0)
		cols := columns(c, yLabelWidth, float64(len(budgets)*attentionPanelWidth)-yLabelWidth)
		tiles := draw.Tiles{Rows: len(groups), Cols: len(budgets), PadX: px(16), PadY: px(16), PadRight: px(8)}
		for gi, row := range plot.Align(grid, tiles, cols[1]) {
			labelled := false
			for bi, cc := range row {
				if p := grid[gi][bi]; p != nil {
					p.Draw(cc)
					if !labelled {
						drawYLabel(c, (cols[0].Min.X+cols[0].Max.X)/2, p.DataCanvas(cc), "time per step (µs, log)")
						labelled = true
					}
				}
			}
		}
		drawLegend(draw.Crop(cols[2], px(14), 0, 0, -px(30)), []string{"median time per step"}, legend)
	}}, nil
}

func groupOf(r *AttentionRow) attentionGroup {
	return attentionGroup{r.Backend, r.DType, r.Batch, r.PageSize, r.QHeads, r.KVHeads, r.HeadDim}
}
