package throttle

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Quota is the limit of one key: its Rate and, for token buckets, its
// Burst (the capacity in tokens; 0 means Rate.Count). The zero Quota means
// the limiter's own limit. A Quota of 0 per D (Rate.Count 0, Rate.Per D >
// 0, Burst 0; see Blocked) blocks the key.
type Quota struct {
	Rate  Rate
	Burst int
}

// IsZero reports whether q is the zero Quota: use the limiter's own limit.
func (q Quota) IsZero() bool { return q == Quota{} }

// Blocked returns the Quota of 0 per retry: every decision of the key is a
// rejection with a RetryAfter of retry (rounded up to the millisecond),
// charging and reserving nothing, as while the key is paused, until the
// quota changes. It is a limit, not an error: no failure policy applies.
// Give as retry how soon a change of the quota can be seen (a source's
// refresh interval), so that a message comes back when it may run.
func Blocked(retry time.Duration) Quota { return Quota{Rate: Rate{Per: retry}} }

// IsBlocked reports whether q blocks its key (see Blocked).
func (q Quota) IsBlocked() bool { return q.Rate.Count == 0 && q.Rate.Per > 0 && q.Burst == 0 }

// Validate returns nil for the zero Quota, a blocked one, and one whose
// Rate is valid with Burst >= 0; otherwise an error wrapping
// ErrInvalidOption naming the field.
func (q Quota) Validate() error {
	if q.IsZero() || q.IsBlocked() {
		return nil
	}
	if err := q.Rate.Validate(); err != nil {
		return err
	}
	if q.Burst < 0 {
		return &OptionError{Field: "Quota.Burst", Reason: fmt.Sprintf("must be >= 0, got %d", q.Burst)}
	}
	return nil
}

// ErrInvalidQuota is wrapped, beside ErrInvalidOption, by the error of a
// decision whose key's QuotaFunc returned a quota the limiter cannot
// enforce. A Gate decides such a request with its quota failure policy
// (WithQuotaFailurePolicy, FailClosed unless chosen), not with the store's.
var ErrInvalidQuota = errors.New("throttle: invalid quota")

// QuotaFunc returns the quota of key, for limits that differ per key (plan
// tiers, an override for one big tenant). It is called on every decision,
// so a changed quota applies from the next one; it must be fast and safe
// for concurrent use. A zero Quota means the limiter's own limit.
type QuotaFunc func(key string) Quota

// String formats q as ParseQuota reads it: "20/1s", or "20/1s burst 40"
// when Burst is set. The zero Quota formats as "".
func (q Quota) String() string {
	if q.IsZero() {
		return ""
	}
	if q.Burst != 0 {
		return q.Rate.String() + " burst " + strconv.Itoa(q.Burst)
	}
	return q.Rate.String()
}

// ParseQuota parses a quota written as "RATE" or "RATE burst N": RATE as
// ParseRate reads it ("20/1s", "100/m"), N the burst in tokens (>= 1; for
// token buckets only, a window ignores it). Words are separated by
// spaces, and "burst" may be written "burst=N". A count of 0 ("0/1s", or
// "0/1s burst 5": the burst is checked, then ignored) is the blocked
// Quota of Blocked, with the period as its RetryAfter: 0 means block,
// never a burst that refills. Errors wrap ErrInvalidOption and name the field (Rate,
// Rate.Count, Rate.Per or Quota.Burst).
func ParseQuota(s string) (Quota, error) {
	f := strings.Fields(strings.ReplaceAll(s, "=", " "))
	if len(f) != 1 && (len(f) != 3 || !strings.EqualFold(f[1], "burst")) {
		return Quota{}, &OptionError{Field: "Quota", Reason: fmt.Sprintf("%q is not RATE or RATE burst N, e.g. 20/1s burst 40", s)}
	}
	q := Quota{}
	if len(f) == 3 {
		b, err := strconv.Atoi(f[2])
		if err != nil || b < 1 {
			return Quota{}, &OptionError{Field: "Quota.Burst", Reason: fmt.Sprintf("%q is not an integer >= 1", f[2])}
		}
		q.Burst = b
	}
	r, err := ParseRate(f[0])
	if err != nil {
		var oe *OptionError
		if r.Count == 0 && r.Per > 0 && errors.As(err, &oe) && oe.Field == "Rate.Count" {
			return Blocked(r.Per), nil
		}
		return Quota{}, err
	}
	q.Rate = r
	return q, nil
}
