package main

import (
	"bytes"
	"cmp"
	"fmt"
	"html"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The plot of -plot FILE: per tenant (and consumer), a panel of two
// aligned charts over the run, drawn with gonum/plot. The upper chart has
// the cost units admitted per 100 ms, the units admitted in the window of
// the tenant's limit that ends at each instant, and the limit (and a
// bucket's bound) as a line; the lower one the NAKs or rejections per
// 100 ms, those whose decision reserved the message's own slot, and the
// messages held on their last delivery. Faults injected are vertical
// lines through both, labelled with their kind. With -partner-quota, a
// last panel has the partner (partnerPlots). A .svg file is the SVG
// itself; a .html file is a page with the same SVG inline (no scripts, no
// network).

// plotStep is the width of the plot's bins.
const plotStep = 100 * time.Millisecond

// Colours of the series.
var (
	colAdmitted = color.RGBA{R: 0x9e, G: 0xc5, B: 0xea, A: 0xff} // fill of admitted per 100 ms
	colAdmitLn  = color.RGBA{R: 0x3a, G: 0x7c, B: 0xc4, A: 0xff}
	colWindow   = color.RGBA{R: 0x0b, G: 0x2e, B: 0x6b, A: 0xff}
	colLimit    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colBound    = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	colNaks     = color.RGBA{R: 0xf5, G: 0xb9, B: 0x7a, A: 0xff}
	colNaksLn   = color.RGBA{R: 0xc8, G: 0x6a, B: 0x10, A: 0xff}
	colReserved = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	colHolds    = color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}
	colFault    = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
	colBusy     = color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}
)

// checkPlotPath reports an error unless path ends in .svg or .html.
func checkPlotPath(path string) error {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg", ".html", ".htm":
		return nil
	}
	return fmt.Errorf("-plot: %q: the file must end in .svg or .html", path)
}

// plotRun writes the plot of -plot for rep, a run with cfg, and says so
// on out.
func plotRun(cfg config, rep report, out io.Writer) error {
	tls := []timeline{withWaits(rep.timeline, rep.Tenants)}
	if rep.Asynq != nil {
		tls = append(tls, withWaits(rep.Asynq.timeline, rep.Asynq.Tenants))
	}
	title := fmt.Sprintf("queuethrottle worker: %d jobs from %s, -limiter %s, -reservations %v: %s", rep.Jobs, filepath.Base(cfg.JobsPath), cmp.Or(cfg.Limiter, familyWindow), cfg.Reservations, rep.verdict())
	if err := writePlot(cfg.Plot, title, rep.Partner, tls...); err != nil {
		return err
	}
	fmt.Fprintln(out, "plot written to", cfg.Plot)
	return nil
}

// withWaits returns tl with each tenant's wait percentiles from tenants.
func withWaits(tl timeline, tenants []tenantReport) timeline {
	tl.Tenants = slices.Clone(tl.Tenants)
	for i := range tl.Tenants {
		for _, r := range tenants {
			if r.Tenant == tl.Tenants[i].Tenant {
				tl.Tenants[i].WaitP50, tl.Tenants[i].WaitP99 = r.WaitP50, r.WaitP99
			}
		}
	}
	return tl
}

// writePlot draws the timelines (one per consumer) and the partner (nil:
// none) under the title and writes them to path, as SVG or HTML by its
// extension.
func writePlot(path, title string, partner *partnerReport, tls ...timeline) error {
	if err := checkPlotPath(path); err != nil {
		return err
	}
	svg, err := plotSVG(title, partner, tls...)
	if err != nil {
		return fmt.Errorf("-plot: %w", err)
	}
	out := svg
	if ext := strings.ToLower(filepath.Ext(path)); ext == ".html" || ext == ".htm" {
		out = plotHTML(title, svg)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("-plot: %w", err)
	}
	return nil
}

