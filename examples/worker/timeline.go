package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// timeline is a run over time, per tenant, for the plot (-plot) and the
// sparklines of the summary. Instants are offsets from the start of the
// run.
type timeline struct {
	Consumer consumer
	End      time.Duration    // the last instant recorded, or the elapsed time
	Tenants  []tenantTimeline // sorted by tenant
	Faults   []faultMark      // in the order injected
	Handlers int              // the handlers the tenants share (every process's); 0: unknown
}

// tenantTimeline is one tenant's part of a timeline.
type tenantTimeline struct {
	Tenant string
	Rate   throttle.Rate
	Bound  int             // the most the limiter may admit in a window of Rate.Per
	Admits []event         // admissions with their cost
	Naks   []returned      // NAKs (NATS) or rejections (asynq)
	Holds  []time.Duration // first InProgress of each held message
	Runs   []runSpan       // handler runs, start to end of work
	// Waits are the percentiles of the time from arrival to handler
	// start, for the plot's titles (set from the report; zero: unknown).
	WaitP50, WaitP99 time.Duration
}

// runSpan is one handler run, as offsets from the start of the run.
type runSpan struct{ start, end time.Duration }

// faultMark is a fault injected into a run: its kind (e.g. "kill-redis"),
// when it was injected and when the run had recovered from it (offsets
// from the start), the worker process it killed (kill-worker), and what
// was done, for the summary.
type faultMark struct {
	Kind   string
	At     time.Duration
	Until  time.Duration
	Proc   int
	Detail string
}

// timeline returns the run recorded so far, with the limits of rateOf and
// the bounds of spec.
func (r *recorder) timeline(rateOf func(string) throttle.Rate, spec limiterSpec) timeline {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.timelineLocked(rateOf, spec)
}

// timelineLocked is timeline with r.mu held.
func (r *recorder) timelineLocked(rateOf func(string) throttle.Rate, spec limiterSpec) timeline {
	tl := timeline{Consumer: r.consumer, End: time.Since(r.start), Faults: append([]faultMark(nil), r.faults...)}
	for name := range r.tenants {
		rate := rateOf(name)
		bound, _ := spec.boundFor(name, rate)
		tt := tenantTimeline{
			Tenant: name, Rate: rate, Bound: bound,
			Admits: append([]event(nil), r.admits[name]...),
			Naks:   append([]returned(nil), r.returns[name]...),
			Holds:  append([]time.Duration(nil), r.holdsAt[name]...),
		}
		tl.Tenants = append(tl.Tenants, tt)
	}
	runs := map[string][]runSpan{}
	for _, h := range r.runs {
		start := time.Unix(0, h.At).Sub(r.start)
		end := start
		if h.End > 0 {
			end = time.Unix(0, h.End).Sub(r.start)
		}
		runs[h.Tenant] = append(runs[h.Tenant], runSpan{start, end})
	}
	for i := range tl.Tenants {
		tl.Tenants[i].Runs = runs[tl.Tenants[i].Tenant]
	}
	sort.Slice(tl.Tenants, func(a, b int) bool { return tl.Tenants[a].Tenant < tl.Tenants[b].Tenant })
	return tl
}

// admitAt is the instant the plot gives an admission: the middle of the
// interval in which the limiter counted it.
func admitAt(e event) time.Duration { return e.lo + (e.hi-e.lo)/2 }

// bins returns, for n bins of width step from 0, the sum of weight(i) of
// the items i whose instant at(i) falls in each; later items land in the
// last bin.
func bins(n int, step time.Duration, items int, at func(int) time.Duration, weight func(int) float64) []float64 {
	out := make([]float64, max(n, 1))
	for i := range items {
		b := min(max(int(at(i)/step), 0), len(out)-1)
		out[b] += weight(i)
	}
	return out
}

// binCount is how many bins of width step cover end.
func binCount(end, step time.Duration) int { return int(end/step) + 1 }

