package bucket

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// hybridAlgorithm is the throttle.algorithm attribute of a Hybrid.
const hybridAlgorithm = "token_bucket_hybrid"

// ErrHybridClosed is wrapped by the error AllowN returns after Close. It
// wraps throttle.ErrClosed, so a throttle.Gate rejects such requests
// whatever its failure policy.
var ErrHybridClosed = fmt.Errorf("bucket: hybrid is closed: %w", throttle.ErrClosed)

// Tuning of the Hybrid. The lease horizon and the hold time bound how far
// local admissions lag behind the Redis bucket's takes.
const (
	// leaseHorizon is how much of a key's observed demand a lease covers.
	leaseHorizon = 150 * time.Millisecond
	// rateWindow is the period over which demand is counted before it
	// updates a key's rate estimate.
	rateWindow = 50 * time.Millisecond
	// maxHold is how long leased tokens may wait for use. Older ones are
	// returned, and keys idle that long are dropped (returning theirs).
	maxHold = 500 * time.Millisecond
	// janitorEvery is how often idle keys are looked for.
	janitorEvery = 250 * time.Millisecond
	// breakerTrip consecutive failed Redis calls open the breaker.
	breakerTrip = 3
	// breakerOpenFor is how long the breaker stays open before it lets one
	// probe through (half-open).
	breakerOpenFor = 500 * time.Millisecond
	// hybridShards is the most shards a Hybrid splits its keys over.
	hybridShards = 16
)

