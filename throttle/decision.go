package throttle

import (
	"math"
	"time"
)

// Never is the RetryAfter of a rejection that no wait can turn into an
// admission. Limiters in this module return an error for such requests
// instead (see [ErrInvalidCost]); Never exists so that a Decision can say it.
const Never time.Duration = math.MaxInt64

// Source says who made a Decision.
type Source int

// The sources of a Decision. The zero Source is SourceUnknown.
const (
	SourceUnknown  Source = iota // not set
	SourceLocal                  // decided in this process, without a network call
	SourceRedis                  // decided by a Redis round trip
	SourceDegraded               // the store was unreachable; the failure policy decided
)

// String returns "local", "redis", "degraded" or "unknown".
func (s Source) String() string {
	switch s {
	case SourceLocal:
		return "local"
	case SourceRedis:
		return "redis"
	case SourceDegraded:
		return "degraded"
	default:
		return "unknown"
	}
}

// Decision is the admission decision for one request of cost n. It is a
// value; its durations are never negative and never rounded down.
type Decision struct {
	// Allowed reports whether the request was admitted (and charged).
	Allowed bool
	// Limit is the Count of the limiter's Rate: the most admissions (of
	// cost 1) it allows per Per.
	Limit int
	// Remaining is how many more units could be admitted at this instant
	// after this decision. For example, with 100 per second, 97 admitted in
	// the last second and this request of cost 1 admitted, Remaining is 2.
	Remaining int
	// RetryAfter is 0 when Allowed. When rejected it is how long until the
	// same request would be admitted if nobody else took the room first,
	// rounded up to the millisecond and > 0 (Never if no wait would do).
	// For example, with 100 per second and the oldest counted admission
	// 700 ms ago, RetryAfter is 300ms.
	RetryAfter time.Duration
	// ResetAfter is how long until the limiter is back to its initial state
	// for this key (Remaining == Limit) if nothing else is admitted, rounded
	// up to the millisecond. For example, for a window of 1 s whose newest
	// admission was 200 ms ago, ResetAfter is 800ms.
	ResetAfter time.Duration
	// Source says who decided.
	Source Source
	// Reserved reports, for a rejection, that the limiter holds a slot for
	// this request's id at now + RetryAfter (see IDLimiter): presenting
	// the same id again at or after that instant is admitted on the
	// reservation. (For All: every part holds it, or will have room then
	// without holding it; see All.) Always false when Allowed.
	Reserved bool
	// AlreadyAdmitted reports, for an admission by AllowID, that the id
	// was admitted before this call and is still counted (a redelivery,
	// another worker, a retry after a lost reply): this call charged
	// nothing, and a Refund would take back that earlier admission, which
	// may have run. (For All: some part had admitted it before; others
	// may have charged it now.) Always false when rejected and for AllowN.
	AlreadyAdmitted bool
	// Err is, for a Decision a Gate made with its failure policy because
	// the limiter could not decide (Source SourceDegraded), the limiter's
	// error: a store failure or timeout, or ErrClosed. Gate.Admit then
	// returns a nil error, so that callers follow the policy, and Err is
	// how they learn why (the consumers in this module pass it, rate
	// limited, to their error handlers as a *StoreError). It is also set,
	// with Source SourceLocal, on the rejection of a request that an
	// in-process limiter refused as one key too many (ErrTooManyKeys).
	// Nil otherwise, and always nil in Decisions that limiters return.
	Err error
}

// CeilMillisecond rounds d up to a whole millisecond. Negative durations
// become 0. Limiters use it so that a RetryAfter is never rounded down.
func CeilMillisecond(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
