package plots

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/questrt/questrt/eval"
)

// Passkey layout, in pixels: a margin, the accuracy panel, its legend,
// then a column per selector of the recall grid and the budget legend.
const (
	passkeyMargin       = 10
	passkeyAccWidth     = 560
	passkeyAccLegend    = 210
	passkeyGap          = 20
	passkeyColumn       = 290 // per selector of the recall grid
	passkeyBudgetLegend = 150
	passkeyMinHeight    = 620
	passkeyRowHeight    = 330 // per row (length) of the recall grid
)

// PasskeySize is the size in pixels of the passkey figure with a recall
// grid of the given rows (lengths, or (length, offset) groups, with mass
// recall) and columns
// (selectors); no rows: the accuracy panel alone.
func PasskeySize(rows, cols int) (width, height int) {
	w := 2*passkeyMargin + passkeyAccWidth + passkeyGap + passkeyAccLegend
	if rows == 0 || cols == 0 {
		return w, passkeyMinHeight
	}
	return w + passkeyGap + cols*passkeyColumn + passkeyBudgetLegend, max(passkeyMinHeight, 140+passkeyRowHeight*rows)
}

// massRecall is one record's mass recall per layer (NaN where absent).
type massRecall struct {
	layers  []float64
	teacher bool
}

func recordMassRecall(r *eval.Record) (massRecall, bool) {
	pick := func(ph *eval.Phase) []float64 {
		if ph == nil {
			return nil
		}
		out, any := make([]float64, len(ph.Layers)), false
		for i, l := range ph.Layers {
			out[i] = math.NaN()
			if l.MassRecall != nil && !math.IsNaN(*l.MassRecall) && !math.IsInf(*l.MassRecall, 0) {
				out[i], any = *l.MassRecall, true
			}
		}
		if !any {
			return nil
		}
		return out
	}
	if ls := pick(r.TeacherForced); ls != nil {
		return massRecall{ls, true}, true
	}
	if ls := pick(r.FreeRunning); ls != nil {
		return massRecall{ls, false}, true
	}
	return massRecall{}, false
}

// promptGroup is what a record's prompts share: a length, and for tasks
// other than the plain passkey the task and the answer's in-page offset.
// Each group has its accuracy lines and its row of the recall grid.
type promptGroup struct {
	length       int
	task, offset string
}

func promptGroupOf(r *eval.Record) promptGroup { return promptGroup{r.Length, r.Task, r.Offset} }

// groupLabels names the groups by what varies among them (task, length,
// offset); a lone group is named by its length.
func groupLabels(gs []promptGroup) map[promptGroup]string {
	var tasks, lengths, offsets bool
	for _, g := range gs {
		tasks = tasks || g.task != gs[0].task
		lengths = lengths || g.length != gs[0].length
		offsets = offsets || g.offset != gs[0].offset
	}
	out := map[promptGroup]string{}
	for _, g := range gs {
		var parts []string
		if tasks && g.task != "" {
			parts = append(parts, g.task)
		}
		if lengths || !offsets {
			parts = append(parts, fmt.Sprintf("length %d", g.length))
		}
		if offsets {
			parts = append(parts, "offset "+g.offset)
		}
		out[g] = strings.Join(parts, ", ")
	}
	return out
}