// Hybrid is a token bucket per key whose truth is a Redis bucket (see
// NewRedis) but which decides most requests in process, without a network
// call.
//
// Leases. Each key's local state holds a stock of tokens leased from the
// Redis bucket: taken from it atomically, in one script call, so that they
// are no longer available to anyone else. A request that the stock covers
// is admitted locally (Source throttle.SourceLocal). The lease size follows
// the key's observed demand (about 150 ms of it) and is capped at a
// quarter of the burst, and at burst/(2 × instances) with WithLocalShare,
// so that instances sharing one bucket cannot starve each other. When the
// stock falls to a low watermark, one background call per key (never more
// at once) tops it up; the watermark is jittered per key, from a hash of
// the key with a per-process seed, and per refresh, from a random number,
// so that replicas do not refresh together. Tokens held longer than 500 ms
// are returned to Redis, as are those of keys idle that long, of keys
// dropped because more than WithMaxKeys are in use, and, by Close, all the
// rest. Returning tokens does not move the bucket's refill timeline and
// never fills it beyond the burst.
//
// Misses. A request the stock cannot cover makes one synchronous lease
// call (Source throttle.SourceRedis), shared with any call already in
// flight for the key: it is admitted if Redis had the missing tokens and
// otherwise rejected with Redis' retry-after. The reply says how many
// tokens Redis has left, and further requests are rejected locally,
// without a call, until the refill since could cover them; while demand
// exceeds the refill, until it brings a batch (up to 150 ms of refill), so
// that one call serves many admissions instead of one. This delays
// admissions by at most 150 ms and never admits more.
//
// Guarantee. Tokens are only ever spent after Redis handed them out, so N
// Hybrids sharing a Redis bucket together admit no more tokens than the
// Redis bucket alone would. As a token may be held for up to 500 ms before
// it is spent, the admissions in a span T are at most what Redis handed
// out in T plus the 500 ms before it: burst + (T + 500 ms) × rate in the
// worst case, burst + T × rate when the stock is spent as it comes (under
// sustained demand).
//
// Failures. Every Redis call has a context deadline of the timeout
// (WithTimeout, default 50 ms), and the Hybrid stops waiting for it then
// even if the client takes longer to give up (go-redis may take a few
// milliseconds more, or far more while it replaces a connection; such a
// call finishes in the background and any tokens it leased after all are
// given back). Calls go through a circuit breaker
// (github.com/sony/gobreaker/v2) that opens after 3 consecutive failures
// (errors, timeouts, and replies such as LOADING or READONLY that say
// Redis cannot serve) and, 500 ms later, lets one probe through; a success
// closes it. Breaker state changes are counted and logged. An error reply
// about one request (such as WRONGTYPE, on a key another program wrote)
// fails that request like a failure would, but counts as a success for the
// breaker. With a *redis.ClusterClient there is one breaker per master
// (the one go-redis routes the key's slot to), so a failed master
// degrades only the keys it holds; any other client has one breaker for
// all keys. From the first failure of a key's Redis until a call to it
// succeeds again, the key's stock is not used (it is kept, and used or
// returned once Redis is back), and:
//
//   - with WithLocalShare(instances, safety), requests are decided by a
//     local token bucket per key of Count/instances × safety tokens that
//     refills that many per Per (fractional shares refill one token per
//     correspondingly longer period); over any span T it admits at most
//     share × (1 + T/Per). These decisions have Source
//     throttle.SourceDegraded.
//   - without it, AllowN returns the error (wrapping the Redis error, or
//     gobreaker.ErrOpenState while the breaker is open), and the
//     throttle.Gate's failure policy decides.
//
// Callers keep probing Redis through the breaker, so normal decisions
// resume at most about 500 ms plus one call after Redis is back.
//
// Observability: see HybridDecisionsMetric and the other Hybrid*Metric
// constants; breaker state changes are logged with WithLogger. Stats
// reports decision counts by source.
//
// Ids. A Hybrid does not implement throttle.IDLimiter (AllowID), as Local
// and Redis do: it decides most requests locally, on leased tokens, with
// no per-request record in Redis, so it can neither reserve a slot for an
// id nor know that an id was admitted by another process. A throttle.Gate
// over a Hybrid falls back to AllowN: its rejections bounce, back to the
// broker with the RetryAfter and the consumer's jitter, instead of
// reserving.
//
// Pauses. Pause records a pause in this process (kept apart from the
// per-key state, so no eviction forgets it) and in Redis beside the key's
// bucket, where every lease is refused until it ends. A Hybrid learns of a
// pause made by another process from its next lease call on the key (the
// refused lease carries the time left) and from then on rejects locally,
// with that RetryAfter and no further call, returning its stock. Until
// then it may still spend the stock it holds: tokens leased before the
// pause, at most one lease (a quarter of the burst, or burst/(2 ×
// instances) with WithLocalShare) and for at most 500 ms after their lease
// (held tokens older than that go back to Redis and the next request
// calls it). So a pause made elsewhere holds in every Hybrid at most 500 ms
// plus one call timeout after it was recorded, and no Hybrid admits more
// than its stock meanwhile. While Redis is unreachable, only the pauses
// this process knows of hold.
//
// A Hybrid is safe for concurrent use. Its per-key state is bounded by
// WithMaxKeys (default 10000) and kept in LRU caches (hashicorp/golang-lru's
// simplelru). Close stops its background work and returns unused tokens;
// a Hybrid that is not closed keeps a background goroutine. The zero Hybrid
// is not usable; call NewHybrid.
type Hybrid struct {
	redis     *Redis // its quotas (WithQuotas) are the Hybrid's
	rate      throttle.Rate
	burst     int
	instances int // WithLocalShare's; 0 without it
	timeout   time.Duration
	clock     throttle.Clock
	share     *Local // nil without WithLocalShare; with WithQuotas, each key's share of its quota

	// Redis health: one circuit breaker, or with a *redis.ClusterClient
	// one per master, found by the key's slot.
	health  *health                  // the only one; with cluster, for slots whose master is unknown
	cluster *redis.ClusterClient     // nil unless the client is one
	slots   []atomic.Pointer[health] // with cluster: by slot, the health of its master when last called
	nodes   sync.Map                 // with cluster: master address -> *health

	seed   maphash.Seed
	mask   uint64
	shards []hybridShard
	pauses pause.Set // Pause, and pauses learned from lease replies

	closed   atomic.Bool
	life     sync.RWMutex // orders wg.Add (under RLock) before Close's Wait
	wg       sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc
	stop     chan struct{}

	degradedN atomic.Int64
	errorsN   atomic.Int64

	log            *slog.Logger
	decisions      metric.Int64Counter
	redisDuration  metric.Float64Histogram
	redisErrors    metric.Int64Counter
	breakerChanges metric.Int64Counter
	decisionOpts   [2][throttle.SourceDegraded + 1][]metric.AddOption
	durationOpts   [2][]metric.RecordOption
	errorOpts      [2][]metric.AddOption
}

