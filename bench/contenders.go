package main

import (
	"context"
	"crypto/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	"github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"golang.org/x/time/rate"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// allowFunc decides one request of cost 1 for key.
type allowFunc func(ctx context.Context, key string) (bool, error)

// limits is the configuration of one family of limiters. The throughput
// runs use limits that admit every call (the expensive path of every
// algorithm); the accuracy runs 100 per second.
type limits struct {
	window int           // sliding and fixed windows: admissions per per
	per    time.Duration // window length
	rate   throttle.Rate // token buckets and GCRA: refill
	burst  int
}

var (
	// throughputLimits admit every call. Windows: 10^9 per 1 s. Buckets:
	// a burst of 10^7 (never spent in one measurement) refilled at 1 per
	// minute, so that no bucket is full again between two visits: with a
	// fast refill each of 10,000 keys would be full again before its next
	// visit, and a Local forgets full buckets, which would measure
	// re-creating state instead of deciding.
	throughputLimits = limits{window: 1_000_000_000, per: time.Second, rate: throttle.PerMinute(1), burst: 10_000_000}
	accuracyLimits   = limits{window: 100, per: time.Second, rate: throttle.PerSecond(100), burst: 100}
)

// contender is one limiter in the comparison. make returns a fresh limiter
// on c.
type contender struct {
	name  string
	redis bool // Redis-backed: its ratio to PING is meaningful
	kind  string
	// coalesces says whether concurrent decisions share Redis calls, and
	// how ("" for in-process limiters).
	coalesces string
	// roundTrip: every decision is at least one Redis round trip, so the
	// sequential cases time it call by call (see timeInterleaved).
	roundTrip bool
	make      func(c *redis.Client, l limits) (*instance, error)
}

// instance is one limiter made by a contender.
type instance struct {
	allow allowFunc
	close func() // nil: nothing to release
	// redisCalls, if set, returns how many decisions so far needed a Redis
	// call, and how many were made in all.
	redisCalls func() (redis, all int64)
}

func (i *instance) release() {
	if i.close != nil {
		i.close()
	}
}

func plain(a allowFunc) (*instance, error) { return &instance{allow: a}, nil }

const (
	kindNone   = "-"
	kindWindow = "sliding window"
	kindBucket = "token bucket"
	kindGCRA   = "GCRA"
	kindFixed  = "fixed window"
)

var (
	cPing = contender{name: "Redis PING (floor)", redis: true, roundTrip: true, kind: kindNone, coalesces: "no",
		make: func(c *redis.Client, _ limits) (*instance, error) {
			return plain(func(ctx context.Context, _ string) (bool, error) {
				return true, c.Ping(ctx).Err()
			})
		}}
	cWindow = contender{name: "window.Redis (ours)", redis: true, roundTrip: true, kind: kindWindow, coalesces: "yes: per key, one script call for every request queued behind a call in flight (pipelined across keys)",
		make: func(c *redis.Client, l limits) (*instance, error) {
			w, err := window.NewRedis(c, throttle.Rate{Count: l.window, Per: l.per}, window.WithPrefix("bench:w:"))
			if err != nil {
				return nil, err
			}
			return plain(decide(w))
		}}
	cBucket = contender{name: "bucket.Redis (ours)", redis: true, roundTrip: true, kind: kindBucket, coalesces: "yes: as window.Redis",
		make: func(c *redis.Client, l limits) (*instance, error) {
			// A long timeout: a loaded 2-core machine can stall one call
			// beyond the default 50 ms; the per-call deadline is paid anyway.
			b, err := bucket.NewRedis(c, l.rate, l.burst,
				bucket.WithPrefix("bench:b:"), bucket.WithTimeout(5*time.Second))
			if err != nil {
				return nil, err
			}
			return plain(decide(b))
		}}
	cHybrid = contender{name: "bucket.Hybrid (ours)", redis: true, kind: kindBucket, coalesces: "yes: local decisions on leased tokens; its lease calls go through bucket.Redis",
		make: func(c *redis.Client, l limits) (*instance, error) {
			h, err := bucket.NewHybrid(c, l.rate, l.burst,
				bucket.WithPrefix("bench:h:"), bucket.WithTimeout(time.Second), bucket.WithMaxKeys(1<<15))
			if err != nil {
				return nil, err
			}
			return &instance{
				allow: decide(h),
				close: func() { _ = h.Close(context.Background()) },
				redisCalls: func() (int64, int64) {
					st := h.Stats()
					return st.Redis, st.Local + st.Redis + st.Degraded
				},
			}, nil
		}}
	cPipeline = contender{name: "pipeline window (MULTI)", redis: true, roundTrip: true, kind: kindWindow, coalesces: "no",
		make: func(c *redis.Client, l limits) (*instance, error) {
			p := &pipelineWindow{client: c, count: int64(l.window), per: l.per, prefix: "bench:p:", id: rand.Text() + ":"}
			return plain(p.allow)
		}}
	cRedisRate = contender{name: "go-redis/redis_rate", redis: true, roundTrip: true, kind: kindGCRA, coalesces: "no",
		make: func(c *redis.Client, l limits) (*instance, error) {
			rl := redis_rate.NewLimiter(c)
			lim := redis_rate.Limit{Rate: l.rate.Count, Burst: l.burst, Period: l.rate.Per}
			return plain(func(ctx context.Context, key string) (bool, error) {
				res, err := rl.Allow(ctx, key, lim)
				if err != nil {
					return false, err
				}
				return res.Allowed > 0, nil
			})
		}}
	cUlule = contender{name: "ulule/limiter (redis)", redis: true, roundTrip: true, kind: kindFixed, coalesces: "no",
		make: func(c *redis.Client, l limits) (*instance, error) {
			st, err := ulredis.NewStoreWithOptions(c, limiter.StoreOptions{Prefix: "bench:u", MaxRetry: limiter.DefaultMaxRetry})
			if err != nil {
				return nil, err
			}
			lim := limiter.New(st, limiter.Rate{Period: l.per, Limit: int64(l.window)})
			return plain(func(ctx context.Context, key string) (bool, error) {
				lc, err := lim.Get(ctx, key)
				if err != nil {
					return false, err
				}
				return !lc.Reached, nil
			})
		}}
	cThrottled = contender{name: "throttled (redis, GCRA)", redis: true, roundTrip: true, kind: kindGCRA, coalesces: "no",
		make: func(c *redis.Client, l limits) (*instance, error) {
			st, err := goredisstore.NewCtx(c, "bench:t:")
			if err != nil {
				return nil, err
			}
			// MaxBurst b admits b+1 at once: b = burst-1 matches the others.
			g, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{
				MaxRate: throttled.PerDuration(l.rate.Count, l.rate.Per), MaxBurst: l.burst - 1})
			if err != nil {
				return nil, err
			}
			return plain(func(ctx context.Context, key string) (bool, error) {
				limited, _, err := g.RateLimitCtx(ctx, key, 1)
				return !limited && err == nil, err
			})
		}}
	cXRate = contender{name: "x/time/rate (sync.Map of keys)", kind: kindBucket,
		make: func(_ *redis.Client, l limits) (*instance, error) {
			var m sync.Map
			return plain(func(_ context.Context, key string) (bool, error) {
				v, ok := m.Load(key)
				if !ok {
					v, _ = m.LoadOrStore(key, rate.NewLimiter(rate.Limit(perSecond(l.rate)), l.burst))
				}
				return v.(*rate.Limiter).Allow(), nil
			})
		}}
	cMutex = contender{name: "mutex bucket (local floor)", kind: kindBucket,
		make: func(_ *redis.Client, l limits) (*instance, error) {
			b := &mutexBucket{m: make(map[string]*tokens), perNs: perSecond(l.rate) / 1e9, burst: float64(l.burst)}
			return plain(b.allow)
		}}
	cLocal = contender{name: "bucket.Local (ours)", kind: kindBucket,
		make: func(_ *redis.Client, l limits) (*instance, error) {
			b, err := bucket.NewLocal(l.rate, l.burst)
			if err != nil {
				return nil, err
			}
			return plain(decide(b))
		}}
	cMemory = contender{name: "window.Memory (ours)", kind: kindWindow,
		make: func(_ *redis.Client, l limits) (*instance, error) {
			w, err := window.NewMemory(throttle.Rate{Count: l.window, Per: l.per})
			if err != nil {
				return nil, err
			}
			return plain(decide(w))
		}}
)

