package throttle

import (
	"context"
	"time"
)

// Limiter decides admissions. AllowN admits a request of cost n for key, or
// rejects it with a RetryAfter. The limit is fixed at construction.
//
// A rejection is a Decision with Allowed == false and a nil error. An error
// means the limiter could not decide: a store failure or timeout, or a bad
// request (wrapping ErrInvalidCost or ErrInvalidKey). Implementations are
// safe for concurrent use.
type Limiter interface {
	AllowN(ctx context.Context, key string, n int) (Decision, error)
}

// IDLimiter is an optional Limiter capability: decisions keyed by a request
// identity, which make a rejection a schedule rather than a bounce and make
// admission idempotent. The Gate uses it (Gate.AdmitID) when the limiter
// has it; window.Memory, window.Redis, bucket.Local and bucket.Redis do,
// and so does All when all its parts are SlotLimiters.
type IDLimiter interface {
	Limiter
	// AllowID decides a request of cost n with identity id (a stream
	// sequence, a task ID; opaque bytes, scoped to key) for key:
	//
	//   - an id already admitted and still counted: Allowed, nothing
	//     charged again (a redelivery, another worker, a retry after a
	//     lost reply);
	//   - an id whose reservation time has come: Allowed on it;
	//   - an id holding a future reservation: rejected, Reserved,
	//     RetryAfter = the time to its slot, nothing new reserved;
	//   - otherwise as AllowN; a rejection reserves the next free slot
	//     when it lies within horizon (Reserved == true, RetryAfter = the
	//     time to the slot), and reserves nothing beyond it (Reserved ==
	//     false, RetryAfter = when it would fit). horizon 0 never
	//     reserves.
	//
	// Errors are those of AllowN, and one wrapping ErrInvalidOption for a
	// negative horizon.
	AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (Decision, error)
}

// SlotLimiter is an optional Refunder capability: reserving a request's
// slot no earlier than a given instant. [All] uses it to hold one slot, the
// latest of its parts' earliest, in every part at once; window.Memory,
// window.Redis, bucket.Local and bucket.Redis have it.
type SlotLimiter interface {
	Refunder
	// AllowIDAfter is AllowID for a request that must not start before
	// now + after (after >= 0; 0 is AllowID itself):
	//
	//   - an id already admitted and still counted: Allowed and
	//     AlreadyAdmitted, nothing charged;
	//   - an id holding a reservation at or after now + after: rejected,
	//     Reserved, RetryAfter = the time to its slot, nothing changed;
	//   - otherwise (a new id, or one whose reserved slot lies before now
	//     + after: that reservation is given up first) the earliest slot
	//     at or after now + after where the request fits, reserved when it
	//     lies within horizon (Reserved, RetryAfter = the time to it),
	//     else nothing reserved (Reserved false, RetryAfter = when it
	//     would fit). With after > 0 nothing is admitted now.
	//
	// A token bucket reserves a slot later than its own only where the
	// tokens it takes now cannot add to a burst at the slot: when the
	// bucket would refill to its burst before the slot, it reserves
	// nothing and answers RetryAfter = after (it will have the tokens then
	// unless others take them first).
	//
	// Errors are those of AllowID, and one wrapping ErrInvalidOption for a
	// negative after.
	AllowIDAfter(ctx context.Context, key string, n int, id string, horizon, after time.Duration) (Decision, error)
}

// Algorithmer is implemented by limiters that name their algorithm, such as
// "sliding_window_log" or "token_bucket". The Gate records the name as the
// throttle.algorithm span attribute.
type Algorithmer interface {
	Algorithm() string
}

// Clock tells the time. Limiters take one through a WithClock option so
// tests can use fixed instants; the default is the system clock. A Clock
// must be safe for concurrent use: decisions read it, and so do the
// in-process limiters' janitors.
type Clock interface {
	Now() time.Time
}

// ClockFunc adapts a function to a Clock.
type ClockFunc func() time.Time

// Now returns f().
func (f ClockFunc) Now() time.Time { return f() }

// SystemClock is the system's clock, read through the monotonic clock
// only: its Now is the instant the process started using it plus the
// monotonic time elapsed since. That is one clock read instead of
// time.Now's two, and immune to steps of the wall clock (its wall reading
// may drift from the system's by NTP's slew, and does not count time the
// machine spends suspended).
var SystemClock Clock = monotonicClock{base: time.Now()}

type monotonicClock struct{ base time.Time }

func (c monotonicClock) Now() time.Time { return c.base.Add(time.Since(c.base)) }

// LimiterFunc adapts a function to a Limiter.
type LimiterFunc func(ctx context.Context, key string, n int) (Decision, error)

// AllowN returns f(ctx, key, n).
func (f LimiterFunc) AllowN(ctx context.Context, key string, n int) (Decision, error) {
	return f(ctx, key, n)
}
