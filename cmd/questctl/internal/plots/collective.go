package plots

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// CollectiveRow is one "collective" line of `questctl bench collective
// --json`: the selection exchange and the merge of one configuration,
// with the same-run baseline of the same bytes (p50s and p99s in µs).
type CollectiveRow struct {
	Transport   string  `json:"transport"`
	Processes   int     `json:"processes"`
	Shards      int     `json:"shards"`
	Batch       int     `json:"batch"`
	K           int     `json:"k"`
	SelectP50   float64 `json:"select_p50_us"`
	SelectP99   float64 `json:"select_p99_us"`
	BaselineP50 float64 `json:"baseline_p50_us"`
	MergeP50    float64 `json:"merge_p50_us"`
}

// SweepRow is one "allgather_sweep" line of `questctl bench collective
// --min-bytes ... --json`: the plain all-gather of one message size
// (nccl-tests' columns).
type SweepRow struct {
	Transport string  `json:"transport"`
	Processes int     `json:"processes"`
	Shards    int     `json:"shards"`
	Bytes     int64   `json:"bytes"`
	P50       float64 `json:"p50_us"`
	P99       float64 `json:"p99_us"`
	BusBW     float64 `json:"busbw_gbps"`
}

// Collective layout, in pixels.
const (
	collectivePanelWidth  = 560
	collectivePanelHeight = 420
	collectiveLegend      = 330
)

// CollectiveSize is the size in pixels of the collective figure with
// panels panels in a row.
func CollectiveSize(panels int) (width, height int) {
	return collectiveLegend + max(panels, 1)*collectivePanelWidth, attentionTitle + collectivePanelHeight
}

// transportOf names a line's transport and placement.
func transportOf(transport string, processes int) string {
	if processes > 1 {
		return fmt.Sprintf("%s, %d processes", transport, processes)
	}
	return transport
}

