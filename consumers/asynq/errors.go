package asynqthrottle

import (
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// RateLimitError is the error the middleware returns for a rejected task.
// It carries the Gate's Decision; RetryIn is its RetryAfter, the name the
// asynq documentation gives this idiom. It matches throttle.ErrLimited with
// errors.Is, and errors.As finds it as *RateLimitError and also as
// *throttle.LimitedError.
//
// It is also the error of a task the Gate admitted and the in-flight
// limiter (WithInFlight) refused a slot: Decision is then the in-flight
// limiter's rejection, whose RetryAfter is the time until the earliest
// lease of the key ends (or the Gate's degraded retry-after when the
// limiter failed under FailClosed), and Error says "in-flight limit
// reached".
//
// IsFailure reports false for it, so asynq does not count it as a failure
// nor increment the task's retry count, and RetryDelayFunc turns it into a
// delay that never brings the task back before RetryIn has passed.
type RateLimitError struct {
	throttle.LimitedError // Key and Decision

	// RetryIn is how long after the decision the task may be admitted:
	// Decision.RetryAfter, > 0.
	RetryIn time.Duration

	// Err, when not nil, is why the task could not be kept from asynq's
	// retry path: the re-enqueue of a task on its last attempt failed, or
	// its deadline comes before RetryIn has passed. asynq then archives the
	// task (its retry count has reached MaxRetry) with this error.
	Err error

	// decidedAt is when the Gate decided (wall clock, read after Admit
	// returned), zero for a RateLimitError built elsewhere.
	decidedAt time.Time
	// returnAt, when set, is when the task should be back in its queue: a
	// little before its reserved slot, which it then waits for in the
	// handler (see WithServerConfig).
	returnAt time.Time
	// slot is true when the Gate admitted the task and the in-flight
	// limiter (WithInFlight) refused it a slot.
	slot bool
	// backoff is true when the Gate admitted the task and the handler
	// returned Backoff: RetryIn is its delay.
	backoff bool
	// deferred is true when the fair shares sent the task back until its
	// key's share of the handlers reaches it: RetryIn is that delay.
	deferred bool
}

func newRateLimitError(key string, d throttle.Decision, at time.Time) *RateLimitError {
	return &RateLimitError{
		LimitedError: throttle.LimitedError{Key: key, Decision: d},
		RetryIn:      d.RetryAfter,
		decidedAt:    at,
	}
}

func (e *RateLimitError) Error() string {
	what := "rate limited"
	switch {
	case e.slot:
		what = "in-flight limit reached"
	case e.backoff:
		what = "backoff: key paused"
	case e.deferred:
		what = "deferred to its key's share of the handlers"
	}
	s := fmt.Sprintf("asynqthrottle: %s: key %q, retry in %v", what, e.Key, e.RetryIn)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the embedded *throttle.LimitedError and Err (when set), so
// errors.Is and errors.As see both.
func (e *RateLimitError) Unwrap() []error {
	if e.Err == nil {
		return []error{&e.LimitedError}
	}
	return []error{&e.LimitedError, e.Err}
}

// IsFailure reports whether asynq should count err as a failure: false for
// nil and for throttling (any error matching throttle.ErrLimited, such as
// *RateLimitError), true for everything else, like asynq's default. Set it
// as asynq.Config.IsFailure, or compose it with your own:
//
//	IsFailure: func(err error) bool { return asynqthrottle.IsFailure(err) && myIsFailure(err) },
//
// It is safe for concurrent use.
func IsFailure(err error) bool {
	return err != nil && !errors.Is(err, throttle.ErrLimited)
}

// RetryDelayFunc returns an asynq.RetryDelayFunc for asynq.Config: for a
// throttling error it returns a delay that brings the task back no earlier
// than the error's retry-after; for any other error it returns
// fallback(n, err, t), where a nil fallback means asynq.DefaultRetryDelayFunc.
//
// asynq stores a retry time as whole seconds (processAt.Unix(), the ZADD
// score of the retry set) and forwards a task once that score is <= the
// current Unix second, so a task can come back up to 1 s before the time
// it was given. The delay is therefore computed so that the truncated
// second is never early: for a *RateLimitError returned by the middleware,
// the time until the decision instant plus RetryIn, rounded up to the next
// whole second; for any other error carrying a retry-after
// (*RateLimitError built elsewhere, *throttle.LimitedError) that
// retry-after plus 1 s, because floor(now+d+1s) > now+d. The task then
// waits for asynq's next check of delayed tasks
// (Config.DelayedTaskCheckInterval, default 5 s). A throttling error
// without a retry-after (throttle.ErrLimited itself) gets the fallback.
func RetryDelayFunc(fallback asynq.RetryDelayFunc) asynq.RetryDelayFunc {
	if fallback == nil {
		fallback = asynq.DefaultRetryDelayFunc
	}
	return func(n int, err error, t *asynq.Task) time.Duration {
		if d, ok := retryDelay(time.Now(), err); ok {
			return d
		}
		return fallback(n, err, t)
	}
}

// retryDelay is the delay to hand asynq at now for err, and whether err
// carries a retry-after.
func retryDelay(now time.Time, err error) (time.Duration, bool) {
	var rl *RateLimitError
	if errors.As(err, &rl) {
		if !rl.returnAt.IsZero() {
			return max(rl.returnAt.Sub(now), 0), true
		}
		if !rl.decidedAt.IsZero() {
			return max(ceilSecond(rl.decidedAt.Add(rl.RetryIn)).Sub(now), 0), true
		}
		return plusSecond(rl.RetryIn), true
	}
	var le *throttle.LimitedError
	if errors.As(err, &le) {
		return plusSecond(le.RetryAfter()), true
	}
	if be := backoffOf(err); be != nil { // returned without the middleware
		return plusSecond(be.Delay), true
	}
	return 0, false
}

// plusSecond returns d + 1s, saturating; negative d counts as 0.
func plusSecond(d time.Duration) time.Duration {
	d = max(d, 0)
	if d > throttle.Never-time.Second {
		return throttle.Never
	}
	return d + time.Second
}

// ceilSecond rounds t up to a whole Unix second.
func ceilSecond(t time.Time) time.Time {
	s := t.Truncate(time.Second)
	if s.Before(t) {
		s = s.Add(time.Second)
	}
	return s
}
