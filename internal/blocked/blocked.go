// Package blocked turns the quota lookups of the limiters into their
// decisions for keys whose quota is 0 (throttle.Blocked) and their errors
// for quotas that cannot be enforced (throttle.ErrInvalidQuota).
package blocked

import (
	"errors"
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Error is what a quota lookup returns for a blocked key: not a failure,
// the rejection Decide makes of it.
type Error struct {
	Key        string
	RetryAfter time.Duration // the blocked quota's Rate.Per, rounded up to the millisecond
}

func (e *Error) Error() string {
	return fmt.Sprintf("quota of key %q is 0: blocked for %v", e.Key, e.RetryAfter)
}

// Check returns nil for a quota that is not blocked, the *Error of a
// blocked one, and for an invalid one an error naming pkg and key that
// wraps throttle.ErrInvalidQuota and the quota's own error.
func Check(pkg, key string, q throttle.Quota, invalid error) error {
	if q.IsBlocked() {
		return &Error{Key: key, RetryAfter: throttle.CeilMillisecond(q.Rate.Per)}
	}
	if invalid != nil {
		return Invalid(pkg, key, invalid)
	}
	return nil
}

// Invalid wraps err, a quota's validation error, as the error of a
// decision for key: it matches throttle.ErrInvalidQuota and
// throttle.ErrInvalidOption.
func Invalid(pkg, key string, err error) error {
	return fmt.Errorf("%s: quota of key %q: %w: %w", pkg, key, throttle.ErrInvalidQuota, err)
}

// Decision returns, for the error of a blocked key's quota lookup, the
// rejection to return in its place: Remaining 0, Limit 0, RetryAfter and
// ResetAfter the quota's period, nothing charged or reserved.
func Decision(err error, src throttle.Source) (throttle.Decision, bool) {
	var b *Error
	if !errors.As(err, &b) {
		return throttle.Decision{}, false
	}
	return throttle.Decision{RetryAfter: b.RetryAfter, ResetAfter: b.RetryAfter, Source: src}, true
}

// Or returns Decision's rejection and a nil error for a blocked key's
// error, and err otherwise.
func Or(err error, src throttle.Source) (throttle.Decision, error) {
	if d, ok := Decision(err, src); ok {
		return d, nil
	}
	return throttle.Decision{}, err
}

// Merge returns the decisions and errors of a whole batch: held's at
// their indices, and in the other places, in order, those of the requests
// sent on (ds, and errs if not nil).
func Merge(held map[int]throttle.Decision, ds []throttle.Decision, errs []error) ([]throttle.Decision, []error) {
	all := make([]throttle.Decision, len(ds)+len(held))
	var allErrs []error
	if errs != nil {
		allErrs = make([]error, len(all))
	}
	j := 0
	for i := range all {
		if d, ok := held[i]; ok {
			all[i] = d
			continue
		}
		all[i] = ds[j]
		if errs != nil {
			allErrs[i] = errs[j]
		}
		j++
	}
	return all, allErrs
}

// Is reports whether err is a blocked key's.
func Is(err error) bool {
	var b *Error
	return errors.As(err, &b)
}