// Passkey draws accuracy against the token budget and mass recall per
// layer from `questctl eval passkey` records (see the package doc).
func Passkey(recs []eval.Record) (*Figure, error) {
	if len(recs) == 0 {
		return nil, ErrNoRecords
	}
	type key struct {
		g        promptGroup
		selector string
		budget   int
	}
	idx := map[key]int{}
	var rs []eval.Record
	for i := range recs {
		k := key{promptGroupOf(&recs[i]), recs[i].Selector, recs[i].Budget}
		if j, ok := idx[k]; ok {
			rs[j] = recs[i]
			continue
		}
		idx[k] = len(rs)
		rs = append(rs, recs[i])
	}
	var groups []promptGroup
	var budgets []int
	var selectors []string
	for i := range rs {
		r := &rs[i]
		if g := promptGroupOf(r); !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
		if r.Selector == "dense" {
			continue
		}
		if !slices.Contains(selectors, r.Selector) {
			selectors = append(selectors, r.Selector)
		}
		if !slices.Contains(budgets, r.Budget) {
			budgets = append(budgets, r.Budget)
		}
	}
	if len(selectors) == 0 {
		return nil, errors.New("passkey: only dense records, no (selector, budget) to plot")
	}
	// By length and task; offsets in the order given.
	slices.SortStableFunc(groups, func(a, b promptGroup) int {
		return cmp.Or(cmp.Compare(a.length, b.length), cmp.Compare(a.task, b.task))
	})
	slices.Sort(budgets)
	labels := groupLabels(groups)

	// The dense baseline per group: its own record, or the dense accuracy
	// the sparse records carry.
	dense := map[promptGroup]float64{}
	for i := range rs {
		if rs[i].Selector == "dense" {
			dense[promptGroupOf(&rs[i])] = rs[i].Accuracy
		}
	}
	for i := range rs {
		if g := promptGroupOf(&rs[i]); rs[i].Selector != "dense" {
			if _, ok := dense[g]; !ok {
				dense[g] = rs[i].DenseAccuracy
			}
		}
	}

	// Mass recall per (group, selector, budget).
	recall := map[key]massRecall{}
	layers, teacher, free := 0, false, false
	denseLayers := map[promptGroup]int{} // the sparse records' dense layers
	for i := range rs {
		r := &rs[i]
		if r.Selector == "dense" {
			continue
		}
		g := promptGroupOf(r)
		denseLayers[g] = max(denseLayers[g], r.DenseLayers)
		m, ok := recordMassRecall(r)
		if !ok {
			continue
		}
		recall[key{g, r.Selector, r.Budget}] = m
		layers = max(layers, len(m.layers))
		teacher, free = teacher || m.teacher, free || !m.teacher
	}
	var recallGroups []promptGroup
	for _, g := range groups {
		if slices.ContainsFunc(selectors, func(s string) bool {
			return slices.ContainsFunc(budgets, func(b int) bool { _, ok := recall[key{g, s, b}]; return ok })
		}) {
			recallGroups = append(recallGroups, g)
		}
	}
	if len(recallGroups) > MaxPanels || len(selectors) > MaxPanels {
		return nil, fmt.Errorf("passkey: %d (length, offset) groups and %d selectors: at most %d of each in one figure (split the lines)", len(recallGroups), len(selectors), MaxPanels)
	}

	acc, accLegend, err := accuracyPlot(rs, groups, labels, selectors, budgets, dense)
	if err != nil {
		return nil, err
	}
	var grid [][]*plot.Plot
	var budgetLegend []legendEntry
	recallMode := "teacher-forced"
	switch {
	case teacher && free:
		recallMode = "teacher-forced where present"
	case !teacher:
		recallMode = "free-running"
	}
	for ri, g := range recallGroups {
		var row []*plot.Plot
		for ci, s := range selectors {
			var cell []series
			for bi, b := range budgets {
				m, ok := recall[key{g, s, b}]
				if !ok {
					continue
				}
				var xys plotter.XYs
				for i, v := range m.layers {
					if !math.IsNaN(v) {
						xys = append(xys, plotter.XY{X: float64(i), Y: v})
					}
				}
				sr, err := newSeries(xys, sequential(bi, len(budgets)), 1.5, nil, draw.CircleGlyph{}, 2.3)
				if err != nil {
					return nil, fmt.Errorf("passkey: mass recall of %s/%d at %s: %w", s, b, labels[g], err)
				}
				cell = append(cell, sr)
			}
			if len(cell) == 0 {
				row = append(row, nil)
				continue
			}
			yLabel, xLabel := "", ""
			if ci == 0 {
				yLabel = "attention-mass recall"
			}
			if ri == len(recallGroups)-1 {
				xLabel = "layer"
			}
			p := newPlot(s+", "+labels[g], xLabel, yLabel)
			p.Title.TextStyle.Font.Size = vg.Points(11)
			p.X.Min, p.X.Max = -0.3, float64(layers-1)+0.3
			p.Y.Min, p.Y.Max = -0.02, 1.02
			if dl := denseLayers[g]; dl > 0 {
				band, _ := plotter.NewPolygon(plotter.XYs{{X: p.X.Min, Y: p.Y.Min}, {X: float64(dl) - 0.5, Y: p.Y.Min}, {X: float64(dl) - 0.5, Y: p.Y.Max}, {X: p.X.Min, Y: p.Y.Max}})
				band.Color, band.LineStyle.Width = color.Gray{Y: 232}, 0
				p.Add(band)
				if len(budgetLegend) == 0 {
					budgetLegend = append(budgetLegend, legendEntry{"dense layers", []plot.Thumbnailer{band}})
				}
			}
			for _, c := range cell {
				c.add(p)
			}
			p.X.Tick.Marker = intTicks(0, layers-1)
			p.Y.Tick.Marker = fractionTicks
			row = append(row, p)
		}
		grid = append(grid, row)
	}
	var entries []legendEntry
	for bi, b := range budgets {
		sr, _ := newSeries(plotter.XYs{{}}, sequential(bi, len(budgets)), 1.5, nil, draw.CircleGlyph{}, 2.3)
		entries = append(entries, legendEntry{fmt.Sprint(b), sr.thumbs()})
	}
	budgetLegend = append(entries, budgetLegend...)

	w, h := PasskeySize(len(recallGroups), len(selectors))
	// A legend with long entries widens its column.
	accLegendW := float64(passkeyAccLegend)
	for _, e := range accLegend {
		accLegendW = max(accLegendW, 50+float64(textStyle(9.5).Width(e.text)/px(1)))
	}
	accLegendW = math.Ceil(accLegendW)
	w += int(accLegendW) - passkeyAccLegend
	title := passkeyTitle(rs)
	return &Figure{Width: w, Height: h, draw: func(c draw.Canvas) {
		c = drawTitle(c, title)
		c = draw.Crop(c, px(passkeyMargin), -px(passkeyMargin), px(8), 0)
		cols := columns(c, passkeyAccWidth, passkeyGap, accLegendW, passkeyGap, float64(len(selectors)*passkeyColumn))
		acc.Draw(cols[0])
		drawLegend(draw.Crop(cols[2], 0, 0, 0, -px(30)), []string{"accuracy"}, accLegend)
		if grid == nil {
			return
		}
		tiles := draw.Tiles{Rows: len(grid), Cols: len(selectors), PadX: px(14), PadY: px(14), PadRight: px(6)}
		for ri, row := range plot.Align(grid, tiles, cols[4]) {
			for ci, cc := range row {
				if p := grid[ri][ci]; p != nil {
					p.Draw(cc)
				}
			}
		}
		drawLegend(draw.Crop(cols[5], px(8), 0, 0, -px(30)), []string{"budget (tokens)", "mass recall:", recallMode}, budgetLegend)
	}}, nil
}