// plotHTML is a self-contained page showing svg: no scripts, no styles or
// fonts from elsewhere.
func plotHTML(title string, svg []byte) []byte {
	if i := bytes.Index(svg, []byte("<svg")); i > 0 {
		svg = svg[i:] // drop the XML prelude and comment
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>%s</title>\n", html.EscapeString(title))
	b.WriteString("<style>body{font-family:sans-serif;margin:1em}svg{max-width:100%;height:auto}</style>\n</head>\n<body>\n")
	fmt.Fprintf(&b, "<h1>%s</h1>\n", html.EscapeString(title))
	b.WriteString("<p>Per tenant: above, cost units admitted per 100 ms and in the window of the tenant's limit against the limit; below, the NAKs or rejections per 100 ms, those that reserved their own slot, and the messages held on their last delivery. Vertical lines mark injected faults. With a simulated partner, the last panel: its calls accepted in the last window against its quota and the -partner limit over time; below, its accepted calls and 429s per 100 ms.</p>\n")
	b.Write(svg)
	b.WriteString("\n</body>\n</html>\n")
	return b.Bytes()
}

// chart is one chart of the figure, its legend (drawn to its right) and
// its height.
type chart struct {
	p      *plot.Plot
	legend plot.Legend
	height vg.Length
}

// Sizes of the figure.
const (
	figWidth    = 10 * vg.Inch
	legendWidth = 2.4 * vg.Inch
	figHeader   = 0.45 * vg.Inch
	upHeight    = 2.0 * vg.Inch
	downHeight  = 1.3 * vg.Inch
	// compactHeight is the lower chart of a tenant with no NAK and no hold.
	compactHeight = 0.8 * vg.Inch
	panelGap      = 0.2 * vg.Inch
)

// Room for text: legendWidth is the least width of the legends' column,
// wider when an entry needs it.
const (
	legendGap = 8 // between a chart and its legend
	// fontSlack is how much wider than the Liberation metrics gonum
	// measures with a viewer's fallback font may draw text (DejaVu Sans,
	// where Liberation is not installed, is about 16% wider). The text
	// starts where gonum placed it, so only its end moves.
	fontSlack = 1.2
)

// plotSVG draws the timelines, then the partner (nil: none), as one SVG
// document.
func plotSVG(title string, partner *partnerReport, tls ...timeline) ([]byte, error) {
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	plotter.DefaultFont = plot.DefaultFont
	var charts []chart
	end := time.Duration(0)
	for _, tl := range tls {
		end = max(end, tl.End)
	}
	for _, tl := range tls {
		for _, t := range tl.Tenants {
			name := t.Tenant
			if len(tls) > 1 {
				name = tl.Consumer.String() + ": " + name
			}
			up, down, err := tenantPlots(name, t, tl.Faults, end, tl.Handlers)
			if err != nil {
				return nil, err
			}
			charts = append(charts, up, down)
		}
	}
	if partner != nil {
		up, down, err := partnerPlots(partner, end)
		if err != nil {
			return nil, err
		}
		charts = append(charts, up, down)
	}
	if len(charts) == 0 {
		return nil, fmt.Errorf("nothing to plot: no tenant")
	}
	height := figHeader
	for i, c := range charts {
		height += c.height
		if i%2 == 1 {
			height += panelGap
		}
	}
	c := vgsvg.New(figWidth, height)
	dc := draw.New(c)
	sty := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 14), XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	// A long title shrinks so that, centred, it ends within the figure.
	if avail, w := figWidth/2-0.15*vg.Inch, sty.Width(title)*(fontSlack-0.5); w > avail {
		sty.Font.Size = max(8, sty.Font.Size*avail/w)
	}
	dc.FillText(sty, vg.Point{X: figWidth / 2, Y: height - 0.12*vg.Inch}, title)

	// The legends' column fits the longest entry, in a fallback font too.
	legendCol := legendWidth
	for _, ch := range charts {
		r := ch.legend.Rectangle(draw.Canvas{})
		legendCol = max(legendCol, legendGap+(r.Max.X-r.Min.X)*fontSlack+4)
	}

	// Lay the charts out from the top, then align their data areas: the
	// same left and right margins for all, so the time axes line up.
	canvases := make([]draw.Canvas, len(charts))
	legends := make([]draw.Canvas, len(charts))
	y := height - figHeader
	var left, right vg.Length
	for i, ch := range charts {
		canvases[i] = draw.Canvas{Canvas: c, Rectangle: vg.Rectangle{Min: vg.Point{X: 0, Y: y - ch.height}, Max: vg.Point{X: figWidth - legendCol, Y: y}}}
		legends[i] = draw.Canvas{Canvas: c, Rectangle: vg.Rectangle{Min: vg.Point{X: figWidth - legendCol + legendGap, Y: y - ch.height}, Max: vg.Point{X: figWidth, Y: y - 8}}}
		data := ch.p.DataCanvas(canvases[i])
		left = max(left, data.Min.X-canvases[i].Min.X)
		right = max(right, canvases[i].Max.X-data.Max.X)
		y -= ch.height
		if i%2 == 1 {
			y -= panelGap
		}
	}
	for i, ch := range charts {
		cv := canvases[i]
		data := ch.p.DataCanvas(cv)
		cv = draw.Crop(cv, left-(data.Min.X-cv.Min.X), (cv.Max.X-data.Max.X)-right, 0, 0)
		ch.p.Draw(cv)
		ch.legend.Draw(legends[i])
	}
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, err
	}
	// gonum names the font it measured text with; a viewer without it
	// falls back to metric-compatible ones rather than its default serif.
	return bytes.ReplaceAll(b.Bytes(), []byte("font-family:Liberation Sans;"), []byte("font-family:'Liberation Sans',Arial,Helvetica,sans-serif;")), nil
}

