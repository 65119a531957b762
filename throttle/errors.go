package throttle

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInvalidOption is wrapped by every configuration error: a bad Rate,
	// a bad option value, a nil dependency. Match with errors.Is; use
	// errors.As with *OptionError to read the field.
	ErrInvalidOption = errors.New("throttle: invalid option")

	// ErrInvalidCost is wrapped by the error AllowN returns for a cost n
	// that is < 1 or larger than the limit could ever admit at once. Such a
	// request is never admitted and must not be retried.
	ErrInvalidCost = errors.New("throttle: invalid cost")

	// ErrInvalidKey is wrapped by errors for keys a limiter cannot use, and
	// by consumer adapters when their key function fails. Such a request is
	// never admitted and must not be retried.
	ErrInvalidKey = errors.New("throttle: invalid key")

	// ErrClosed is wrapped by the error of a limiter used after Close. The
	// Gate rejects such requests whatever its failure policy (a closed
	// limiter is a shutdown in progress, not an outage to ride through),
	// with its degraded retry-after, so the message comes back to another
	// worker.
	ErrClosed = errors.New("throttle: limiter closed")

	// ErrTooManyKeys is wrapped by the error of an in-process limiter
	// (bucket.Local, window.Memory) that refuses a decision for a new key
	// because it holds its most keys (their WithMaxKeys) and forgetting
	// any of them would change a decision. A Gate rejects such a request
	// whatever its failure policy, with its degraded retry-after and the
	// error in Decision.Err, and counts it in KeysRefusedMetric; no key's
	// state is reset to make room.
	ErrTooManyKeys = errors.New("throttle: too many live keys")

	// ErrSlowStore is matched (errors.Is) by *SlowStoreError: a call to
	// the store timed out, and its round trip is longer than the
	// limiter's WithTimeout, so no call can succeed until one of them
	// changes. The Gate counts such failures in SlowStoreMetric too.
	ErrSlowStore = errors.New("throttle: store slower than the timeout")

	// ErrLimited is matched (errors.Is) by every error that carries a
	// rejection, such as *LimitedError.
	ErrLimited = errors.New("throttle: limited")

	// ErrStore is matched (errors.Is) by *StoreError: the limiter could not
	// decide and the failure policy did.
	ErrStore = errors.New("throttle: store failure")
)

// StoreError reports a decision the failure policy made because the
// limiter failed (Decision.Err): consumer adapters pass it to their error
// handlers, at most a few per second, with the number of failures left
// unreported since the previous one. It matches ErrStore with errors.Is
// and unwraps to the limiter's error.
type StoreError struct {
	Key        string        // the key of the decision
	Policy     FailurePolicy // what decided instead
	Suppressed int           // store failures not reported since the previous report
	Err        error         // the limiter's error
}

func (e *StoreError) Error() string {
	s := fmt.Sprintf("throttle: store failure for key %q, %s decided", e.Key, e.Policy)
	if e.Suppressed > 0 {
		s += fmt.Sprintf(" (%d more since the last report)", e.Suppressed)
	}
	return s + ": " + e.Err.Error()
}

// Is reports whether target is ErrStore.
func (e *StoreError) Is(target error) bool { return target == ErrStore }

// Unwrap returns the limiter's error.
func (e *StoreError) Unwrap() error { return e.Err }

// SlowStoreError is the error of a store call that timed out while the
// store's round trip, a moving average of the calls observed, is longer
// than the per-call timeout. It matches ErrSlowStore with errors.Is and
// unwraps to the call's error (a context.DeadlineExceeded).
type SlowStoreError struct {
	RoundTrip time.Duration // the store's round trip, as measured
	Timeout   time.Duration // the limiter's WithTimeout
	Err       error
}

func (e *SlowStoreError) Error() string {
	return fmt.Sprintf("throttle: the store's round trip (%v) is longer than WithTimeout (%v), so every call times out: %v",
		e.RoundTrip.Round(time.Millisecond), e.Timeout, e.Err)
}

// Hint says what to change, for the Gate's log.
func (e *SlowStoreError) Hint() string {
	return fmt.Sprintf("set the limiter's WithTimeout to about twice the store's round trip (%v), or bring the store closer", (2 * e.RoundTrip).Round(time.Millisecond))
}

// Is reports whether target is ErrSlowStore.
func (e *SlowStoreError) Is(target error) bool { return target == ErrSlowStore }

// Unwrap returns the call's error.
func (e *SlowStoreError) Unwrap() error { return e.Err }

// OptionError is a configuration error naming the field at fault. It
// matches ErrInvalidOption with errors.Is.
type OptionError struct {
	Field  string // the option or field, e.g. "Rate.Count" or "WithPrefix"
	Reason string // why it was refused
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("throttle: invalid option %s: %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalidOption.
func (e *OptionError) Is(target error) bool { return target == ErrInvalidOption }

// CheckCost returns an error wrapping ErrInvalidCost unless 1 <= n <= max.
// Limiters call it before any store access.
func CheckCost(n, max int) error {
	if n < 1 {
		return fmt.Errorf("%w: n must be >= 1, got %d", ErrInvalidCost, n)
	}
	if n > max {
		return fmt.Errorf("%w: n=%d exceeds the limit %d and could never be admitted", ErrInvalidCost, n, max)
	}
	return nil
}

// IsUsageError reports whether err says the request itself is bad (an
// invalid cost or key) rather than that the limiter could not decide. Such
// requests are never admitted, whatever the failure policy, and must not be
// retried.
func IsUsageError(err error) bool {
	return errors.Is(err, ErrInvalidCost) || errors.Is(err, ErrInvalidKey)
}

// LimitedError carries a rejection through code paths that speak in errors.
// It matches ErrLimited with errors.Is.
type LimitedError struct {
	Key      string
	Decision Decision
}

func (e *LimitedError) Error() string {
	return fmt.Sprintf("throttle: limited: key %q, retry after %v", e.Key, e.Decision.RetryAfter)
}

// Is reports whether target is ErrLimited.
func (e *LimitedError) Is(target error) bool { return target == ErrLimited }

// RetryAfter returns the rejection's RetryAfter.
func (e *LimitedError) RetryAfter() time.Duration { return e.Decision.RetryAfter }

// AfterMicros checks AllowIDAfter's after (see SlotLimiter) and returns it
// in µs, rounded up (the slot must not lie before now + after). Its error
// wraps ErrInvalidOption, naming "after", for a negative after.
func AfterMicros(after time.Duration) (int64, error) {
	if after < 0 {
		return 0, &OptionError{Field: "after", Reason: fmt.Sprintf("must be >= 0, got %v", after)}
	}
	return int64((after + time.Microsecond - 1) / time.Microsecond), nil
}
