package main

import (
	"fmt"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// partnerPlots returns the two charts of the partner's panel (-partner-
// quota) over [0, end]: above, the calls it accepted in the last window of
// -partner's period (1 s without it) against its quota and -partner's
// limit over time (adapted, with Redis); below, its 429s and accepted
// calls per 100 ms.
func partnerPlots(r *partnerReport, end time.Duration) (upc, downc chart, err error) {
	upc, downc = chart{legend: newLegend(), height: upHeight}, chart{legend: newLegend(), height: compactHeight}
	n := binCount(end, plotStep)
	xmax := (time.Duration(n) * plotStep).Seconds()
	per := r.per()
	accepted, rejected, inWin, quota := partnerSeries(r, n)

	up := plot.New()
	up.Title.Text = fmt.Sprintf("partner: quota %s", r.quotaText())
	if r.Budget.Count > 0 {
		up.Title.Text += fmt.Sprintf("; -partner %s", r.Budget)
	}
	up.Title.TextStyle.Font.Size = 13
	up.Y.Label.Text = "calls"
	up.X.Min, up.X.Max = 0, xmax
	up.Add(plotter.NewGrid())
	w, err := stepLine(inWin)
	if err != nil {
		return chart{}, chart{}, err
	}
	w.Color, w.Width = colWindow, vg.Points(1.5)
	q, err := stepLine(quota)
	if err != nil {
		return chart{}, chart{}, err
	}
	q.Color, q.Dashes = colBound, []vg.Length{vg.Points(2), vg.Points(2)}
	up.Add(w, q)
	upc.legend.Add(fmt.Sprintf("accepted in the last %v", per), w)
	upc.legend.Add("the partner's quota", q)
	top := max(maxOf(inWin), maxOf(quota))
	if len(r.Limits) > 0 {
		limits := make([]float64, min(len(r.Limits), n))
		for i := range limits {
			limits[i] = float64(r.Limits[i])
		}
		l, err := stepLine(limits)
		if err != nil {
			return chart{}, chart{}, err
		}
		l.Color, l.Dashes = colLimit, []vg.Length{vg.Points(6), vg.Points(3)}
		up.Add(l)
		upc.legend.Add("-partner limit", l)
		top = max(top, maxOf(limits))
	}
	up.Y.Min, up.Y.Max = 0, top*1.15
	up.Y.Tick.Marker = countTicks{}

	down := plot.New()
	down.Y.Label.Text = "calls"
	down.X.Label.Text = "time since the start of the run (s)"
	down.X.Min, down.X.Max = 0, xmax
	down.Add(plotter.NewGrid())
	a, err := stepLine(accepted)
	if err != nil {
		return chart{}, chart{}, err
	}
	a.FillColor, a.Color = colAdmitted, colAdmitLn
	rl, err := stepLine(rejected)
	if err != nil {
		return chart{}, chart{}, err
	}
	rl.Color, rl.Width = colNaksLn, vg.Points(1.5)
	down.Add(a, rl)
	downc.legend.Add("accepted per 100 ms", a)
	downc.legend.Add("answered 429 per 100 ms", rl)
	down.Y.Min, down.Y.Max = 0, max(maxOf(accepted), maxOf(rejected), 1)*1.15
	down.Y.Tick.Marker = countTicks{}
	for _, p := range []*plot.Plot{up, down} {
		p.X.Tick.Marker = secondTicks{}
	}
	upc.p, downc.p = up, down
	return upc, downc, nil
}

// stepLine is vals as a step line, each value over its bin of plotStep.
func stepLine(vals []float64) (*plotter.Line, error) {
	pts := make(plotter.XYs, len(vals)+1)
	for i, v := range vals {
		pts[i] = plotter.XY{X: (time.Duration(i) * plotStep).Seconds(), Y: v}
	}
	pts[len(vals)] = plotter.XY{X: (time.Duration(len(vals)) * plotStep).Seconds(), Y: vals[len(vals)-1]}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.StepStyle = plotter.PostStep
	return l, nil
}

// partnerSeries returns, per bin of plotStep (n of them), the partner's
// accepted calls, its 429s, the calls it accepted in the window of r.per()
// that ends with the bin, and its quota at the bin's start.
func partnerSeries(r *partnerReport, n int) (accepted, rejected, inWin, quota []float64) {
	per := r.per()
	accepted, rejected, inWin, quota = make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for _, c := range r.calls {
		b := min(int(c.at/plotStep), n-1)
		if !c.ok {
			rejected[b]++
			continue
		}
		accepted[b]++
		for w := b; w < n && time.Duration(w+1)*plotStep-per <= c.at; w++ {
			inWin[w]++
		}
	}
	for b := range quota {
		quota[b] = float64(r.quotaAt(time.Duration(b) * plotStep).Count)
	}
	return accepted, rejected, inWin, quota
}
