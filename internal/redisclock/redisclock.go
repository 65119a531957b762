// Package redisclock estimates the Redis server's clock from the TIME
// command, for limiters on a Redis whose scripts may not call TIME: the
// client then sends the server's time, estimated, instead of its own, and
// processes whose own clocks disagree still decide on one clock.
//
// An estimate takes Samples TIME round trips and keeps the one with the
// shortest: the server read its clock somewhere within that round trip,
// so taking the midpoint bounds the error by half of it (plus the drift
// of the local clock since, a few ppm). It is re-estimated every Every,
// in the background, and a new estimate replaces the one in use only if
// its round trip is no longer, or the one in use is older than MaxAge.
package redisclock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Timer is the go-redis command a Clock needs: *redis.Client,
// *redis.ClusterClient and *redis.Ring have it.
type Timer interface {
	Time(ctx context.Context) *redis.TimeCmd
}

// Defaults.
const (
	Every   = 10 * time.Second // re-estimation period
	MaxAge  = time.Minute      // an estimate older than this is replaced whatever its round trip
	Samples = 3                // TIME round trips per estimate
	// Timeout bounds a background re-estimation.
	Timeout = time.Second
)

// ErrNoEstimate is wrapped by the error of Ready when no estimate could
// be made yet.
var ErrNoEstimate = errors.New("server clock: no estimate of the Redis server's clock")

// Clock is the Redis server's clock as estimated from TIME: the local
// clock plus the estimated offset. It is a throttle.Clock, and safe for
// concurrent use.
type Clock struct {
	timer Timer
	local throttle.Clock

	mu     sync.Mutex // held while estimating in the foreground
	est    atomic.Pointer[estimate]
	busy   atomic.Bool // a background re-estimation is running
	every  time.Duration
	maxAge time.Duration
}

type estimate struct {
	offset time.Duration // server - local
	rtt    time.Duration
	at     time.Time // local instant of the estimate
}

// New returns a Clock of t's server over local (throttle.SystemClock if
// nil). It makes no call before Ready or Now.
func New(t Timer, local throttle.Clock) *Clock {
	if local == nil {
		local = throttle.SystemClock
	}
	return &Clock{timer: t, local: local, every: Every, maxAge: MaxAge}
}

// Ready makes sure there is an estimate, making the first one within ctx
// if needed, and starts a background re-estimation when the one in use is
// older than Every. Its error wraps ErrNoEstimate and the Redis error.
func (c *Clock) Ready(ctx context.Context) error {
	e := c.est.Load()
	if e == nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.est.Load() != nil {
			return nil
		}
		if err := c.Estimate(ctx); err != nil {
			return fmt.Errorf("%w: %w", ErrNoEstimate, err)
		}
		return nil
	}
	if c.local.Now().Sub(e.at) >= c.every && c.busy.CompareAndSwap(false, true) {
		go func() {
			defer c.busy.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), Timeout)
			defer cancel()
			_ = c.Estimate(ctx)
		}()
	}
	return nil
}

// Estimate measures the offset now, with Samples round trips, and keeps
// the result if its round trip is no longer than that of the estimate in
// use, or that one is older than MaxAge. It returns the first Redis error
// if no sample succeeded.
func (c *Clock) Estimate(ctx context.Context) error {
	var best *estimate
	var first error
	for range Samples {
		t0 := c.local.Now()
		srv, err := c.timer.Time(ctx).Result()
		t1 := c.local.Now()
		if err != nil {
			if first == nil {
				first = err
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		rtt := t1.Sub(t0)
		// TIME truncates to the µs: the server's instant lies in
		// [srv, srv+1µs).
		mid := t0.Add(rtt / 2)
		e := &estimate{offset: srv.Add(500 * time.Nanosecond).Sub(mid), rtt: rtt, at: t1}
		if best == nil || e.rtt < best.rtt {
			best = e
		}
	}
	if best == nil {
		return first
	}
	for {
		old := c.est.Load()
		if old != nil && best.rtt > old.rtt && best.at.Sub(old.at) < c.maxAge {
			return nil
		}
		if c.est.CompareAndSwap(old, best) {
			return nil
		}
	}
}

// Now returns the local clock plus the estimated offset, or the local
// clock alone before the first estimate (limiters call Ready first, and
// fail instead of deciding on it).
func (c *Clock) Now() time.Time {
	now := c.local.Now()
	if e := c.est.Load(); e != nil {
		return now.Add(e.offset)
	}
	return now
}

// Bound returns the error bound of the estimate in use: half its round
// trip (0 without one).
func (c *Clock) Bound() time.Duration {
	if e := c.est.Load(); e != nil {
		return e.rtt / 2
	}
	return 0
}

// Offset returns the estimated server clock minus the local clock.
func (c *Clock) Offset() time.Duration {
	if e := c.est.Load(); e != nil {
		return e.offset
	}
	return 0
}
