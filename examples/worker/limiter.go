package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// Limiter families, the values of -limiter.
const (
	familyWindow = "window" // sliding window log: window.NewMemory, or window.NewRedis with -redis
	familyBucket = "bucket" // token bucket: bucket.NewLocal, or bucket.NewRedis with -redis
	familyHybrid = "hybrid" // bucket.NewHybrid: local decisions on tokens leased from Redis; needs -redis
)

// hybridHold is how long a Hybrid may hold leased tokens before it spends
// or returns them (see bucket.Hybrid, "Guarantee"): its admissions in a
// span T are at most burst + (T + hybridHold) × rate.
const hybridHold = 500 * time.Millisecond

// redisTimeout bounds each Redis call of the window and bucket limiters.
// The timeout also covers the wait for a pooled connection, and a flood
// on 2 cores shared by NATS, asynq and redis-server can queue hundreds of
// decisions at once: the default 50 ms would then turn a busy Redis into
// degraded decisions.
const redisTimeout = 500 * time.Millisecond

// limiterSpec is the family of the per-tenant limiters and its settings.
// The zero value is the sliding window.
type limiterSpec struct {
	Family string // familyWindow ("" too), familyBucket or familyHybrid
	Burst  int    // bucket capacity; 0 means each tenant's rate Count
	// Meters gets the hybrids' own metrics (bucket.WithMeterProvider):
	// the provider of -metrics. Nil means the global one.
	Meters metric.MeterProvider
}

// parseLimiterSpec checks the -limiter and -burst flags; hybrid needs a
// Redis URL.
func parseLimiterSpec(family string, burst int, redisURL string) (limiterSpec, error) {
	switch family {
	case "", familyWindow:
		family = familyWindow
		if burst != 0 {
			return limiterSpec{}, errors.New("-burst: only for -limiter bucket or hybrid (a window has no burst)")
		}
	case familyBucket:
	case familyHybrid:
		if redisURL == "" {
			return limiterSpec{}, errors.New("-limiter hybrid needs -redis URL: the hybrid leases its tokens from a Redis bucket")
		}
	default:
		return limiterSpec{}, fmt.Errorf("-limiter: %q is not window, bucket or hybrid", family)
	}
	if burst < 0 {
		return limiterSpec{}, fmt.Errorf("-burst: must be >= 1 (or 0 for the rate's count), got %d", burst)
	}
	return limiterSpec{Family: family, Burst: burst}, nil
}

// bucketed reports whether the family is a token bucket.
func (s limiterSpec) bucketed() bool { return s.Family == familyBucket || s.Family == familyHybrid }

// burstOf returns the capacity of the bucket of a tenant at rate r.
func (s limiterSpec) burstOf(r throttle.Rate) int {
	if s.Burst > 0 {
		return s.Burst
	}
	return r.Count
}

// bound returns the most cost units the limiter may admit for one tenant
// at rate r in any window of r.Per, and how that bound is made up, as the
// summary states it:
//   - window: the limit, Count;
//   - bucket: burst + the refill over the window (Count);
//   - hybrid: burst + the refill over the window and the lease hold
//     (Count × (Per + 500 ms) / Per, rounded up), the documented worst case
//     of bucket.Hybrid.
func (s limiterSpec) bound(r throttle.Rate) (int, string) {
	switch s.Family {
	case familyBucket:
		b := s.burstOf(r)
		return b + r.Count, fmt.Sprintf("bound %d = burst %d + refill %d", b+r.Count, b, r.Count)
	case familyHybrid:
		b := s.burstOf(r)
		span := r.Per + hybridHold
		refill := int((int64(r.Count)*int64(span) + int64(r.Per) - 1) / int64(r.Per))
		return b + refill, fmt.Sprintf("bound %d = burst %d + refill %d in %v", b+refill, b, refill, span)
	default:
		return r.Count, fmt.Sprintf("limit %d", r.Count)
	}
}

// describe names the limiters, for the header line: addr is the Redis
// server ("" for in-process limiters).
func (s limiterSpec) describe(addr string) string {
	burst := ""
	if s.bucketed() {
		burst = ", burst = each tenant's count"
		if s.Burst > 0 {
			burst = fmt.Sprintf(", burst %d", s.Burst)
		}
	}
	switch {
	case s.Family == familyHybrid:
		return "hybrid token bucket on Redis at " + addr + burst
	case s.Family == familyBucket && addr == "":
		return "in-process token bucket" + burst
	case s.Family == familyBucket:
		return "Redis token bucket at " + addr + burst
	case addr == "":
		return "in-memory window"
	default:
		return "Redis window at " + addr
	}
}

// newFamilyLimiter returns the per-tenant limiter of spec: in process when
// rc is nil, otherwise on Redis with keys under prefix. Hybrids need rc to
// honour context deadlines (ContextTimeoutEnabled).
func newFamilyLimiter(spec limiterSpec, rc *redis.Client, prefix string, tenants []string, rateOf func(string) throttle.Rate) (*tenantLimiter, error) {
	var hybrids []*bucket.Hybrid
	tl, err := newTenantLimiter(tenants, rateOf, func(r throttle.Rate) (throttle.Limiter, error) {
		switch {
		case spec.Family == familyHybrid:
			if rc == nil {
				return nil, errors.New("-limiter hybrid needs -redis URL")
			}
			h, err := bucket.NewHybrid(rc, r, spec.burstOf(r), bucket.WithPrefix(prefix), bucket.WithMeterProvider(spec.Meters))
			if err == nil {
				hybrids = append(hybrids, h)
			}
			return h, err
		case spec.Family == familyBucket && rc == nil:
			return bucket.NewLocal(r, spec.burstOf(r))
		case spec.Family == familyBucket:
			return bucket.NewRedis(rc, r, spec.burstOf(r), bucket.WithPrefix(prefix), bucket.WithTimeout(redisTimeout))
		case rc == nil:
			return window.NewMemory(r)
		default:
			return window.NewRedis(rc, r, window.WithPrefix(prefix), window.WithTimeout(redisTimeout))
		}
	})
	if err != nil {
		for _, h := range hybrids {
			h.Close(context.Background())
		}
		return nil, err
	}
	tl.hybrids = hybrids
	return tl, nil
}