// cWindowAuto is window.Redis on go-redis's AutoPipeliner, which pipelines
// concurrent commands of any kind: it saves round trips, not Redis's
// per-script work, and is measured to see which wins.
var cWindowAuto = contender{name: "window.Redis on go-redis AutoPipeliner", redis: true, roundTrip: true, kind: kindWindow,
	coalesces: "yes, and go-redis pipelines the script calls of every goroutine (v9.23 AutoPipeline, experimental)",
	make: func(c *redis.Client, l limits) (*instance, error) {
		ap, err := c.AutoPipeline()
		if err != nil {
			return nil, err
		}
		w, err := window.NewRedis(ap, throttle.Rate{Count: l.window, Per: l.per}, window.WithPrefix("bench:wa:"))
		if err != nil {
			_ = ap.Close()
			return nil, err
		}
		return &instance{allow: decide(w), close: func() { _ = ap.Close() }}, nil
	}}

// throughputContenders are measured in every round, in a rotating order.
var throughputContenders = []contender{
	cPing, cWindow, cWindowAuto, cBucket, cHybrid, cPipeline, cRedisRate, cUlule, cThrottled,
	cMutex, cXRate, cLocal, cMemory,
}

// accuracyContenders are the Redis-backed limiters.
var accuracyContenders = []contender{
	cWindow, cPipeline, cBucket, cHybrid, cRedisRate, cThrottled, cUlule,
}

