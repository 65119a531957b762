package throttle

import (
	"fmt"
	"strconv"
	"strings"
)

// Quota is the limit of one key: its Rate and, for token buckets, its
// Burst (the capacity in tokens; 0 means Rate.Count). The zero Quota means
// the limiter's own limit.
type Quota struct {
	Rate  Rate
	Burst int
}

// IsZero reports whether q is the zero Quota: use the limiter's own limit.
func (q Quota) IsZero() bool { return q == Quota{} }

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
// spaces, and "burst" may be written "burst=N". Errors wrap
// ErrInvalidOption and name the field (Rate, Rate.Count, Rate.Per or
// Quota.Burst).
func ParseQuota(s string) (Quota, error) {
	f := strings.Fields(strings.ReplaceAll(s, "=", " "))
	if len(f) != 1 && (len(f) != 3 || !strings.EqualFold(f[1], "burst")) {
		return Quota{}, &OptionError{Field: "Quota", Reason: fmt.Sprintf("%q is not RATE or RATE burst N, e.g. 20/1s burst 40", s)}
	}
	r, err := ParseRate(f[0])
	if err != nil {
		return Quota{}, err
	}
	q := Quota{Rate: r}
	if len(f) == 3 {
		b, err := strconv.Atoi(f[2])
		if err != nil || b < 1 {
			return Quota{}, &OptionError{Field: "Quota.Burst", Reason: fmt.Sprintf("%q is not an integer >= 1", f[2])}
		}
		q.Burst = b
	}
	return q, nil
}