// tenantLimiter routes each key (a tenant) to the limiter for the tenant's
// rate, so one Gate can enforce per-tenant limits. Tenants sharing a rate
// share one limiter (keys are separate inside it). It is safe for
// concurrent use.
type tenantLimiter struct {
	def     throttle.Limiter
	rate    throttle.Rate
	byKey   map[string]throttle.Limiter
	hybrids []*bucket.Hybrid // the limiters, with -limiter hybrid

	// admitted, if set, is called for every admission with the clock read
	// just before and just after the limiter decided: the instant the
	// limiter counted the admission lies between the two. id is the
	// admission's identity ("" without one): an id admitted again while
	// its first admission is still in the window is not charged again.
	admitted func(key, id string, n int, before, after time.Time)
	// rejected, if set, is called for every rejection by id, with whether
	// it reserved the id's slot (Decision.Reserved).
	rejected func(id string, reserved bool)
}

// newTenantLimiter builds one limiter per distinct rate among tenants, with
// newLimiter; keys not among tenants use the rate of "".
func newTenantLimiter(tenants []string, rateOf func(string) throttle.Rate, newLimiter func(throttle.Rate) (throttle.Limiter, error)) (*tenantLimiter, error) {
	byRate := map[throttle.Rate]throttle.Limiter{}
	get := func(r throttle.Rate) (throttle.Limiter, error) {
		if l, ok := byRate[r]; ok {
			return l, nil
		}
		l, err := newLimiter(r)
		if err != nil {
			return nil, err
		}
		byRate[r] = l
		return l, nil
	}
	tl := &tenantLimiter{rate: rateOf(""), byKey: map[string]throttle.Limiter{}}
	var err error
	if tl.def, err = get(tl.rate); err != nil {
		return nil, err
	}
	for _, t := range tenants {
		if tl.byKey[t], err = get(rateOf(t)); err != nil {
			return nil, err
		}
	}
	return tl, nil
}

// AllowN asks the key's limiter.
func (l *tenantLimiter) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	x, ok := l.byKey[key]
	if !ok {
		x = l.def
	}
	before := time.Now()
	d, err := x.AllowN(ctx, key, n)
	if err == nil && d.Allowed && l.admitted != nil {
		l.admitted(key, "", n, before, time.Now())
	}
	return d, err
}

// AllowID asks the key's limiter by id when it has ids (throttle.IDLimiter:
// the windows and the Local and Redis buckets), else AllowN: the hybrid
// makes no reservations.
func (l *tenantLimiter) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	x, ok := l.byKey[key]
	if !ok {
		x = l.def
	}
	ids, ok := x.(throttle.IDLimiter)
	if !ok {
		return l.AllowN(ctx, key, n)
	}
	before := time.Now()
	d, err := ids.AllowID(ctx, key, n, id, horizon)
	if err == nil && d.Allowed && l.admitted != nil {
		l.admitted(key, id, n, before, time.Now())
	}
	if err == nil && !d.Allowed && l.rejected != nil {
		l.rejected(id, d.Reserved)
	}
	return d, err
}

// reservedIDs are the ids whose last rejection reserved their slot, until
// the NAK that follows it takes them. It is safe for concurrent use.
type reservedIDs struct {
	mu  sync.Mutex
	ids map[string]bool
}

func newReservedIDs() *reservedIDs { return &reservedIDs{ids: map[string]bool{}} }

// set records the last rejection of id.
func (r *reservedIDs) set(id string, reserved bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reserved {
		r.ids[id] = true
	} else {
		delete(r.ids, id)
	}
}

// take reports whether the last rejection of id reserved its slot, and
// forgets it.
func (r *reservedIDs) take(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := r.ids[id]
	delete(r.ids, id)
	return ok
}

// Rate returns the default rate; the Gate uses its Count as the Limit of
// degraded decisions.
func (l *tenantLimiter) Rate() throttle.Rate { return l.rate }

// Algorithm returns the algorithm of the limiters.
func (l *tenantLimiter) Algorithm() string {
	if a, ok := l.def.(throttle.Algorithmer); ok {
		return a.Algorithm()
	}
	return "sliding_window_log"
}

// hybridStats returns the decision counts of the hybrids added up, and
// false if the limiters are not hybrids.
func (l *tenantLimiter) hybridStats() (bucket.HybridStats, bool) {
	var sum bucket.HybridStats
	for _, h := range l.hybrids {
		s := h.Stats()
		sum.Local += s.Local
		sum.Redis += s.Redis
		sum.Degraded += s.Degraded
		sum.Errors += s.Errors
	}
	return sum, len(l.hybrids) > 0
}

// close closes the hybrids, returning their unused leased tokens to Redis.
func (l *tenantLimiter) close(ctx context.Context) error {
	var errs []error
	for _, h := range l.hybrids {
		errs = append(errs, h.Close(ctx))
	}
	return errors.Join(errs...)
}