// tenantPlots returns the two charts of a tenant's panel over [0, end];
// handlers is how many the tenants share (0: unknown).
func tenantPlots(name string, t tenantTimeline, faults []faultMark, end time.Duration, handlers int) (upc, downc chart, err error) {
	upc, downc = chart{legend: newLegend(), height: upHeight}, chart{legend: newLegend(), height: downHeight}
	n := binCount(end, plotStep)
	xmax := (time.Duration(n) * plotStep).Seconds()

	// Above: admissions against the limit.
	up := plot.New()
	// A bucket may admit more than its rate's count in one window: the
	// title gives the bound the run is checked against.
	bound := "limit"
	if t.Bound != t.Rate.Count {
		bound = "bound"
	}
	up.Title.Text = fmt.Sprintf("%s: rate %v (%s %d cost units in any %v)", name, t.Rate, bound, t.Bound, t.Rate.Per)
	if t.WaitP99 > 0 {
		up.Title.Text += fmt.Sprintf("; wait p50 %v, p99 %v", roundWait(t.WaitP50), roundWait(t.WaitP99))
	}
	up.Title.TextStyle.Font.Size = 13
	up.Y.Label.Text = "cost units"
	up.X.Min, up.X.Max = 0, xmax
	up.Add(plotter.NewGrid())
	admitted := t.admittedPer(plotStep, end)
	inWin := t.inWindow(plotStep, end)
	a, err := stepLine(admitted)
	if err != nil {
		return chart{}, chart{}, err
	}
	a.FillColor, a.Color = colAdmitted, colAdmitLn
	w, err := stepLine(inWin)
	if err != nil {
		return chart{}, chart{}, err
	}
	w.Color, w.Width = colWindow, vg.Points(1.5)
	limit := hline(0, xmax, float64(t.Rate.Count), colLimit, []vg.Length{vg.Points(6), vg.Points(3)})
	up.Add(limit, a, w)
	upc.legend.Add("admitted per 100 ms", a)
	upc.legend.Add(fmt.Sprintf("admitted in the last %v", t.Rate.Per), w)
	upc.legend.Add(fmt.Sprintf("limit %d", t.Rate.Count), limit)
	top := float64(t.Rate.Count)
	if t.Bound != t.Rate.Count {
		bound := hline(0, xmax, float64(t.Bound), colBound, []vg.Length{vg.Points(2), vg.Points(2)})
		up.Add(bound)
		upc.legend.Add(fmt.Sprintf("bucket bound %d", t.Bound), bound)
		top = max(top, float64(t.Bound))
	}
	top = max(top, maxOf(admitted), maxOf(inWin))
	up.Y.Min, up.Y.Max = 0, top*1.15
	up.Y.Tick.Marker = countTicks{}

	// Below: the tenant's share of the handlers, what went back to the
	// broker, and what was held.
	down := plot.New()
	down.Y.Label.Text = "messages, handlers"
	down.X.Label.Text = "time since the start of the run (s)"
	down.X.Min, down.X.Max = 0, xmax
	down.Add(plotter.NewGrid())
	naks := t.naksPer(plotStep, end, false)
	reserved := t.naksPer(plotStep, end, true)
	holds := t.holdsPer(plotStep, end)
	nl, err := stepLine(naks)
	if err != nil {
		return chart{}, chart{}, err
	}
	nl.FillColor, nl.Color = colNaks, colNaksLn
	rl, err := stepLine(reserved)
	if err != nil {
		return chart{}, chart{}, err
	}
	rl.Color, rl.Width = colReserved, vg.Points(1.5)
	rl.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
	var hpts plotter.XYs
	for i, v := range holds {
		if v > 0 {
			hpts = append(hpts, plotter.XY{X: (time.Duration(i)*plotStep + plotStep/2).Seconds(), Y: v})
		}
	}
	busy := t.busyPer(plotStep, end)
	bl, err := stepLine(busy)
	if err != nil {
		return chart{}, chart{}, err
	}
	bl.Color, bl.Width = colBusy, vg.Points(1.5)
	down.Add(nl, rl, bl)
	downc.legend.Add("NAKs/rejections per 100 ms", nl)
	downc.legend.Add("… that reserved a slot", rl)
	if handlers > 0 {
		downc.legend.Add(fmt.Sprintf("handlers running, of %d", handlers), bl)
	} else {
		downc.legend.Add("handlers running", bl)
	}
	hs, err := plotter.NewScatter(hpts)
	if err != nil {
		return chart{}, chart{}, err
	}
	hs.GlyphStyle = draw.GlyphStyle{Color: colHolds, Radius: vg.Points(3.5), Shape: draw.PyramidGlyph{}}
	down.Add(hs)
	downc.legend.Add("held on last delivery", hs)
	dtop := max(maxOf(naks), maxOf(holds), maxOf(busy), 1)
	if len(t.Naks) == 0 && len(t.Holds) == 0 {
		downc.height = compactHeight // nothing went back: the handlers only
	}
	down.Y.Min, down.Y.Max = 0, dtop*1.15
	down.Y.Tick.Marker = countTicks{}

	// Faults, through both charts.
	for _, f := range faults {
		x := f.At.Seconds()
		for _, p := range []*plot.Plot{up, down} {
			p.Add(vline(x, p.Y.Max, colFault))
		}
		// The kind reads down the right of the line from the top, so the
		// labels of faults close in time, or near the end, do not collide
		// (and a viewer's wider fallback font only makes it longer).
		lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: up.Y.Max}}, Labels: []string{f.Kind}})
		if err != nil {
			return chart{}, chart{}, err
		}
		st := &lbl.TextStyle[0]
		st.Color, st.Font.Size = colFault, 9
		st.Rotation, st.XAlign, st.YAlign = -math.Pi/2, draw.XLeft, draw.YBottom
		lbl.Offset = vg.Point{X: 4, Y: -3}
		up.Add(lbl)
	}
	for _, p := range []*plot.Plot{up, down} {
		p.X.Tick.Marker = secondTicks{}
	}
	upc.p, downc.p = up, down
	if len(faults) > 0 {
		upc.legend.Add("fault injected", vline(0, 1, colFault))
	}
	return upc, downc, nil
}