// accuracyPlot is the accuracy panel and its legend entries.
func accuracyPlot(rs []eval.Record, groups []promptGroup, labels map[promptGroup]string, selectors []string, budgets []int, dense map[promptGroup]float64) (*plot.Plot, []legendEntry, error) {
	title := "accuracy vs token budget"
	if len(groups) == 1 {
		title += ", " + labels[groups[0]]
	}
	p := newPlot(title, "token budget (log2)", "accuracy (free-running greedy)")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = pow2Ticks{}
	p.Y.Tick.Marker = fractionTicks
	lo, hi := float64(budgets[0]), float64(budgets[len(budgets)-1])
	if lo == hi {
		lo, hi = lo/2, hi*2
	}
	var entries []legendEntry
	suffix := func(g promptGroup) string {
		if len(groups) == 1 {
			return ""
		}
		return ", " + labels[g]
	}
	for gi, g := range groups {
		glyph, dash := glyphs[gi%len(glyphs)], dashes[gi%len(dashes)]
		for si, s := range selectors {
			var xys plotter.XYs
			for i := range rs {
				if promptGroupOf(&rs[i]) == g && rs[i].Selector == s {
					xys = append(xys, plotter.XY{X: float64(rs[i].Budget), Y: rs[i].Accuracy})
				}
			}
			if len(xys) == 0 {
				continue
			}
			slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
			sr, err := newSeries(xys, categorical[si%len(categorical)], 1.8, dash, glyph, 3.2)
			if err != nil {
				return nil, nil, fmt.Errorf("passkey: accuracy of %s at %s: %w", s, labels[g], err)
			}
			sr.add(p)
			entries = append(entries, legendEntry{s + suffix(g), sr.thumbs()})
		}
		if a, ok := dense[g]; ok {
			// With several groups, the group's marker at both ends.
			radius := 0.0
			if len(groups) > 1 {
				radius = 3
			}
			sr, err := newSeries(plotter.XYs{{X: lo, Y: a}, {X: hi, Y: a}}, color.Gray{Y: 90}, 1.4, []vg.Length{vg.Points(7), vg.Points(4)}, glyph, radius)
			if err != nil {
				return nil, nil, err
			}
			sr.add(p)
			entries = append(entries, legendEntry{fmt.Sprintf("dense%s (%.3f)", suffix(g), a), sr.thumbs()})
		}
	}
	p.X.Min, p.X.Max = lo, hi
	p.Y.Min, p.Y.Max = -0.03, 1.03
	return p, entries, nil
}

