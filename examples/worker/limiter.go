package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

// redisTimeout, the default of -redis-timeout, bounds each Redis round
// trip of every limiter (the Hybrid's
// leases too). On 2 cores shared by NATS, asynq, redis-server and several
// worker processes a round trip can stall for longer than the default
// 50 ms, which would turn a busy but healthy Redis into degraded
// decisions.
const redisTimeout = 500 * time.Millisecond

// limiterSpec is the family of the per-tenant limiters and its settings.
// The zero value is the sliding window.
type limiterSpec struct {
	Family string         // familyWindow ("" too), familyBucket or familyHybrid
	Burst  int            // bucket capacity; 0 means each tenant's rate Count
	Bursts map[string]int // per-tenant capacities (-rates), over Burst
	// Partner is the -partner limit, stacked on every tenant's with
	// throttle.All (nil: none). Every limiter of the run shares it.
	Partner throttle.Limiter
	// Meters gets the hybrids' own metrics (bucket.WithMeterProvider):
	// the provider of -metrics. Nil means the global one.
	Meters metric.MeterProvider
	// Timeout is each Redis limiter's per-call timeout (-redis-timeout);
	// 0 means redisTimeout.
	Timeout time.Duration
}

// timeout returns the Redis limiters' per-call timeout.
func (s limiterSpec) timeout() time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return redisTimeout
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

// burstFor returns the capacity of tenant's bucket at rate r: its own
// (-rates), or burstOf(r).
func (s limiterSpec) burstFor(tenant string, r throttle.Rate) int {
	if b, ok := s.Bursts[tenant]; ok {
		return b
	}
	return s.burstOf(r)
}

// costNote warns, before the run, of the jobs whose cost is beyond what
// their tenant's limiter can ever admit (a window's count, a bucket's
// burst) at its rate (rateOf): the throttle terminates them, and the run
// reports them lost. It returns "" when there are none.
func (s limiterSpec) costNote(jf jobsFile, rateOf func(tenant string) throttle.Rate) string {
	var over []string
	for _, j := range jf.Jobs {
		r := rateOf(j.Tenant)
		most := r.Count
		if s.bucketed() {
			most = s.burstFor(j.Tenant, r)
		}
		if j.Cost > most {
			over = append(over, fmt.Sprintf("%s (cost %d, %s admits at most %d)", j.ID, j.Cost, j.Tenant, most))
		}
	}
	if len(over) == 0 {
		return ""
	}
	return fmt.Sprintf("note: %s can never be admitted, and the throttle will terminate it (reported lost): %s\n",
		plural(len(over), "job"), sample(over))
}

