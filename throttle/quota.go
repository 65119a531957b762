package throttle

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