type hybridShard struct {
	mu  sync.Mutex
	lru *simplelru.LRU[string, *hybridKey]
	// last is the most recently used key's state, also the front of lru:
	// deciding again for it needs no lookup and no LRU update.
	lastKey string
	last    *hybridKey
	// decisions by source, for Stats
	local, redis int64
	_            [8]byte
}

// hybridKey is one key's local state, guarded by its shard's lock.
type hybridKey struct {
	key   string
	shard *hybridShard
	slot  int        // the Redis Cluster slot of its Redis key, with a cluster
	lim   *keyLimits // its quota's (see WithQuotas), as of its last decision

	// stock is the leased tokens held; the newest fresh of them came from
	// the last lease at freshAt, the others (spent first) at oldAt.
	stock, fresh   int
	freshAt, oldAt time.Time
	redisTokens    float64   // tokens left in Redis at the last reply
	redisAt        time.Time // when that reply came; zero: no reply yet
	demand         int       // tokens asked for since winStart
	winStart       time.Time
	rate           float64 // demand estimate, tokens per second
	lastUse        time.Time
	hashJitter     float64 // in [0, 1), from the key's hash
	watermark      float64 // fraction of a lease that triggers a refresh
	call           *leaseCall
	evicted        bool
}

// NewHybrid returns a Hybrid over the Redis bucket that NewRedis(c, r,
// burst, opts...) would return: Count tokens per Per refill it, up to
// burst (>= 1). Redis keys, the clock and the per-call timeout are the
// Redis bucket's (WithPrefix, WithClock, WithTimeout).
//
// The client must honour context deadlines, or the timeout cannot bound a
// call to a hung server: create it with ContextTimeoutEnabled: true (in
// redis.Options, redis.ClusterOptions or redis.RingOptions); go-redis
// ignores context deadlines otherwise. NewHybrid (like NewRedis) checks this for
// *redis.Client, *redis.ClusterClient and *redis.Ring, and accepts one
// without it only if its ReadTimeout and WriteTimeout are both > 0 and no
// longer than the timeout. Other Scripter implementations are the caller's
// responsibility.
//
// Options: those of NewRedis (WithQuotas included: the Hybrid decides
// each key on its quota, see quota.go's WithQuotas), plus WithLocalShare
// (the degraded mode, see Hybrid; with quotas, each key's share is of its
// quota), WithLogger, WithMeterProvider and WithMaxKeys. Errors wrap
// throttle.ErrInvalidOption and name the field at fault.
func NewHybrid(c redis.Scripter, r throttle.Rate, burst int, opts ...Option) (*Hybrid, error) {
	rb, err := NewRedis(c, r, burst, opts...)
	if err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	hc, err := newHybridConfig(opts)
	if err != nil {
		return nil, err
	}
	h := &Hybrid{
		redis:   rb,
		rate:    r,
		burst:   burst,
		clock:   cfg.clock,
		timeout: cfg.timeout,
		seed:    maphash.MakeSeed(),
		stop:    make(chan struct{}),
		log:     hc.logger,
	}
	if h.clock == nil {
		h.clock = throttle.SystemClock
	}
	if cfg.localShare.set {
		inst, safety := cfg.localShare.instances, cfg.localShare.safety
		h.instances = inst
		sr, sb := shareRate(r, inst, safety)
		var lopts []Option
		if cfg.clock != nil {
			lopts = append(lopts, WithClock(cfg.clock))
		}
		if cfg.quotas != nil {
			lopts = append(lopts, WithQuotas(shareQuotas(cfg.quotas, inst, safety)))
		}
		if h.share, err = NewLocal(sr, sb, lopts...); err != nil {
			return nil, fmt.Errorf("bucket: hybrid: local share: %w", err)
		}
	}
	if err := h.initMetrics(hc.meterProvider); err != nil {
		return nil, err
	}
	n := min(hybridShards, 1<<(bits.Len(uint(hc.maxKeys))-1))
	h.mask = uint64(n - 1)
	h.shards = make([]hybridShard, n)
	for i := range h.shards {
		s := &h.shards[i]
		s.lru, err = simplelru.NewLRU(hc.maxKeys/n, func(_ string, e *hybridKey) { h.evicted(s, e) })
		if err != nil {
			return nil, fmt.Errorf("bucket: hybrid: %w", err)
		}
	}
	h.health = h.newHealth("")
	if cc, ok := c.(*redis.ClusterClient); ok {
		h.cluster = cc
		h.slots = make([]atomic.Pointer[health], rediskey.Slots)
	}
	h.bgCtx, h.bgCancel = context.WithCancel(context.Background())
	h.wg.Add(1)
	go h.janitor()
	return h, nil
}