// Collective draws the lines of `questctl bench collective`: from the
// size sweep, the all-gather's p50 (p99 dashed) against the message
// size (log-log) and its bus bandwidth against the size; from the
// configurations, the selection exchange's p50 against the ranks beside
// its same-run baseline (dashed), a line per (transport, batch). Panels
// without lines are left out. A configuration given twice is drawn from
// the later line.
func Collective(sweep []SweepRow, coll []CollectiveRow) (*Figure, error) {
	if len(sweep) == 0 && len(coll) == 0 {
		return nil, ErrNoRecords
	}
	// Later lines replace earlier ones of the same configuration.
	type sk struct {
		tr     string
		shards int
		bytes  int64
	}
	sw := lastOf(sweep, func(r SweepRow) sk { return sk{transportOf(r.Transport, r.Processes), r.Shards, r.Bytes} })
	type ck struct {
		tr            string
		batch, shards int
	}
	cs := lastOf(coll, func(r CollectiveRow) ck { return ck{transportOf(r.Transport, r.Processes), r.Batch, r.Shards} })

	var panels []*plot.Plot
	var yLabels []string
	var legend []legendEntry
	colors := 0 // colours taken by the sweep's lines
	if len(sw) > 0 {
		type line struct {
			tr     string
			shards int
		}
		var lines []line
		for _, r := range sw {
			if l := (line{transportOf(r.Transport, r.Processes), r.Shards}); !slices.Contains(lines, l) {
				lines = append(lines, l)
			}
		}
		if len(lines) > len(categorical) {
			return nil, fmt.Errorf("collective: %d (transport, ranks) sweeps: at most %d in one figure (split the lines)", len(lines), len(categorical))
		}
		tp := newPlot("all-gather: time vs size (p50, p99 dashed)", "bytes gathered (log2)", "")
		bp := newPlot("all-gather: bus bandwidth", "bytes gathered (log2)", "")
		for _, p := range []*plot.Plot{tp, bp} {
			p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, pow2Ticks{}
		}
		tp.Y.Scale, tp.Y.Tick.Marker = plot.LogScale{}, log10Ticks{}
		for li, l := range lines {
			var rs []SweepRow
			for _, r := range sw {
				if transportOf(r.Transport, r.Processes) == l.tr && r.Shards == l.shards && r.Bytes > 0 {
					rs = append(rs, r)
				}
			}
			slices.SortFunc(rs, func(a, b SweepRow) int { return cmp.Compare(a.Bytes, b.Bytes) })
			var p50, p99, bw plotter.XYs
			for _, r := range rs {
				x := float64(r.Bytes)
				if r.P50 > 0 {
					p50 = append(p50, plotter.XY{X: x, Y: r.P50})
				}
				if r.P99 > 0 {
					p99 = append(p99, plotter.XY{X: x, Y: r.P99})
				}
				bw = append(bw, plotter.XY{X: x, Y: r.BusBW})
			}
			c := categorical[li]
			for _, s := range []struct {
				p      *plot.Plot
				xys    plotter.XYs
				width  float64
				dash   []vg.Length
				glyph  draw.GlyphDrawer
				legend bool
			}{{tp, p50, 2, nil, draw.CircleGlyph{}, true}, {tp, p99, 1.2, dashes[1], nil, false}, {bp, bw, 2, nil, draw.CircleGlyph{}, false}} {
				if len(s.xys) == 0 {
					continue
				}
				sr, err := newSeries(s.xys, c, s.width, s.dash, s.glyph, 2.6)
				if err != nil {
					return nil, fmt.Errorf("collective: %w", err)
				}
				sr.add(s.p)
				if s.legend {
					legend = append(legend, legendEntry{fmt.Sprintf("all-gather %s, %d ranks", l.tr, l.shards), sr.thumbs()})
				}
			}
		}
		colors = len(lines)
		panels = append(panels, tp, bp)
		yLabels = append(yLabels, "time per all-gather (µs, log)", "bus bandwidth (GB/s)")
	}
	if len(cs) > 0 {
		type line struct {
			tr    string
			batch int
		}
		var lines []line
		for _, r := range cs {
			if l := (line{transportOf(r.Transport, r.Processes), r.Batch}); !slices.Contains(lines, l) {
				lines = append(lines, l)
			}
		}
		if colors+len(lines) > len(categorical) {
			return nil, fmt.Errorf("collective: %d (transport, batch) configurations beside %d sweeps: at most %d lines in one figure (split the lines)", len(lines), colors, len(categorical))
		}
		lo, hi := math.MaxInt, 0
		for _, r := range cs {
			lo, hi = min(lo, r.Shards), max(hi, r.Shards)
		}
		p := newPlot("selection exchange vs ranks (p50; same-run baseline dashed)", "ranks (CP shards)", "")
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, log10Ticks{}
		p.X.Tick.Marker = intTicks(lo, hi)
		p.X.Min, p.X.Max = float64(lo)-0.3, float64(hi)+0.3
		for li, l := range lines {
			var rs []CollectiveRow
			for _, r := range cs {
				if transportOf(r.Transport, r.Processes) == l.tr && r.Batch == l.batch {
					rs = append(rs, r)
				}
			}
			slices.SortFunc(rs, func(a, b CollectiveRow) int { return cmp.Compare(a.Shards, b.Shards) })
			var sel, base plotter.XYs
			for _, r := range rs {
				if r.SelectP50 > 0 {
					sel = append(sel, plotter.XY{X: float64(r.Shards), Y: r.SelectP50})
				}
				if r.BaselineP50 > 0 {
					base = append(base, plotter.XY{X: float64(r.Shards), Y: r.BaselineP50})
				}
			}
			c := categorical[colors+li]
			if len(sel) > 0 {
				sr, err := newSeries(sel, c, 2, nil, draw.CircleGlyph{}, 2.8)
				if err != nil {
					return nil, fmt.Errorf("collective: %w", err)
				}
				sr.add(p)
				legend = append(legend, legendEntry{fmt.Sprintf("selection %s, batch %d", l.tr, l.batch), sr.thumbs()})
			}
			if len(base) > 0 {
				sr, err := newSeries(base, c, 1.3, dashes[1], draw.BoxGlyph{}, 2.2)
				if err != nil {
					return nil, fmt.Errorf("collective: %w", err)
				}
				sr.add(p)
			}
		}
		panels = append(panels, p)
		yLabels = append(yLabels, "time per layer-step (µs, log)")
	}
	title := "bench collective"
	var trs []string
	for _, r := range sw {
		if t := transportOf(r.Transport, r.Processes); !slices.Contains(trs, t) {
			trs = append(trs, t)
		}
	}
	for _, r := range cs {
		if t := transportOf(r.Transport, r.Processes); !slices.Contains(trs, t) {
			trs = append(trs, t)
		}
	}
	title += titleSep + strings.Join(trs, "; ")
	w, h := CollectiveSize(len(panels))
	return &Figure{Width: w, Height: h, draw: func(c draw.Canvas) {
		c = drawTitle(c, title)
		c = draw.Crop(c, px(10), -px(10), px(8), 0)
		cols := columns(c, float64(len(panels)*collectivePanelWidth))
		tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: px(70), PadY: px(16), PadLeft: px(70), PadRight: px(8)}
		row := [][]*plot.Plot{panels}
		for i, cc := range plot.Align(row, tiles, cols[0])[0] {
			panels[i].Draw(cc)
			dc := panels[i].DataCanvas(cc)
			drawYLabel(c, dc.Min.X-px(58), dc, yLabels[i])
		}
		drawLegend(draw.Crop(cols[1], px(14), 0, 0, -px(30)), []string{"bench collective", "p50 solid; p99 and baselines dashed"}, legend)
	}}, nil
}
