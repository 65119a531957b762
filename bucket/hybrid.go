package bucket

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// hybridAlgorithm is the throttle.algorithm attribute of a Hybrid.
const hybridAlgorithm = "token_bucket_hybrid"

// hybridScopeName is the instrumentation scope of a Hybrid's meter.
const hybridScopeName = "github.com/queuethrottle/queuethrottle/bucket"

// Names of the instruments a Hybrid records, through the meter provider of
// WithMeterProvider (default the global one).
const (
	// HybridDecisionsMetric counts a Hybrid's decisions, labelled by
	// throttle.source ("local", "redis" or "degraded") and throttle.outcome
	// ("admitted" or "rejected"). Unit: {decision}.
	HybridDecisionsMetric = "throttle.hybrid.decisions"
	// HybridRedisDurationMetric is the latency of a Hybrid's Redis calls in
	// seconds, labelled by HybridOpAttr, whether they succeeded or not.
	HybridRedisDurationMetric = "throttle.hybrid.redis.duration"
	// HybridRedisErrorsMetric counts a Hybrid's failed Redis calls (errors
	// and timeouts, not calls the open circuit breaker refused), labelled by
	// HybridOpAttr. Unit: {error}.
	HybridRedisErrorsMetric = "throttle.hybrid.redis.errors"
	// HybridBreakerTransitionsMetric counts the state changes of a Hybrid's
	// circuit breaker, labelled by HybridBreakerFromAttr and
	// HybridBreakerToAttr. Unit: {transition}.
	HybridBreakerTransitionsMetric = "throttle.hybrid.breaker.transitions"
)

