package bucket

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// WithQuotas gives every key the quota f returns for it: a bucket of
// Quota.Burst tokens (0 means Rate.Count) refilling Rate.Count per
// Rate.Per, with Decision.Limit = Rate.Count; the zero Quota means the
// limiter's own rate and burst. It applies to Local, Redis and Hybrid. f
// runs on every decision (and every Peek), so a changed quota applies from
// the next one; it must be fast and safe for concurrent use (see
// throttle.QuotaFunc). Nil is ignored.
//
// A key's tokens when its quota changes: the bucket keeps the tokens it
// holds, capped at the new burst, and refills from then on at the new
// rate. If Rate.Per changed, the tokens are counted whole (a partial token
// is dropped, a partial debt of reservations counts as a whole token), so
// a change never makes more than the new Burst available and never adds a
// token the bucket did not hold. A shrunk burst therefore limits the very
// next decision; a grown one fills at the new rate. A key seen for the
// first time starts full at its quota's burst. Redis keeps the period a
// key's credit is counted in beside it (the per of its string), so every
// process converts the same way; the Hybrid drops (does not return) the
// tokens it leased for a key under a quota that changed, and leases anew
// under the new one. A Local forgets a key once its bucket is full under
// the quota of its last decision; a key whose quota grew meanwhile comes
// back full at the new burst.
//
// A blocked quota (throttle.Blocked, "0/1s") makes every decision and Peek
// of the key a rejection with the quota's period as RetryAfter, taking
// and reserving nothing; a Refund for it gives back nothing. A quota that
// is not a valid bucket (Rate.Count < 0, Rate.Per <= 0, Burst < 0, or
// Burst × Per beyond 2^53 µs) makes the decision an error wrapping
// throttle.ErrInvalidQuota and throttle.ErrInvalidOption that names the
// key, which a throttle.Gate decides with its quota failure policy
// (FailClosed unless chosen). A cost above the key's burst is
// an error wrapping throttle.ErrInvalidCost, as for the limiter's own.
func WithQuotas(f throttle.QuotaFunc) Option {
	return optionFunc(func(cfg *config) error {
		if f != nil {
			cfg.quotas = f
		}
		return nil
	})
}

// keyLimits is what one key is decided with: its bucket's params, its
// quota and Decision.Limit, and the Redis script arguments, formatted and
// boxed once.
type keyLimits struct {
	p     params
	quota throttle.Quota // Burst filled in
	limit int            // Rate.Count

	// Redis ARGV (see bucket.lua and bucket_id.lua).
	argPer, argCount, argCap any
	argMaxDebt, argMem       any

	// The Hybrid's float views of the refill.
	perSec float64 // tokens per second
	perNs  float64 // tokens per nanosecond
	nsPer  float64 // nanoseconds per token
}

func newKeyLimits(r throttle.Rate, burst int) (*keyLimits, error) {
	p, err := newParams(r, burst)
	if err != nil {
		return nil, err
	}
	return &keyLimits{
		p:          p,
		quota:      throttle.Quota{Rate: r, Burst: burst},
		limit:      r.Count,
		argPer:     strconv.FormatInt(p.perUS, 10),
		argCount:   strconv.FormatInt(p.count, 10),
		argCap:     strconv.FormatInt(p.cap, 10),
		argMaxDebt: strconv.FormatInt(p.maxDebt, 10),
		argMem:     strconv.FormatInt(p.memUS, 10),
		perSec:     float64(r.Count) / r.Per.Seconds(),
		perNs:      float64(r.Count) / float64(r.Per),
		nsPer:      float64(r.Per) / float64(r.Count),
	}, nil
}

// maxCachedQuotas bounds the distinct quotas a limiter keeps limits for;
// quotas beyond it are built on every decision (correct, only slower).
// Quotas are plan tiers and overrides: a handful, not one per key.
const maxCachedQuotas = 1024

// quotaSet finds the limits of a key: the limiter's own, or its quota's.
// The zero quotaSet is not usable; see newQuotaSet.
type quotaSet struct {
	def   *keyLimits
	f     throttle.QuotaFunc        // nil: every key has def
	cache sync.Map                  // throttle.Quota (Burst filled in) -> *keyLimits
	n     atomic.Int64              // entries in cache
	last  atomic.Pointer[keyLimits] // the last quota found: most often the next one
}

func newQuotaSet(r throttle.Rate, burst int, f throttle.QuotaFunc) (*quotaSet, error) {
	def, err := newKeyLimits(r, burst)
	if err != nil {
		return nil, err
	}
	return &quotaSet{def: def, f: f}, nil
}

// of returns key's limits. The error wraps throttle.ErrInvalidOption for an
// invalid quota.
func (q *quotaSet) of(key string) (*keyLimits, error) {
	if q.f == nil {
		return q.def, nil
	}
	return q.lookup(key)
}

func (q *quotaSet) lookup(key string) (*keyLimits, error) {
	quota := q.f(key)
	if quota.IsZero() {
		return q.def, nil
	}
	if quota.IsBlocked() {
		return q.def, blocked.Check("bucket", key, quota, nil)
	}
	if quota.Burst == 0 {
		quota.Burst = quota.Rate.Count
	}
	if quota == q.def.quota {
		return q.def, nil
	}
	if kl := q.last.Load(); kl != nil && kl.quota == quota {
		return kl, nil
	}
	if v, ok := q.cache.Load(quota); ok {
		kl := v.(*keyLimits)
		q.last.Store(kl)
		return kl, nil
	}
	kl, err := newKeyLimits(quota.Rate, quota.Burst)
	if err != nil {
		return nil, blocked.Invalid("bucket", key, err)
	}
	if q.n.Load() < maxCachedQuotas {
		if v, loaded := q.cache.LoadOrStore(quota, kl); loaded {
			return v.(*keyLimits), nil
		}
		q.n.Add(1)
	}
	return kl, nil
}

// convert returns credit, held under from's params, in p's: the same
// credit if the period is the same (refill clamps it to p's cap), but a
// debt no deeper than p's maxDebt (a larger burst allows a smaller debt);
// otherwise its whole tokens (floor, so a partial debt counts as a whole
// token), within [-maxDebt/perUS, burst] tokens. bucket.lua and the other
// scripts do the same.
func (p *params) convert(credit int64, from *params) int64 {
	if from == p || from.perUS == p.perUS {
		return max(credit, -p.maxDebt)
	}
	tokens := credit / from.perUS
	if credit%from.perUS < 0 {
		tokens--
	}
	tokens = max(min(tokens, int64(p.burst)), -(p.maxDebt / p.perUS))
	return tokens * p.perUS
}