// Rate returns the refill rate.
func (h *Hybrid) Rate() throttle.Rate { return h.rate }

// Burst returns the capacity of the Redis bucket, in tokens.
func (h *Hybrid) Burst() int { return h.burst }

// Algorithm returns "token_bucket_hybrid".
func (h *Hybrid) Algorithm() string { return hybridAlgorithm }

// Allow is AllowN(ctx, key, 1).
func (h *Hybrid) Allow(ctx context.Context, key string) (throttle.Decision, error) {
	return h.AllowN(ctx, key, 1)
}

// AllowN admits a request of cost n for key if n tokens can be spent: from
// the local stock (Source throttle.SourceLocal) or, when it falls short,
// leased from Redis in one call (Source throttle.SourceRedis). Otherwise it
// rejects, spending nothing, with RetryAfter the time until the Redis
// bucket's refill covers what is missing, rounded up to the millisecond;
// the rejection is local when the last Redis reply already shows the
// bucket cannot cover it yet. Remaining and ResetAfter are estimates from
// the local stock and the last reply. See Hybrid for the degraded mode.
//
// With WithQuotas, rate, burst and Limit are the key's quota's.
//
// Errors: one wrapping throttle.ErrInvalidCost for n < 1 or n > burst,
// and (WithQuotas) one wrapping throttle.ErrInvalidOption for an invalid
// quota, before any other work; one wrapping ErrHybridClosed after Close;
// one wrapping ctx's error if ctx ends first; otherwise, only without
// WithLocalShare, one wrapping the Redis error or gobreaker.ErrOpenState,
// meaning the limiter could not decide.
func (h *Hybrid) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	lim, err := h.redis.lims.of(key)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	if n < 1 || n > lim.p.burst {
		return throttle.Decision{}, throttle.CheckCost(n, lim.p.burst)
	}
	if h.closed.Load() {
		return throttle.Decision{}, ErrHybridClosed
	}
	now := h.clock.Now()
	s, e := h.lock(key, lim)
	if left := h.pauses.Left(key, now.UnixMicro()); left > 0 {
		return h.pausedDecision(ctx, s, e, now, n, left), nil
	}
	e.observe(now, n)
	if !h.healthAt(e.slot).down.Load() {
		if e.stock > 0 && e.oldest(now) {
			if k := e.dropOld(now); k > 0 {
				h.giveBackAsync(e.key, e.lim, k)
			}
		}
		if e.stock >= n {
			e.take(n)
			h.maybeRefresh(e, now)
			d := h.decision(e, now, n, true, 0)
			s.local++
			s.mu.Unlock()
			h.decisions.Add(ctx, 1, h.decisionOpts[1][throttle.SourceLocal]...)
			return d, nil
		}
		if wait := h.emptyWait(e, now, n-e.stock); wait > 0 {
			d := h.decision(e, now, n, false, wait)
			s.local++
			s.mu.Unlock()
			h.decisions.Add(ctx, 1, h.decisionOpts[0][throttle.SourceLocal]...)
			return d, nil
		}
	}
	return h.viaRedis(ctx, s, e, n)
}