// passkeyTitle names the model and the policy settings the records share.
func passkeyTitle(rs []eval.Record) string {
	same := func(f func(r *eval.Record) string) (string, bool) {
		v, ok := "", true
		for i := range rs {
			if rs[i].Selector == "dense" {
				continue
			}
			s := f(&rs[i])
			if v == "" {
				v = s
			} else if s != v {
				ok = false
			}
		}
		return v, ok
	}
	var parts []string
	if m, ok := same(func(r *eval.Record) string { return filepath.Base(r.Model) }); ok && m != "." && m != "" {
		parts = append(parts, m)
	}
	var pol []string
	for _, f := range []struct {
		name string
		get  func(r *eval.Record) string
	}{
		{"page size", func(r *eval.Record) string { return fmt.Sprint(r.PageSize) }},
		{"dense layers", func(r *eval.Record) string { return fmt.Sprint(r.DenseLayers) }},
		{"sink", func(r *eval.Record) string { return fmt.Sprint(r.Sink) }},
		{"local", func(r *eval.Record) string { return fmt.Sprint(r.Local) }},
		{"gqa", func(r *eval.Record) string { return r.GQA }},
	} {
		if s, ok := same(f.get); ok && s != "" && !(f.name == "page size" && s == "0") {
			pol = append(pol, f.name+" "+s)
		}
	}
	if len(pol) > 0 {
		parts = append(parts, strings.Join(pol, ", "))
	}
	if n, ok := same(func(r *eval.Record) string { return fmt.Sprint(r.N) }); ok {
		if n == "1" {
			parts = append(parts, "n = 1 prompt per point")
		} else {
			parts = append(parts, "n = "+n+" prompts per point")
		}
	}
	if t, ok := same(func(r *eval.Record) string { return r.Task }); ok && t != "" {
		parts = append(parts, "task "+t)
		if l, ok := same(func(r *eval.Record) string { return fmt.Sprint(r.Length) }); ok {
			parts = append(parts, "length "+l)
		}
	}
	if q, ok := same(func(r *eval.Record) string { return fmt.Sprint(r.DecodeQuestion) }); ok && q == "true" {
		parts = append(parts, "question decoded")
	}
	return "eval passkey: " + strings.Join(parts, titleSep)
}