// newLegend is the legend of a chart, drawn to its right, from the top.
func newLegend() plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.TextStyle.Font.Size = 10
	l.Padding = vg.Points(2)
	l.ThumbnailWidth = vg.Points(22)
	return l
}

// countTicks marks whole numbers, at 1, 2 or 5 times a power of ten
// apart: about 4 labelled ticks.
type countTicks struct{}

func (countTicks) Ticks(lo, hi float64) []plot.Tick {
	return niceTicks(lo, hi, 4, 1)
}

// secondTicks marks seconds: about 10 labelled ticks, at least half a
// second apart.
type secondTicks struct{}

func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	return niceTicks(lo, hi, 10, 0.5)
}

// niceTicks returns labelled ticks from lo to hi, about want of them, at a
// step of 1, 2 or 5 times a power of ten no smaller than minStep, with
// unlabelled ticks halfway.
func niceTicks(lo, hi float64, want int, minStep float64) []plot.Tick {
	span := hi - lo
	if span <= 0 || want < 1 {
		return nil
	}
	raw := span / float64(want)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	step = max(step, minStep)
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step/1e9; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		if h := v + step/2; h <= hi {
			ticks = append(ticks, plot.Tick{Value: h})
		}
	}
	return ticks
}

// hline is a horizontal line at y from x0 to x1.
func hline(x0, x1, y float64, c color.Color, dashes []vg.Length) *plotter.Line {
	l, _ := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}})
	l.Color, l.Width, l.Dashes = c, vg.Points(1.5), dashes
	return l
}

// vline is a vertical line at x from 0 to y.
func vline(x, y float64, c color.Color) *plotter.Line {
	l, _ := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: y}})
	l.Color, l.Width, l.Dashes = c, vg.Points(1.2), []vg.Length{vg.Points(3), vg.Points(3)}
	return l
}

func maxOf(vs []float64) float64 {
	m := 0.0
	for _, v := range vs {
		m = max(m, v)
	}
	return m
}