// admittedPer returns the cost units admitted in each bin of width step.
func (t tenantTimeline) admittedPer(step, end time.Duration) []float64 {
	return bins(binCount(end, step), step, len(t.Admits),
		func(i int) time.Duration { return admitAt(t.Admits[i]) },
		func(i int) float64 { return float64(t.Admits[i].n) })
}

// inWindow returns, at the end of each bin of width step, the cost units
// admitted in the window of the tenant's limit that ends there: what the
// limit bounds.
func (t tenantTimeline) inWindow(step, end time.Duration) []float64 {
	n := binCount(end, step)
	out := make([]float64, n)
	for b := range n {
		hi := time.Duration(b+1) * step
		for _, e := range t.Admits {
			if at := admitAt(e); at < hi && at >= hi-t.Rate.Per {
				out[b] += float64(e.n)
			}
		}
	}
	return out
}

// busyPer returns the handlers the tenant had running in each bin of
// width step, on average over the bin.
func (t tenantTimeline) busyPer(step, end time.Duration) []float64 {
	out := make([]float64, binCount(end, step))
	for _, r := range t.Runs {
		for b := max(int(r.start/step), 0); b < len(out) && time.Duration(b)*step < r.end; b++ {
			lo, hi := max(r.start, time.Duration(b)*step), min(r.end, time.Duration(b+1)*step)
			if hi > lo {
				out[b] += float64(hi-lo) / float64(step)
			}
		}
	}
	return out
}

// naksPer returns the NAKs or rejections in each bin of width step; with
// reserved, only those whose decision reserved the message's slot.
func (t tenantTimeline) naksPer(step, end time.Duration, reserved bool) []float64 {
	return bins(binCount(end, step), step, len(t.Naks),
		func(i int) time.Duration { return t.Naks[i].at },
		func(i int) float64 {
			if reserved && !t.Naks[i].reserved {
				return 0
			}
			return 1
		})
}

// holdsPer returns the messages first held in each bin of width step.
func (t tenantTimeline) holdsPer(step, end time.Duration) []float64 {
	return bins(binCount(end, step), step, len(t.Holds),
		func(i int) time.Duration { return t.Holds[i] },
		func(int) float64 { return 1 })
}

// perSecond is the tenant's limit in cost units per second.
func (t tenantTimeline) perSecond() float64 {
	if t.Rate.Per <= 0 {
		return 0
	}
	return float64(t.Rate.Count) / t.Rate.Per.Seconds()
}

// sparkBlocks are the levels of a sparkline, from empty to full.
var sparkBlocks = []rune(" ▁▂▃▄▅▆▇█")

// sparkline draws values as one line of block characters, one per value:
// a space for 0, a full block for top or more, and the levels between in
// proportion (any value above 0 shows at least the lowest block).
func sparkline(values []float64, top float64) string {
	var b strings.Builder
	for _, v := range values {
		level := 0
		if v > 0 && top > 0 {
			level = int(math.Ceil(v / top * float64(len(sparkBlocks)-1)))
			level = min(max(level, 1), len(sparkBlocks)-1)
		}
		b.WriteRune(sparkBlocks[level])
	}
	return b.String()
}

// sparklines returns one line per tenant: its admissions per second over
// the run as a sparkline, a full block at the tenant's limit per second.
func (tl timeline) sparklines() []string {
	width := 0
	for _, t := range tl.Tenants {
		width = max(width, len(t.Tenant))
	}
	var lines []string
	for _, t := range tl.Tenants {
		per := t.admittedPer(time.Second, tl.End)
		peak := 0.0
		for _, v := range per {
			peak = max(peak, v)
		}
		lines = append(lines, fmt.Sprintf("  %-*s |%s| peak %.0f/s, limit %v", width, t.Tenant, sparkline(per, t.perSecond()), peak, t.Rate))
	}
	return lines
}