func decide(l throttle.Limiter) allowFunc {
	return func(ctx context.Context, key string) (bool, error) {
		d, err := l.AllowN(ctx, key, 1)
		return d.Allowed, err
	}
}

// pipelineWindow is the sliding-window design the Lua script replaces
// (as in window/bench_test.go): MULTI of ZREMRANGEBYSCORE, ZCARD, ZADD,
// PEXPIRE with millisecond scores from the client clock, and a ZREM of the
// new member when the count was already full.
type pipelineWindow struct {
	client *redis.Client
	count  int64
	per    time.Duration
	prefix string
	id     string // random per instance, so members never collide
	seq    atomic.Uint64
}

func (p *pipelineWindow) allow(ctx context.Context, key string) (bool, error) {
	k := p.prefix + key
	now := time.Now().UnixMilli()
	member := p.id + strconv.FormatUint(p.seq.Add(1), 36)
	var card *redis.IntCmd
	_, err := p.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZRemRangeByScore(ctx, k, "-inf", strconv.FormatInt(now-p.per.Milliseconds(), 10))
		card = pipe.ZCard(ctx, k)
		pipe.ZAdd(ctx, k, redis.Z{Score: float64(now), Member: member})
		pipe.PExpire(ctx, k, p.per)
		return nil
	})
	if err != nil {
		return false, err
	}
	if card.Val() >= p.count {
		return false, p.client.ZRem(ctx, k, member).Err()
	}
	return true, nil
}

// mutexBucket is the plainest keyed token bucket: one mutex over a map.
type mutexBucket struct {
	mu    sync.Mutex
	m     map[string]*tokens
	perNs float64
	burst float64
}

type tokens struct {
	n    float64
	last int64
}

func (b *mutexBucket) allow(_ context.Context, key string) (bool, error) {
	now := time.Now().UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.m[key]
	if t == nil {
		t = &tokens{n: b.burst, last: now}
		b.m[key] = t
	}
	if now > t.last {
		t.n = min(b.burst, t.n+float64(now-t.last)*b.perNs)
		t.last = now
	}
	if t.n < 1 {
		return false, nil
	}
	t.n--
	return true, nil
}

// perSecond returns r in tokens per second.
func perSecond(r throttle.Rate) float64 { return float64(r.Count) / r.Per.Seconds() }