// lock returns key's shard, locked, and its state, created if needed,
// under lim, the key's limits now (see requota).
func (h *Hybrid) lock(key string, lim *keyLimits) (*hybridShard, *hybridKey) {
	hash := maphash.String(h.seed, key)
	s := &h.shards[hash&h.mask]
	s.mu.Lock()
	if e := s.last; e != nil && s.lastKey == key {
		if e.lim.quota != lim.quota {
			h.requota(e, lim)
		}
		return s, e
	}
	e, ok := s.lru.Get(key)
	if ok && e.lim.quota != lim.quota {
		h.requota(e, lim)
	}
	if !ok {
		key = strings.Clone(key)
		e = &hybridKey{key: key, shard: s, lim: lim, hashJitter: float64(hash>>11) / (1 << 53)}
		if h.cluster != nil {
			e.slot = rediskey.Slot(rediskey.Key(h.redis.prefix, key))
		}
		e.watermark = h.newWatermark(e)
		s.lru.Add(key, e)
	}
	s.lastKey, s.last = e.key, e
	return s, e
}

// relock locks e's shard again after a wait. If e was dropped meanwhile,
// it returns the key's current state instead.
func (h *Hybrid) relock(e *hybridKey) (*hybridShard, *hybridKey) {
	return h.lock(e.key, e.lim)
}

// evicted is the LRU's eviction callback, called under s.mu: it marks e
// dropped and returns its stock.
func (h *Hybrid) evicted(s *hybridShard, e *hybridKey) {
	e.evicted = true
	if s.last == e {
		s.lastKey, s.last = "", nil
	}
	if k := e.stock; k > 0 {
		e.stock, e.fresh = 0, 0
		h.giveBackAsync(e.key, e.lim, k)
	}
}

// redisEstimate is how many tokens the Redis bucket holds at most at now,
// from the last reply and the refill since (others may have taken some).
func (h *Hybrid) redisEstimate(e *hybridKey, now time.Time) float64 {
	burst := float64(e.lim.p.burst)
	if e.redisAt.IsZero() {
		return burst
	}
	t := e.redisTokens + e.lim.perNs*float64(now.Sub(e.redisAt))
	return min(t, burst)
}

// emptyWait returns 0 if a call to Redis for need tokens is worth making
// at now, or else how long until it is, rounded up to the millisecond:
// until the refill since the last reply could cover need, and, while
// demand exceeds the refill, a batch of up to leaseHorizon's refill.
// Waiting for a batch delays an admission by at most leaseHorizon and
// takes nothing from anyone; it turns one round trip per refilled token
// into one per batch.
func (h *Hybrid) emptyWait(e *hybridKey, now time.Time, need int) time.Duration {
	missing := h.batch(e, need) - h.redisEstimate(e, now)
	if missing <= 0 {
		return 0
	}
	return max(throttle.CeilMillisecond(refillTime(e.lim, missing)), time.Millisecond)
}

// refillTime is how long a bucket of lim takes to refill tokens (> 0).
func refillTime(lim *keyLimits, tokens float64) time.Duration {
	d := math.Ceil(tokens * lim.nsPer)
	if d >= math.MaxInt64 {
		return throttle.Never
	}
	return time.Duration(d)
}

// batch is how many tokens Redis should hold before a lease of at least
// need is worth a call: need, or up to the target lease if the refill over
// leaseHorizon brings that many.
func (h *Hybrid) batch(e *hybridKey, need int) float64 {
	b := min(float64(h.target(e)), math.Floor(e.lim.perSec*leaseHorizon.Seconds()))
	return max(float64(need), b)
}

// decision builds a Decision from the local view of key: the stock plus
// what Redis holds at most.
func (h *Hybrid) decision(e *hybridKey, now time.Time, n int, allowed bool, retry time.Duration) throttle.Decision {
	est := max(h.redisEstimate(e, now), 0)
	have := float64(e.stock) + est
	d := throttle.Decision{
		Allowed:    allowed,
		Limit:      e.lim.limit,
		Remaining:  min(e.lim.p.burst, e.stock+int(est)),
		RetryAfter: retry,
		Source:     throttle.SourceLocal,
	}
	if !allowed {
		d.Remaining = min(d.Remaining, n-1)
	}
	if missing := float64(e.lim.p.burst) - have; missing > 0 {
		d.ResetAfter = throttle.CeilMillisecond(refillTime(e.lim, missing))
	}
	return d
}

