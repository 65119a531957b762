package throttletest

import (
	"sync"
	"time"
)

// T0 is the fixed instant tests start from: 2026-01-02 03:04:05 UTC, on a
// whole second so that offsets read plainly.
var T0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Clock is a settable clock for tests, satisfying throttle.Clock. The zero
// value reads T0. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that reads t until moved.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's current instant.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now.IsZero() {
		return T0
	}
	return c.now
}

// Set moves the clock to t (backwards too).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	if c.now.IsZero() {
		c.now = T0
	}
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