// Attributes of a Hybrid's metrics, besides throttle.SourceAttr and
// throttle.OutcomeAttr.
const (
	// HybridOpAttr is the Redis operation: "lease" (take tokens) or
	// "give_back" (return unused tokens).
	HybridOpAttr = attribute.Key("throttle.hybrid.op")
	// HybridBreakerFromAttr and HybridBreakerToAttr are the circuit breaker
	// states of a transition: "closed", "half-open" or "open".
	HybridBreakerFromAttr = attribute.Key("throttle.hybrid.breaker.from")
	HybridBreakerToAttr   = attribute.Key("throttle.hybrid.breaker.to")
)

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
// A Hybrid is safe for concurrent use. Its per-key state is bounded by
// WithMaxKeys (default 10000) and kept in LRU caches (hashicorp/golang-lru's
// simplelru). Close stops its background work and returns unused tokens;
// a Hybrid that is not closed keeps a background goroutine. The zero Hybrid
// is not usable; call NewHybrid.
type Hybrid struct {
	redis    *Redis
	rate     throttle.Rate
	burst    int
	perSec   float64 // refill, tokens per second
	perNs    float64 // refill, tokens per nanosecond
	nsPer    float64 // nanoseconds per token
	leaseCap int
	timeout  time.Duration
	clock    throttle.Clock
	share    *Local // nil without WithLocalShare
	shareMax int    // the share bucket's burst

	// Redis health: one circuit breaker, or with a *redis.ClusterClient
	// one per master, found by the key's slot.
	health  *health                  // the only one; with cluster, for slots whose master is unknown
	cluster *redis.ClusterClient     // nil unless the client is one
	slots   []atomic.Pointer[health] // with cluster: by slot, the health of its master when last called
	nodes   sync.Map                 // with cluster: master address -> *health

	seed   maphash.Seed
	mask   uint64
	shards []hybridShard

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

// Redis operations, indexes of durationOpts and errorOpts.
const (
	opLease = iota
	opGiveBack
)

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

// health is the state of one Redis server as the Hybrid sees it.
type health struct {
	node string // the cluster master's address; "" without a cluster
	cb   *gobreaker.CircuitBreaker[grant]
	down atomic.Bool // a Redis call failed and none has succeeded since
}

// hybridKey is one key's local state, guarded by its shard's lock.
type hybridKey struct {
	key   string
	shard *hybridShard
	slot  int // the Redis Cluster slot of its Redis key, with a cluster

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

// leaseCall is a lease call in flight for a key. done is closed when it
// ends; err is its error, set before.
type leaseCall struct {
	done chan struct{}
	err  error
}

// callerDone marks an error caused by the caller's context ending (or the
// Hybrid closing), which says nothing about Redis' health.
type callerDone struct{ err error }

func (e *callerDone) Error() string { return e.err.Error() }
func (e *callerDone) Unwrap() error { return e.err }

func isCallerDone(err error) bool {
	var cd *callerDone
	return errors.As(err, &cd)
}

// NewHybrid returns a Hybrid over the Redis bucket that NewRedis(c, r,
// burst, opts...) would return: Count tokens per Per refill it, up to
// burst (>= 1). Redis keys, the clock and the per-call timeout are the
// Redis bucket's (WithPrefix, WithClock, WithTimeout).
//
// The client must honour context deadlines, or the timeout cannot bound a
// call to a hung server: create it with ContextTimeoutEnabled: true (in
// redis.Options, redis.ClusterOptions or redis.RingOptions); go-redis
// ignores context deadlines otherwise. NewHybrid checks this for
// *redis.Client, *redis.ClusterClient and *redis.Ring, and accepts one
// without it only if its ReadTimeout and WriteTimeout are both > 0 and no
// longer than the timeout. Other Scripter implementations are the caller's
// responsibility.
//
// Options: those of NewRedis, plus WithLocalShare (the degraded mode, see
// Hybrid), WithLogger, WithMeterProvider and WithMaxKeys. Errors wrap
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
	if err := checkContextTimeout(c, cfg.timeout); err != nil {
		return nil, err
	}
	h := &Hybrid{
		redis:   rb,
		rate:    r,
		burst:   burst,
		perSec:  float64(r.Count) / r.Per.Seconds(),
		perNs:   float64(r.Count) / float64(r.Per),
		nsPer:   float64(r.Per) / float64(r.Count),
		clock:   cfg.clock,
		timeout: cfg.timeout,
		seed:    maphash.MakeSeed(),
		stop:    make(chan struct{}),
		log:     hc.logger,
	}
	if h.clock == nil {
		h.clock = throttle.SystemClock
	}
	h.leaseCap = max(1, burst/4)
	if cfg.localShare.set {
		inst := cfg.localShare.instances
		h.leaseCap = max(1, min(h.leaseCap, burst/(2*inst)))
		sr, sb := shareRate(r, inst, cfg.localShare.safety)
		var lopts []Option
		if cfg.clock != nil {
			lopts = append(lopts, WithClock(cfg.clock))
		}
		if h.share, err = NewLocal(sr, sb, lopts...); err != nil {
			return nil, fmt.Errorf("bucket: hybrid: local share: %w", err)
		}
		h.shareMax = sb
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

// newHealth returns the health of the Redis server (cluster master) at
// node, with its own circuit breaker.
func (h *Hybrid) newHealth(node string) *health {
	hl := &health{node: node}
	hl.cb = gobreaker.NewCircuitBreaker[grant](gobreaker.Settings{
		Name:        "bucket.hybrid",
		MaxRequests: 1,
		Timeout:     breakerOpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= breakerTrip },
		IsExcluded:  isCallerDone,
		// A reply about one request proves Redis is up.
		IsSuccessful: func(err error) bool { return err == nil || isRequestError(err) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			h.breakerChanged(hl, from, to)
		},
	})
	return hl
}

// healthAt returns the health of the master of slot as last seen, or the
// Hybrid's only one.
func (h *Hybrid) healthAt(slot int) *health {
	if h.slots != nil {
		if hl := h.slots[slot].Load(); hl != nil {
			return hl
		}
	}
	return h.health
}

// resolve returns the health of the Redis server that holds key: with a
// cluster, that of the master go-redis routes key's slot to now (or, if
// the client cannot tell, the one last seen).
func (h *Hybrid) resolve(ctx context.Context, key string) *health {
	if h.cluster == nil {
		return h.health
	}
	rk := rediskey.Key(h.redis.prefix, key)
	slot := rediskey.Slot(rk)
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	m, err := h.cluster.MasterForKey(ctx, rk)
	if err != nil {
		return h.healthAt(slot)
	}
	addr := m.Options().Addr
	v, ok := h.nodes.Load(addr)
	if !ok {
		v, _ = h.nodes.LoadOrStore(addr, h.newHealth(addr))
	}
	hl := v.(*health)
	if h.slots[slot].Load() != hl {
		h.slots[slot].Store(hl)
	}
	return hl
}

// shareRate returns the degraded bucket of WithLocalShare: Count/instances
// × safety tokens per Per, as a Rate and burst. A share below one token
// becomes one token per Per/share.
func shareRate(r throttle.Rate, instances int, safety float64) (throttle.Rate, int) {
	share := float64(r.Count) * safety / float64(instances)
	if share >= 1 {
		n := int(share)
		return throttle.Rate{Count: n, Per: r.Per}, n
	}
	per := math.Ceil(float64(r.Per) / share)
	if per >= math.MaxInt64 {
		return throttle.Rate{Count: 1, Per: math.MaxInt64}, 1
	}
	return throttle.Rate{Count: 1, Per: time.Duration(per)}, 1
}

// checkContextTimeout refuses a go-redis client whose calls the context
// deadline cannot bound (see NewHybrid).
func checkContextTimeout(c redis.Scripter, timeout time.Duration) error {
	var enabled bool
	var rt, wt time.Duration
	switch cl := c.(type) {
	case *redis.Client:
		o := cl.Options()
		enabled, rt, wt = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	case *redis.ClusterClient:
		o := cl.Options()
		enabled, rt, wt = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	case *redis.Ring:
		o := cl.Options()
		enabled, rt, wt = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	default:
		return nil
	}
	if enabled || (rt > 0 && rt <= timeout && wt > 0 && wt <= timeout) {
		return nil
	}
	return &throttle.OptionError{Field: "client", Reason: fmt.Sprintf(
		"the go-redis client must be created with ContextTimeoutEnabled: true (or Read/WriteTimeout <= %v) so that the per-call timeout bounds Redis calls", timeout)}
}

func (h *Hybrid) initMetrics(mp metric.MeterProvider) error {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(hybridScopeName, metric.WithInstrumentationVersion(throttle.Version))
	var err error
	if h.decisions, err = meter.Int64Counter(HybridDecisionsMetric,
		metric.WithUnit("{decision}"),
		metric.WithDescription("Hybrid token bucket decisions by source (local, redis, degraded) and outcome.")); err != nil {
		return err
	}
	if h.redisDuration, err = meter.Float64Histogram(HybridRedisDurationMetric,
		metric.WithUnit("s"),
		metric.WithDescription("Latency of the hybrid token bucket's Redis calls."),
		metric.WithExplicitBucketBoundaries(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)); err != nil {
		return err
	}
	if h.redisErrors, err = meter.Int64Counter(HybridRedisErrorsMetric,
		metric.WithUnit("{error}"),
		metric.WithDescription("Failed Redis calls (errors and timeouts) of the hybrid token bucket.")); err != nil {
		return err
	}
	if h.breakerChanges, err = meter.Int64Counter(HybridBreakerTransitionsMetric,
		metric.WithUnit("{transition}"),
		metric.WithDescription("State changes of the hybrid token bucket's circuit breaker.")); err != nil {
		return err
	}
	for allowed, outcome := range []string{"rejected", "admitted"} {
		for s := throttle.SourceUnknown; s <= throttle.SourceDegraded; s++ {
			set := attribute.NewSet(throttle.OutcomeAttr.String(outcome), throttle.SourceAttr.String(s.String()))
			h.decisionOpts[allowed][s] = []metric.AddOption{metric.WithAttributeSet(set)}
		}
	}
	for op, name := range []string{"lease", "give_back"} {
		set := attribute.NewSet(HybridOpAttr.String(name))
		h.durationOpts[op] = []metric.RecordOption{metric.WithAttributeSet(set)}
		h.errorOpts[op] = []metric.AddOption{metric.WithAttributeSet(set)}
	}
	return nil
}

// Rate returns the refill rate.
func (h *Hybrid) Rate() throttle.Rate { return h.rate }

// Burst returns the capacity of the Redis bucket, in tokens.
func (h *Hybrid) Burst() int { return h.burst }

// Algorithm returns "token_bucket_hybrid".
func (h *Hybrid) Algorithm() string { return hybridAlgorithm }

// HybridStats counts a Hybrid's decisions since it was created.
type HybridStats struct {
	Local    int64 // decided from the local stock or the local view of Redis, without a call
	Redis    int64 // decided by (or after waiting for) a Redis call
	Degraded int64 // decided by the local share while Redis was unreachable
	Errors   int64 // AllowN returned a store error (Redis unreachable, no local share)
}

// Stats returns the decision counts so far. Decisions without a Redis
// round trip are Local, the share of them at steady state is
// Local/(Local+Redis).
func (h *Hybrid) Stats() HybridStats {
	st := HybridStats{Degraded: h.degradedN.Load(), Errors: h.errorsN.Load()}
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		st.Local += s.local
		st.Redis += s.redis
		s.mu.Unlock()
	}
	return st
}

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
// Errors: one wrapping throttle.ErrInvalidCost for n < 1 or n > burst,
// before any other work; one wrapping ErrHybridClosed after Close; one
// wrapping ctx's error if ctx ends first; otherwise, only without
// WithLocalShare, one wrapping the Redis error or gobreaker.ErrOpenState,
// meaning the limiter could not decide.
func (h *Hybrid) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	if n < 1 || n > h.burst {
		return throttle.Decision{}, throttle.CheckCost(n, h.burst)
	}
	if h.closed.Load() {
		return throttle.Decision{}, ErrHybridClosed
	}
	now := h.clock.Now()
	s, e := h.lock(key)
	e.observe(now, n)
	if !h.healthAt(e.slot).down.Load() {
		if e.stock > 0 && e.oldest(now) {
			if k := e.dropOld(now); k > 0 {
				h.giveBackAsync(e.key, k)
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

// lock returns key's shard, locked, and its state, created if needed.
func (h *Hybrid) lock(key string) (*hybridShard, *hybridKey) {
	hash := maphash.String(h.seed, key)
	s := &h.shards[hash&h.mask]
	s.mu.Lock()
	if e := s.last; e != nil && s.lastKey == key {
		return s, e
	}
	e, ok := s.lru.Get(key)
	if !ok {
		key = strings.Clone(key)
		e = &hybridKey{key: key, shard: s, hashJitter: float64(hash>>11) / (1 << 53)}
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
	return h.lock(e.key)
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
		h.giveBackAsync(e.key, k)
	}
}

// newWatermark returns the stock, as a fraction of the demand over
// leaseHorizon, at which a refresh starts: between 0.25 and 0.55, from the
// key's hash and a random number.
func (h *Hybrid) newWatermark(e *hybridKey) float64 {
	j := e.hashJitter + rand.Float64()/2
	j -= math.Floor(j)
	return 0.25 + 0.3*j
}

// observe counts a request of cost n into the demand estimate.
func (e *hybridKey) observe(now time.Time, n int) {
	e.lastUse = now
	e.demand += n
	if e.winStart.IsZero() {
		e.winStart = now
		return
	}
	el := now.Sub(e.winStart)
	if el < rateWindow && (e.rate != 0 || el < rateWindow/5) {
		return // the first estimate comes after a fifth of the window
	}
	inst := float64(e.demand) / el.Seconds()
	if e.rate == 0 {
		e.rate = inst
	} else {
		e.rate = (e.rate + inst) / 2
	}
	e.demand = 0
	e.winStart = now
}

// target is the stock a lease tops up to: the demand over leaseHorizon,
// between 1 and leaseCap.
func (h *Hybrid) target(e *hybridKey) int {
	t := math.Ceil(e.rate * leaseHorizon.Seconds())
	if t >= float64(h.leaseCap) {
		return h.leaseCap
	}
	return max(1, int(t))
}

// take spends n tokens of the stock, the older ones first.
func (e *hybridKey) take(n int) {
	e.stock -= n
	e.fresh = min(e.fresh, e.stock)
}

// add puts n leased tokens into the stock at now.
func (e *hybridKey) add(n int, now time.Time) {
	if n <= 0 {
		return
	}
	if e.stock == e.fresh { // no older tokens: the fresh ones become them
		e.oldAt = e.freshAt
	}
	e.fresh, e.freshAt = n, now
	e.stock += n
}

// oldest reports whether some of the stock is older than maxHold.
func (e *hybridKey) oldest(now time.Time) bool {
	at := e.freshAt
	if e.stock > e.fresh {
		at = e.oldAt
	}
	return now.Sub(at) > maxHold
}

// dropOld removes the tokens older than maxHold from the stock and
// returns how many.
func (e *hybridKey) dropOld(now time.Time) int {
	k := 0
	if e.stock > e.fresh && now.Sub(e.oldAt) > maxHold {
		k = e.stock - e.fresh
		e.stock = e.fresh
	}
	if e.fresh > 0 && now.Sub(e.freshAt) > maxHold {
		k += e.fresh
		e.stock, e.fresh = 0, 0
	}
	return k
}

// redisEstimate is how many tokens the Redis bucket holds at most at now,
// from the last reply and the refill since (others may have taken some).
func (h *Hybrid) redisEstimate(e *hybridKey, now time.Time) float64 {
	if e.redisAt.IsZero() {
		return float64(h.burst)
	}
	t := e.redisTokens + h.perNs*float64(now.Sub(e.redisAt))
	return min(t, float64(h.burst))
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
	return max(throttle.CeilMillisecond(h.refillTime(missing)), time.Millisecond)
}

// refillTime is how long the bucket takes to refill tokens (> 0).
func (h *Hybrid) refillTime(tokens float64) time.Duration {
	d := math.Ceil(tokens * h.nsPer)
	if d >= math.MaxInt64 {
		return throttle.Never
	}
	return time.Duration(d)
}

// batch is how many tokens Redis should hold before a lease of at least
// need is worth a call: need, or up to the target lease if the refill over
// leaseHorizon brings that many.
func (h *Hybrid) batch(e *hybridKey, need int) float64 {
	b := min(float64(h.target(e)), math.Floor(h.perSec*leaseHorizon.Seconds()))
	return max(float64(need), b)
}

// decision builds a Decision from the local view of key: the stock plus
// what Redis holds at most.
func (h *Hybrid) decision(e *hybridKey, now time.Time, n int, allowed bool, retry time.Duration) throttle.Decision {
	est := max(h.redisEstimate(e, now), 0)
	have := float64(e.stock) + est
	d := throttle.Decision{
		Allowed:    allowed,
		Limit:      h.rate.Count,
		Remaining:  min(h.burst, e.stock+int(est)),
		RetryAfter: retry,
		Source:     throttle.SourceLocal,
	}
	if !allowed {
		d.Remaining = min(d.Remaining, n-1)
	}
	if missing := float64(h.burst) - have; missing > 0 {
		d.ResetAfter = throttle.CeilMillisecond(h.refillTime(missing))
	}
	return d
}

// maybeRefresh starts a background lease for e, under its shard's lock,
// if the stock is at the watermark, none is in flight and Redis may have
// tokens.
func (h *Hybrid) maybeRefresh(e *hybridKey, now time.Time) {
	if e.call != nil || e.rate == 0 || float64(e.stock) > e.rate*leaseHorizon.Seconds()*e.watermark {
		return
	}
	want := h.target(e) - e.stock
	if want < 1 || h.redisEstimate(e, now) < h.batch(e, 1) || !h.track() {
		return
	}
	c := &leaseCall{done: make(chan struct{})}
	e.call = c
	e.watermark = h.newWatermark(e)
	go h.refresh(e, c, want)
}

// refresh is the background lease of maybeRefresh.
func (h *Hybrid) refresh(e *hybridKey, c *leaseCall, want int) {
	defer h.wg.Done()
	g, err := h.lease(h.bgCtx, e.key, 1, want)
	now := h.clock.Now()
	s := e.shard
	s.mu.Lock()
	e.call, c.err = nil, err
	close(c.done)
	if err == nil {
		if e.evicted {
			s.mu.Unlock()
			if g.granted > 0 {
				_ = h.giveBack(h.bgCtx, e.key, g.granted)
			}
			return
		}
		h.applyGrant(e, now, g)
	}
	s.mu.Unlock()
}

// applyGrant records a lease reply.
func (h *Hybrid) applyGrant(e *hybridKey, now time.Time, g grant) {
	e.add(g.granted, now)
	e.redisTokens, e.redisAt = g.remaining, now
}

// viaRedis decides with a Redis call, shared with any in flight for the
// key. It is entered with s locked and leaves it unlocked.
func (h *Hybrid) viaRedis(ctx context.Context, s *hybridShard, e *hybridKey, n int) (throttle.Decision, error) {
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
			if !h.healthAt(e.slot).down.Load() {
				now := h.clock.Now()
				if e.stock >= n {
					e.take(n)
					return h.redisDecision(ctx, s, e, now, n, true, 0), nil
				}
				if wait := h.emptyWait(e, now, n-e.stock); wait > 0 {
					return h.redisDecision(ctx, s, e, now, n, false, wait), nil
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
		g, err := h.lease(ctx, e.key, need, want)
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
		if e.evicted { // dropped meanwhile: return the tokens and retry
			s.mu.Unlock()
			if g.granted > 0 {
				h.giveBackAsync(e.key, g.granted)
			}
			s, e = h.relock(e)
			continue
		}
		h.applyGrant(e, now, g)
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

// fallback decides when Redis could not: with the local share, or by
// returning the error.
func (h *Hybrid) fallback(ctx context.Context, key string, n int, err error) (throttle.Decision, error) {
	if h.share == nil {
		h.errorsN.Add(1)
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: redis unavailable: %w", err)
	}
	if n > h.shareMax {
		h.errorsN.Add(1)
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: redis unavailable and n=%d exceeds the local share of %d: %w", n, h.shareMax, err)
	}
	d, derr := h.share.AllowN(ctx, key, n)
	if derr != nil {
		h.errorsN.Add(1)
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: local share: %w (redis unavailable: %w)", derr, err)
	}
	d.Limit = h.rate.Count
	d.Source = throttle.SourceDegraded
	h.degradedN.Add(1)
	a := 0
	if d.Allowed {
		a = 1
	}
	h.decisions.Add(ctx, 1, h.decisionOpts[a][throttle.SourceDegraded]...)
	return d, nil
}

// lease calls Redis' lease through the breaker and records it.
func (h *Hybrid) lease(ctx context.Context, key string, least, most int) (grant, error) {
	return h.call(ctx, opLease, key, func(ctx context.Context) (grant, error) { return h.redis.lease(ctx, key, least, most) })
}

// giveBack calls Redis' giveBack through the breaker and records it.
func (h *Hybrid) giveBack(ctx context.Context, key string, n int) error {
	_, err := h.call(ctx, opGiveBack, key, func(ctx context.Context) (grant, error) { return grant{}, h.redis.giveBack(ctx, key, n) })
	return err
}

// call runs one Redis call through the breaker: it bounds it by the
// timeout, marks errors caused by ctx (not counted against Redis), records
// latency and errors, and keeps the down flag of key's Redis server.
func (h *Hybrid) call(ctx context.Context, op int, key string, f func(context.Context) (grant, error)) (grant, error) {
	hl := h.resolve(ctx, key)
	var start time.Time
	ran := false
	g, err := hl.cb.Execute(func() (grant, error) {
		ran, start = true, time.Now()
		g, err := h.bounded(ctx, op, key, f)
		if err != nil && ctx.Err() != nil {
			err = &callerDone{err}
		}
		return g, err
	})
	if ran {
		h.redisDuration.Record(ctx, time.Since(start).Seconds(), h.durationOpts[op]...)
	}
	switch {
	case err == nil || isRequestError(err):
		if hl.down.Load() {
			hl.down.Store(false)
		}
		if err != nil {
			h.redisErrors.Add(ctx, 1, h.errorOpts[op]...)
		}
	case isCallerDone(err):
	default:
		if ran {
			h.redisErrors.Add(ctx, 1, h.errorOpts[op]...)
		}
		if !hl.down.Load() {
			hl.down.Store(true)
		}
	}
	return g, err
}

// unavailable are the prefixes of Redis error replies that say the server
// cannot serve requests now, rather than that a request was wrong.
var unavailable = []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM", "NOREPLICAS", "MISCONF"}

// isRequestError reports whether err is an error reply from a server that
// is up, about this request only (such as WRONGTYPE on a key that some
// other program wrote): it opens no breaker and puts no other key in the
// degraded mode.
func isRequestError(err error) bool {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range unavailable {
		if strings.HasPrefix(msg, p) {
			return false
		}
	}
	return true
}

// callResult is the outcome of a Redis call run by bounded.
type callResult struct {
	g   grant
	err error
}

// Outcomes of a bounded call, settled once.
const (
	callPending int32 = iota
	callAbandoned
	callDone
)

// bounded runs f with a deadline of the timeout and returns when f does or
// when the deadline passes, whichever is first: the client's own handling
// of the deadline (go-redis adds a millisecond or two, and sometimes far
// more while it replaces a connection) never delays a decision. An
// abandoned call finishes in the background; tokens it leased after all
// are given back. After Close has begun, f runs inline.
func (h *Hybrid) bounded(ctx context.Context, op int, key string, f func(context.Context) (grant, error)) (grant, error) {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	if !h.track() {
		return f(ctx)
	}
	var state atomic.Int32
	ch := make(chan callResult, 1)
	go func() {
		defer h.wg.Done()
		g, err := f(ctx)
		if state.CompareAndSwap(callPending, callDone) {
			ch <- callResult{g, err}
			return
		}
		if op == opLease && err == nil && g.granted > 0 {
			_ = h.redis.giveBack(h.bgCtx, key, g.granted)
		}
	}()
	select {
	case r := <-ch:
		return r.g, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(callPending, callAbandoned) {
			return grant{}, fmt.Errorf("bucket: hybrid: redis: %w", ctx.Err())
		}
		r := <-ch
		return r.g, r.err
	}
}

// breakerChanged is the OnStateChange callback of hl's breaker.
func (h *Hybrid) breakerChanged(hl *health, from, to gobreaker.State) {
	if to != gobreaker.StateClosed {
		hl.down.Store(true)
	}
	h.breakerChanges.Add(context.Background(), 1, metric.WithAttributes(
		HybridBreakerFromAttr.String(from.String()), HybridBreakerToAttr.String(to.String())))
	if h.log != nil {
		level := slog.LevelInfo
		if to == gobreaker.StateOpen {
			level = slog.LevelWarn
		}
		attrs := []slog.Attr{slog.String("from", from.String()), slog.String("to", to.String()),
			slog.String("algorithm", hybridAlgorithm), slog.String("rate", h.rate.String())}
		if hl.node != "" {
			attrs = append(attrs, slog.String("node", hl.node))
		}
		h.log.LogAttrs(context.Background(), level, "bucket: hybrid: circuit breaker "+to.String(), attrs...)
	}
}

// track registers background work with Close; it reports false once Close
// has begun.
func (h *Hybrid) track() bool {
	h.life.RLock()
	defer h.life.RUnlock()
	if h.closed.Load() {
		return false
	}
	h.wg.Add(1)
	return true
}

// giveBackAsync returns n tokens of key in the background. After Close has
// begun they are dropped instead: the bucket then under-admits, never
// over-admits.
func (h *Hybrid) giveBackAsync(key string, n int) {
	if !h.track() {
		return
	}
	go func() {
		defer h.wg.Done()
		if err := h.giveBack(h.bgCtx, key, n); err != nil && h.log != nil && !isCallerDone(err) {
			h.log.LogAttrs(context.Background(), slog.LevelDebug, "bucket: hybrid: returning unused tokens failed",
				slog.Int("tokens", n), slog.Any("error", err))
		}
	}()
}

// janitor drops idle keys (returning their stock) until Close.
func (h *Hybrid) janitor() {
	defer h.wg.Done()
	t := time.NewTicker(janitorEvery)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			now := h.clock.Now()
			for i := range h.shards {
				h.dropIdle(&h.shards[i], now)
			}
		}
	}
}

// dropIdle drops the keys of s unused for maxHold, least recent first.
func (h *Hybrid) dropIdle(s *hybridShard, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		_, e, ok := s.lru.GetOldest()
		if !ok || e.call != nil || now.Sub(e.lastUse) <= maxHold {
			return
		}
		s.lru.RemoveOldest() // calls h.evicted
	}
}

// Close stops the Hybrid's background work, waits for its Redis calls in
// flight and returns every unused leased token to Redis. It waits until
// ctx ends at most for the calls in flight (then abandons background ones,
// each bounded by the timeout anyway) and stops returning tokens when ctx
// ends. Tokens it cannot return are lost for this period: the limit is
// under-used, never exceeded. Close is safe to call more than once; later
// calls return nil at once. After Close, AllowN returns an error wrapping
// ErrHybridClosed.
//
// The error, if any, says how many keys' tokens could not be returned and
// wraps the first such error (a Redis error, gobreaker.ErrOpenState or
// ctx's error).
func (h *Hybrid) Close(ctx context.Context) error {
	h.life.Lock() // no wg.Add after this
	already := h.closed.Swap(true)
	h.life.Unlock()
	if already {
		return nil
	}
	close(h.stop)
	defer h.bgCancel()
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		h.bgCancel()
		<-done
	}
	type unused struct {
		key string
		n   int
	}
	var all []unused
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for _, e := range s.lru.Values() {
			if e.stock > 0 {
				all = append(all, unused{e.key, e.stock})
				e.stock, e.fresh = 0, 0
			}
		}
		s.mu.Unlock()
	}
	var first error
	failed := 0
	for _, u := range all {
		err := ctx.Err()
		if err == nil {
			err = h.giveBack(ctx, u.key, u.n)
		}
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if first != nil {
		return fmt.Errorf("bucket: hybrid: close: could not return unused tokens of %d keys: %w", failed, first)
	}
	return nil
}