// viaRedis decides with a Redis call, shared with any in flight for the
// key. It is entered with s locked and leaves it unlocked.
func (h *Hybrid) viaRedis(ctx context.Context, s *hybridShard, e *hybridKey, n int) (throttle.Decision, error) {
	// A caller that found a call in flight waits for it; if others took
	// what it brought, it may wait for the next, but only within the
	// timeout: then it is rejected until the refill could serve it, so
	// no decision waits on a line of calls (one waited 8 s under a slow
	// Redis, 16 goroutines on one key).
	giveUp := time.Now().Add(h.timeout)
	for {
		if c := e.call; c != nil {
			s.mu.Unlock()
			select {
			case <-c.done:
			case <-ctx.Done():
				return throttle.Decision{}, fmt.Errorf("bucket: hybrid: %w", ctx.Err())
			}
			if c.err != nil && !isCallerDone(c.err) {
				return h.fallback(ctx, e.key, n, c.err)
			}
			s, e = h.relock(e)
			now := h.clock.Now()
			if left := h.pauses.Left(e.key, now.UnixMicro()); left > 0 {
				return h.pausedDecision(ctx, s, e, now, n, left), nil
			}
			if !h.healthAt(e.slot).down.Load() {
				if e.stock >= n {
					e.take(n)
					return h.redisDecision(ctx, s, e, now, n, true, 0), nil
				}
				if wait := h.emptyWait(e, now, n-e.stock); wait > 0 {
					return h.redisDecision(ctx, s, e, now, n, false, wait), nil
				}
				if time.Now().After(giveUp) {
					wait := refillTime(e.lim, float64(n-e.stock))
					return h.redisDecision(ctx, s, e, now, n, false, max(throttle.CeilMillisecond(wait), time.Millisecond)), nil
				}
			}
			continue
		}
		if !h.track() {
			s.mu.Unlock()
			return throttle.Decision{}, ErrHybridClosed
		}
		// While Redis is down the stock is not used, but this call is
		// also the probe that ends that: it always asks for a token.
		need := max(1, n-e.stock)
		want := max(need, h.target(e)-e.stock)
		c := &leaseCall{done: make(chan struct{})}
		e.call = c
		s.mu.Unlock()
		g, err := h.lease(ctx, e.key, e.lim, need, want)
		now := h.clock.Now()
		s.mu.Lock()
		e.call, c.err = nil, err
		close(c.done)
		h.wg.Done()
		if err != nil {
			s.mu.Unlock()
			if isCallerDone(err) {
				return throttle.Decision{}, fmt.Errorf("bucket: hybrid: %w", err)
			}
			return h.fallback(ctx, e.key, n, err)
		}
		if e.evicted || e.lim.quota != g.lim.quota { // dropped or requota'd meanwhile: return the tokens and retry
			s.mu.Unlock()
			if g.granted > 0 {
				h.giveBackAsync(e.key, g.lim, g.granted)
			}
			s, e = h.relock(e)
			continue
		}
		h.applyGrant(e, now, g)
		if g.paused > 0 {
			return pause.Decision(h.redisDecision(ctx, s, e, now, n, false, g.retryAfter), g.paused), nil
		}
		if e.stock >= n {
			e.take(n)
			return h.redisDecision(ctx, s, e, now, n, true, 0), nil
		}
		retry := g.retryAfter
		if retry <= 0 { // others spent the stock meanwhile
			retry = h.emptyWait(e, now, n-e.stock)
		}
		return h.redisDecision(ctx, s, e, now, n, false, max(retry, time.Millisecond)), nil
	}
}

// redisDecision builds and counts a Decision of Source SourceRedis and
// unlocks s.
func (h *Hybrid) redisDecision(ctx context.Context, s *hybridShard, e *hybridKey, now time.Time, n int, allowed bool, retry time.Duration) throttle.Decision {
	d := h.decision(e, now, n, allowed, retry)
	d.Source = throttle.SourceRedis
	s.redis++
	s.mu.Unlock()
	a := 0
	if allowed {
		a = 1
	}
	h.decisions.Add(ctx, 1, h.decisionOpts[a][throttle.SourceRedis]...)
	return d
}
