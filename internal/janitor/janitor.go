// Package janitor runs the idle-key sweeps of the in-process limiters
// (bucket.Local, window.Memory) in the background. It keeps no goroutine
// between sweeps (each is a timer's callback) and no limiter alive: a
// limiter that nobody holds any more is collected, and its sweeps stop. So
// the limiters need no Close, and leak nothing.
package janitor

import (
	"runtime"
	"sync/atomic"
	"time"
	"weak"
)

// Period is how often a limiter is swept, by default.
const Period = 5 * time.Second

// period is Period, or what a test set.
var period atomic.Int64

func init() { period.Store(int64(Period)) }

// SetPeriod makes the sweeps started from now on run every d, and returns
// a func that restores the default. For tests.
func SetPeriod(d time.Duration) (restore func()) {
	period.Store(int64(d))
	return func() { period.Store(int64(Period)) }
}

// Start runs sweep(p) every period, on a goroutine of its own each time,
// until p is garbage collected.
func Start[T any](p *T, sweep func(*T)) {
	every := time.Duration(period.Load())
	w := weak.Make(p)
	var t atomic.Pointer[time.Timer]
	timer := time.AfterFunc(time.Hour, func() {
		if s := w.Value(); s != nil {
			sweep(s)
			t.Load().Reset(every)
		}
	})
	t.Store(timer)
	timer.Reset(every)
	runtime.AddCleanup(p, func(t *atomic.Pointer[time.Timer]) { t.Load().Stop() }, &t)
}
