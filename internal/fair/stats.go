package fair

import (
	"math"
	"time"
)

// meanTime is an exponentially weighted mean of durations (handler times),
// in seconds; the first sample sets it.
type meanTime struct {
	v float64
	n int
}

const meanWeight = 0.2 // of each new sample

func (m *meanTime) add(d time.Duration) {
	x := d.Seconds()
	if m.n == 0 {
		m.v = x
	} else {
		m.v += meanWeight * (x - m.v)
	}
	m.n++
}

// known reports whether a sample was added.
func (m *meanTime) known() bool { return m.n > 0 }

// timeAverage is a time-weighted exponential average of a count (the
// handlers a key runs) over about tau.
type timeAverage struct {
	v    float64
	last time.Time
}

const tau = time.Second

// update folds in that the count was x since the last update, up to now.
func (a *timeAverage) update(now time.Time, x int) {
	if !a.last.IsZero() {
		if dt := now.Sub(a.last); dt > 0 {
			a.v += (1 - math.Exp(-dt.Seconds()/tau.Seconds())) * (float64(x) - a.v)
		}
	}
	a.last = now
}
