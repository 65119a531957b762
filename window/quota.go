package window

import (
	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// WithQuotas gives every key the quota f returns for it: its Rate.Count
// per Rate.Per (Burst is for token buckets and ignored), or the limiter's
// own Rate when f returns the zero Quota. f runs on every decision, so a
// changed quota applies from the next one: a key's log is judged against
// the new limit as it stands (shrinking a limit never admits over the new
// one; a longer window counts admissions still in the log, which keeps
// only what the old window held). A blocked quota (throttle.Blocked, "0/1s")
// makes every decision of the key a rejection with the quota's period as
// RetryAfter, recording and reserving nothing. A quota that is not a valid
// Rate makes the decision an error wrapping throttle.ErrInvalidQuota and
// throttle.ErrInvalidOption, which a throttle.Gate decides with its quota
// failure policy (FailClosed unless chosen). Nil is ignored.
func WithQuotas(f throttle.QuotaFunc) Option {
	return optionFunc(func(cfg *config) error {
		if f != nil {
			cfg.quotas = f
		}
		return nil
	})
}

// quotaOf returns the rate key is decided with: its quota's, or r. The
// error of a blocked key is a *blocked.Error (see blocked.Or).
func quotaOf(f throttle.QuotaFunc, r throttle.Rate, key string) (throttle.Rate, error) {
	if f == nil {
		return r, nil
	}
	q := f(key)
	if q.IsZero() {
		return r, nil
	}
	if q.IsBlocked() {
		return r, blocked.Check("window", key, q, nil)
	}
	if err := checkRate(q.Rate); err != nil {
		return r, blocked.Invalid("window", key, err)
	}
	return q.Rate, nil
}
