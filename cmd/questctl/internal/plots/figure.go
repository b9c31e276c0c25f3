package plots

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// DPI is the resolution of the PNG images.
const DPI = 100

// Figure is a drawing of a fixed size, ready to be written.
type Figure struct {
	// Width and Height are the image's size in pixels.
	Width, Height int
	draw          func(draw.Canvas)
}

// px is n pixels at DPI.
func px(n float64) vg.Length { return vg.Length(n) * vg.Inch / DPI }

// WritePNG draws the figure and writes it to w as a PNG image.
func (f *Figure) WritePNG(w io.Writer) error {
	c := vgimg.NewWith(vgimg.UseWH(px(float64(f.Width)), px(float64(f.Height))), vgimg.UseDPI(DPI))
	f.draw(draw.New(c))
	var b bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(&b); err != nil {
		return fmt.Errorf("encode png: %w", err)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// sans is the typeface of every text.
var sans = font.Font{Typeface: "Liberation", Variant: "Sans"}

func textStyle(size float64) text.Style {
	return text.Style{Color: color.Black, Font: font.From(sans, vg.Points(size)), Handler: plot.DefaultTextHandler}
}

// newPlot is a plot with the figures' fonts and a light grid.
func newPlot(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font = font.From(sans, vg.Points(12))
	p.Title.Padding = vg.Points(4)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = font.From(sans, vg.Points(11))
		a.Tick.Label.Font = font.From(sans, vg.Points(9.5))
	}
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	g := plotter.NewGrid()
	g.Vertical.Color = color.Gray{Y: 225}
	g.Horizontal.Color = color.Gray{Y: 225}
	p.Add(g)
	return p
}

// pow2Ticks marks the powers of two of an axis (log2 scale), labelling at
// most about seven of them.
type pow2Ticks struct{}

func (pow2Ticks) Ticks(min, max float64) []plot.Tick {
	lo, hi := int(math.Floor(math.Log2(min)+1e-9)), int(math.Ceil(math.Log2(max)-1e-9))
	step := 1
	for (hi-lo)/step+1 > 7 {
		step++
	}
	var ts []plot.Tick
	for e := lo; e <= hi; e++ {
		v := math.Ldexp(1, e)
		if v < min*(1-1e-9) || v > max*(1+1e-9) {
			continue
		}
		t := plot.Tick{Value: v}
		if e%step == 0 {
			t.Label = binary(v)
		}
		ts = append(ts, t)
	}
	return ts
}

// binary writes a power of two as 512, 4K or 1M.
func binary(v float64) string {
	switch {
	case v >= 1<<20 && math.Mod(v, 1<<20) == 0:
		return strconv.FormatFloat(v/(1<<20), 'f', -1, 64) + "M"
	case v >= 1<<12 && math.Mod(v, 1<<10) == 0:
		return strconv.FormatFloat(v/(1<<10), 'f', -1, 64) + "K"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// log10Ticks marks a log10 axis at 1, 2 and 5 times the powers of ten,
// labelled (the 2s and 5s only when the axis spans at most two decades),
// with unlabelled minor ticks between.
type log10Ticks struct{}

func (log10Ticks) Ticks(min, max float64) []plot.Tick {
	lo, hi := int(math.Floor(math.Log10(min))), int(math.Ceil(math.Log10(max)))
	few := hi-lo <= 2
	var ts []plot.Tick
	for e := lo; e <= hi; e++ {
		for m := 1; m <= 9; m++ {
			v := float64(m) * math.Pow(10, float64(e))
			if v < min*(1-1e-9) || v > max*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || few && (m == 2 || m == 5) {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ts = append(ts, t)
		}
	}
	return ts
}

// fractionTicks labels 0, 0.2, ..., 1.
var fractionTicks = plot.ConstantTicks([]plot.Tick{
	{Value: 0, Label: "0"}, {Value: 0.2, Label: "0.2"}, {Value: 0.4, Label: "0.4"},
	{Value: 0.6, Label: "0.6"}, {Value: 0.8, Label: "0.8"}, {Value: 1, Label: "1"},
})

// intTicks labels integers from lo to hi, at most about twelve.
func intTicks(lo, hi int) plot.Ticker {
	step := 1
	for (hi-lo)/step+1 > 12 {
		step++
	}
	var ts []plot.Tick
	for i := lo; i <= hi; i++ {
		t := plot.Tick{Value: float64(i)}
		if (i-lo)%step == 0 {
			t.Label = strconv.Itoa(i)
		}
		ts = append(ts, t)
	}
	return plot.ConstantTicks(ts)
}

func rgb(hex uint32) color.RGBA {
	return color.RGBA{R: uint8(hex >> 16), G: uint8(hex >> 8), B: uint8(hex), A: 255}
}

// categorical colours (Tableau 10 without grey).
var categorical = []color.RGBA{
	rgb(0x1f77b4), rgb(0xff7f0e), rgb(0x2ca02c), rgb(0xd62728), rgb(0x9467bd),
	rgb(0x8c564b), rgb(0xe377c2), rgb(0xbcbd22), rgb(0x17becf),
}

// sequential returns the colour of step i of n, from light orange (0) to
// dark blue (n-1).
func sequential(i, n int) color.Color {
	anchors := []color.RGBA{rgb(0xf89540), rgb(0xcc4778), rgb(0x7e03a8), rgb(0x0d0887)}
	t := 1.0
	if n > 1 {
		t = float64(i) / float64(n-1)
	}
	if n == 1 {
		t = 0.67
	}
	f := t * float64(len(anchors)-1)
	k := min(int(f), len(anchors)-2)
	f -= float64(k)
	a, b := anchors[k], anchors[k+1]
	mix := func(x, y uint8) uint8 { return uint8(math.Round(float64(x) + f*(float64(y)-float64(x)))) }
	return color.RGBA{R: mix(a.R, b.R), G: mix(a.G, b.G), B: mix(a.B, b.B), A: 255}
}

// glyphs tell lengths apart.
var glyphs = []draw.GlyphDrawer{
	draw.CircleGlyph{}, draw.PyramidGlyph{}, draw.BoxGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}, draw.CrossGlyph{}, draw.PlusGlyph{}, draw.RingGlyph{},
}

// dashes tell lengths apart, with the glyphs.
var dashes = [][]vg.Length{nil, {vg.Points(6), vg.Points(2.5)}, {vg.Points(1.5), vg.Points(1.5)}, {vg.Points(6), vg.Points(2), vg.Points(1.5), vg.Points(2)}}

// series is one line with markers, and the legend entry it gets.
type series struct {
	line    *plotter.Line
	scatter *plotter.Scatter
}

func newSeries(xys plotter.XYs, c color.Color, width float64, dash []vg.Length, glyph draw.GlyphDrawer, radius float64) (series, error) {
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return series{}, err
	}
	l.Color, l.Width, l.Dashes = c, vg.Points(width), dash
	s.Color, s.Shape, s.Radius = c, glyph, vg.Points(radius)
	if glyph == nil {
		s.Radius = 0
		s.Shape = draw.CircleGlyph{}
	}
	return series{l, s}, nil
}

func (s series) add(p *plot.Plot) {
	if s.scatter.Radius > 0 {
		p.Add(s.line, s.scatter)
	} else {
		p.Add(s.line)
	}
}

func (s series) thumbs() []plot.Thumbnailer {
	if s.scatter.Radius > 0 {
		return []plot.Thumbnailer{s.line, s.scatter}
	}
	return []plot.Thumbnailer{s.line}
}

// legendEntry is a legend line: a text and its thumbnails.
type legendEntry struct {
	text   string
	thumbs []plot.Thumbnailer
}

// drawLegend draws heading lines (the first bold-sized, the rest small)
// and entries from the top left of c.
func drawLegend(c draw.Canvas, heading []string, entries []legendEntry) {
	top := c.Max.Y
	for i, h := range heading {
		hs := textStyle(10.5)
		if i > 0 {
			hs = textStyle(9)
		}
		hs.YAlign = draw.YTop
		c.FillText(hs, vg.Point{X: c.Min.X, Y: top}, h)
		top -= hs.Rectangle(h).Size().Y + vg.Points(2)
	}
	if len(heading) > 0 {
		top -= vg.Points(3)
	}
	l := plot.NewLegend()
	l.TextStyle = textStyle(9.5)
	l.Top, l.Left = true, true
	l.Padding = vg.Points(3)
	l.ThumbnailWidth = vg.Points(26)
	for _, e := range entries {
		l.Add(e.text, e.thumbs...)
	}
	c.Max.Y = top
	l.Draw(c)
}

// drawTitle writes a figure's title centred at the top of c, broken into
// lines at its "  ·  " separators where it is wider than c, and returns
// the canvas below it.
func drawTitle(c draw.Canvas, title string) draw.Canvas {
	s := textStyle(13)
	s.XAlign, s.YAlign = draw.XCenter, draw.YTop
	width := c.Max.X - c.Min.X - px(20)
	var lines []string
	for _, part := range strings.Split(title, titleSep) {
		if n := len(lines); n > 0 && s.Width(lines[n-1]+titleSep+part) <= width {
			lines[n-1] += titleSep + part
		} else {
			lines = append(lines, part)
		}
	}
	top := c.Max.Y - vg.Points(6)
	for _, l := range lines {
		c.FillText(s, vg.Point{X: c.Center().X, Y: top}, l)
		top -= s.Rectangle(l).Size().Y + vg.Points(2)
	}
	return draw.Crop(c, 0, 0, 0, top-c.Max.Y-vg.Points(4))
}

// titleSep separates the parts of a title.
const titleSep = "  ·  "

// drawYLabel writes an axis label rotated a quarter turn, centred on x
// and on the height of dc. (gonum centres a vertical label on
// the linear middle of the range, which is wrong on a log axis.)
func drawYLabel(c draw.Canvas, x vg.Length, dc draw.Canvas, label string) {
	s := textStyle(11)
	s.Rotation = math.Pi / 2
	s.XAlign, s.YAlign = draw.XCenter, draw.YCenter
	c.FillText(s, vg.Point{X: x, Y: (dc.Min.Y + dc.Max.Y) / 2}, label)
}

// columns splits c into columns of the given widths (pixels), the last
// taking what is left.
func columns(c draw.Canvas, widths ...float64) []draw.Canvas {
	var out []draw.Canvas
	x := c.Min.X
	for _, w := range widths {
		r := c
		r.Min.X, r.Max.X = x, x+px(w)
		out = append(out, r)
		x += px(w)
	}
	r := c
	r.Min.X = x
	return append(out, r)
}

// lastOf keeps one row per key, the last given, in the order of the
// keys' first rows.
func lastOf[R any, K comparable](rows []R, key func(R) K) []R {
	var out []R
	at := map[K]int{}
	for _, r := range rows {
		k := key(r)
		if i, ok := at[k]; ok {
			out[i] = r
			continue
		}
		at[k] = len(out)
		out = append(out, r)
	}
	return out
}