// boundFor is bound for tenant, with its own burst.
func (s limiterSpec) boundFor(tenant string, r throttle.Rate) (int, string) {
	if b, ok := s.Bursts[tenant]; ok {
		s.Burst = b
	}
	return s.bound(r)
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

// newFamilyLimiter returns the limiter of spec for every tenant: rate r
// and burst spec.burstOf(r) for tenants without a quota, and each
// tenant's quota from quotas (bucket.WithQuotas, window.WithQuotas), as a
// user with per-tenant limits writes it. It is in process when rc is nil,
// otherwise on Redis with keys under prefix; hybrids need rc to honour
// context deadlines (ContextTimeoutEnabled).
func newFamilyLimiter(spec limiterSpec, rc *redis.Client, prefix string, r throttle.Rate, quotas throttle.QuotaFunc) (*recordingLimiter, error) {
	var (
		l   throttle.Limiter
		h   *bucket.Hybrid
		err error
	)
	switch {
	case spec.Family == familyHybrid:
		if rc == nil {
			return nil, errors.New("-limiter hybrid needs -redis URL")
		}
		h, err = bucket.NewHybrid(rc, r, spec.burstOf(r), bucket.WithPrefix(prefix), bucket.WithTimeout(spec.timeout()), bucket.WithMeterProvider(spec.Meters), bucket.WithQuotas(quotas))
		l = h
	case spec.Family == familyBucket && rc == nil:
		l, err = bucket.NewLocal(r, spec.burstOf(r), bucket.WithQuotas(quotas))
	case spec.Family == familyBucket:
		l, err = bucket.NewRedis(rc, r, spec.burstOf(r), bucket.WithPrefix(prefix), bucket.WithTimeout(spec.timeout()), bucket.WithQuotas(quotas))
	case rc == nil:
		l, err = window.NewMemory(r, window.WithQuotas(quotas))
	default:
		l, err = window.NewRedis(rc, r, window.WithPrefix(prefix), window.WithTimeout(spec.timeout()), window.WithQuotas(quotas))
	}
	if err != nil {
		return nil, err
	}
	if spec.Partner != nil {
		l, err = throttle.All(throttle.Part{Limiter: l}, throttle.Part{Limiter: spec.Partner, Key: func(string) string { return partnerKey }})
		if err != nil {
			return nil, err
		}
	}
	return &recordingLimiter{l: l, rate: r, hybrid: h}, nil
}

// recordingLimiter is the run's limiter, which tells the recorder of every
// admission and rejection (the report checks them). It is safe for
// concurrent use.
type recordingLimiter struct {
	l      throttle.Limiter
	rate   throttle.Rate
	hybrid *bucket.Hybrid // the limiter, with -limiter hybrid

	// admitted, if set, is called for every admission with the clock read
	// just before and just after the limiter decided: the instant the
	// limiter counted the admission lies between the two. id is the
	// admission's identity ("" without one): an id admitted again while
	// its first admission is still in the window is not charged again.
	admitted func(key, id string, n int, before, after time.Time)
	// rejected, if set, is called for every rejection by id, with whether
	// it reserved the id's slot (Decision.Reserved).
	rejected func(id string, reserved bool)
	// refunded, if set, is called when a refund gave back what id held
	// (a call the partner answered 429, through the consumers' Backoff):
	// its admission no longer counts, and the next is charged again.
	refunded func(key, id string)

	longest atomic.Int64 // ns: the longest decision (see timed)
}

// timed records a decision that began at start, and returns its end.
func (l *recordingLimiter) timed(start time.Time) time.Time {
	end := time.Now()
	for took, old := int64(end.Sub(start)), l.longest.Load(); took > old && !l.longest.CompareAndSwap(old, took); old = l.longest.Load() {
	}
	return end
}

// longestDecision returns the longest decision so far: with a Redis
// limiter, at most its timeout plus one round trip.
func (l *recordingLimiter) longestDecision() time.Duration { return time.Duration(l.longest.Load()) }

// AllowN asks the limiter.
func (l *recordingLimiter) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	before := time.Now()
	d, err := l.l.AllowN(ctx, key, n)
	after := l.timed(before)
	if err == nil && d.Allowed && l.admitted != nil {
		l.admitted(key, "", n, before, after)
	}
	return d, err
}

// AllowID asks the limiter by id when it has ids (throttle.IDLimiter: the
// windows and the Local and Redis buckets), else AllowN: the hybrid makes
// no reservations.
func (l *recordingLimiter) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	ids, ok := l.l.(throttle.IDLimiter)
	if !ok {
		return l.AllowN(ctx, key, n)
	}
	before := time.Now()
	d, err := ids.AllowID(ctx, key, n, id, horizon)
	after := l.timed(before)
	if err == nil && d.Allowed && l.admitted != nil {
		l.admitted(key, id, n, before, after)
	}
	if err == nil && !d.Allowed && l.rejected != nil {
		l.rejected(id, d.Reserved)
	}
	return d, err
}

// Pause pauses key in the limiter (a partner's 429, through the
// consumers' Backoff): with -partner, the partner's key too.
func (l *recordingLimiter) Pause(ctx context.Context, key string, d time.Duration) error {
	p, ok := l.l.(throttle.Pauser)
	if !ok {
		return fmt.Errorf("%w: %T", throttle.ErrCannotPause, l.l)
	}
	return p.Pause(ctx, key, d)
}

// Refund gives back what id holds for key (throttle.Refunder: the
// consumers' Backoff releases the refused call's admission, so that the
// message is charged again when it comes back); a limiter that cannot
// refund holds on to it.
func (l *recordingLimiter) Refund(ctx context.Context, key string, n int, id string) (bool, error) {
	r, ok := l.l.(throttle.Refunder)
	if !ok {
		return false, nil
	}
	held, err := r.Refund(ctx, key, n, id)
	if held && l.refunded != nil {
		l.refunded(key, id)
	}
	return held, err
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
func (l *recordingLimiter) Rate() throttle.Rate { return l.rate }

// Algorithm returns the algorithm of the limiter.
func (l *recordingLimiter) Algorithm() string {
	if a, ok := l.l.(throttle.Algorithmer); ok {
		return a.Algorithm()
	}
	return "sliding_window_log"
}

// hybridStats returns the hybrid's decision counts, and false if the
// limiter is not a hybrid.
func (l *recordingLimiter) hybridStats() (bucket.HybridStats, bool) {
	if l.hybrid == nil {
		return bucket.HybridStats{}, false
	}
	return l.hybrid.Stats(), true
}

// close closes a hybrid, returning its unused leased tokens to Redis.
func (l *recordingLimiter) close(ctx context.Context) error {
	if l.hybrid == nil {
		return nil
	}
	return l.hybrid.Close(ctx)
}
