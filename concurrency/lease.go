package concurrency

import (
	"errors"
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// ErrNotHeld is returned by Renew for an id that holds no slot of the key:
// it never acquired one, released it, or its lease ended. The id must
// Acquire again (and may be rejected).
var ErrNotHeld = errors.New("concurrency: slot not held")

// maxLeaseMicros bounds a lease so that lease deadlines stay exact in a
// Lua number (a float64): now + 2^52 µs (about 142 years) < 2^53.
const maxLeaseMicros = 1 << 52

// leaseMicros returns lease in whole microseconds, rounded up, or an error
// wrapping throttle.ErrInvalidCost (a usage error to the throttle.Gate)
// for a lease <= 0 or longer than 2^52 µs.
func leaseMicros(lease time.Duration) (int64, error) {
	if lease <= 0 {
		return 0, fmt.Errorf("%w: lease must be > 0, got %v", throttle.ErrInvalidCost, lease)
	}
	if lease > maxLeaseMicros*time.Microsecond {
		return 0, fmt.Errorf("%w: lease %v is longer than the 2^52 µs (about 142 years) a lease can be", throttle.ErrInvalidCost, lease)
	}
	return int64((lease + time.Microsecond - 1) / time.Microsecond), nil
}

// micros converts µs to a Duration rounded up to the millisecond (0 for
// us <= 0).
func micros(us int64) time.Duration {
	return throttle.CeilMillisecond(time.Duration(us) * time.Microsecond)
}

// decision builds the Decision of an Acquire from the holders after the
// call and the times, µs from now, until the earliest and the latest lease
// end (first is read only for a rejection).
func decision(allowed bool, limit, holders int, first, last int64, src throttle.Source) throttle.Decision {
	d := throttle.Decision{
		Allowed:    allowed,
		Limit:      limit,
		Remaining:  max(limit-holders, 0),
		ResetAfter: micros(last),
		Source:     src,
	}
	if !allowed {
		// > 0 by construction (ended leases are dropped first); kept > 0
		// whatever the store says, as the Decision contract asks.
		d.RetryAfter = max(micros(first), time.Millisecond)
	}
	return d
}
