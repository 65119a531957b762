package bucket

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/coalesce"
	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/janitor"
	"github.com/queuethrottle/queuethrottle/internal/lost"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/redisclock"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/internal/redisscript"
	"github.com/queuethrottle/queuethrottle/throttle"
)

var (
	// convertLua is the prelude of the scripts that read a bucket (see
	// convert.lua).
	//go:embed convert.lua
	convertLua string
	//go:embed bucket.lua
	bucketLua string
	//go:embed bucket_head.lua
	bucketHeadLua string
	//go:embed giveback.lua
	giveBackLua string

	// giveBackScript runs with EVALSHA, and is reloaded with EVAL on NOSCRIPT.
	giveBackScript = redis.NewScript(convertLua + giveBackLua)
)

// Redis is a token bucket per key kept in Redis, shared by every process
// that uses the same Redis and prefix: tokens refill at Count per Per up to
// burst, and a request of cost n is admitted if n tokens are there. Each
// decision is one Lua script (one round trip) that refills the key's
// bucket from the elapsed time, and takes the tokens only if enough are
// there. A rejection writes nothing: it neither takes tokens nor moves the
// refill timeline, so a client retrying faster than the refill is still
// admitted at the refill rate. AllowID adds reservations, which take
// tokens ahead of time, and idempotent ids, in a second script (see
// AllowID).
//
// State is one string per key of 25 bytes (a version byte, then credit,
// ts and per as little-endian doubles; see convert.lua), holding the
// bucket's credit at ts in exact integers (a token is worth Per in µs,
// each µs adds Count), written with its expiry by one SET PX. The key
// expires when the bucket would be full again;
// a missing key reads full. By default time is the Redis server's TIME at
// microsecond precision, so every process shares one clock. With WithClock
// the client sends its own time in µs; either way a clock that moves
// backwards counts as no time passing and stored time never moves
// backwards. The key also holds the period its credit is counted in
// (per), so a key decided under another Rate.Per (a quota, or a new
// Rate under the same prefix) keeps its whole tokens (see WithQuotas).
//
// Every call has a deadline of WithTimeout (default 50 ms), as a context
// deadline. go-redis ignores context deadlines unless the client is built
// with ContextTimeoutEnabled: true (in redis.Options, redis.ClusterOptions
// or redis.UniversalOptions): set it, or a hung Redis blocks a decision
// for the client's ReadTimeout (default 5 s).
//
// A Redis is safe for concurrent use by any number of goroutines and
// processes. It holds no per-key state in the process. The zero Redis is
// not usable; call NewRedis.
type Redis struct {
	client  redis.Scripter
	rate    throttle.Rate
	lims    *quotaSet // the limiter's own and WithQuotas'
	prefix  string
	clock   throttle.Clock    // nil: Redis TIME
	server  *redisclock.Clock // WithServerClock: clock is it; nil otherwise
	timeout time.Duration
	rt      *deadline.RoundTrip

	argInt []any // argInt[i] = strconv.Itoa(i), for small i

	batch *coalesce.Batcher[takeReq, taken]
	// calls sends a flush: one bucket.lua call for every key on a
	// *redis.Client, one per hash slot on a *redis.ClusterClient, one per
	// key on a *redis.Ring or any other client and with WithOneKeyPerCall,
	// and the next of these once a server refused keys of several slots in
	// one call (see redisscript.Grouped).
	calls *redisscript.Grouped[[]*takeCall]

	held lost.Held // until when buckets this process took from are not full: to tell a lost one
}

// maxArgInt bounds the precomputed small-integer arguments.
const maxArgInt = 64

// NewRedis returns a token bucket per key kept in c (a *redis.Client,
// *redis.ClusterClient or *redis.Ring), refilling r.Count tokens per r.Per
// up to burst (>= 1), starting full.
//
// Options: WithClock (default: the Redis server's TIME), WithPrefix
// (default "throttle:bucket:"), WithTimeout (default 50 ms), WithQuotas;
// WithLocalShare is accepted and ignored. Errors wrap throttle.ErrInvalidOption and name
// the field: a nil c, Rate.Count < 1 or above 2^53/1000, Rate.Per <= 0,
// burst < 1 (or burst × Per beyond 2^53 µs), a bad option; and "client"
// for a *redis.Client, *redis.ClusterClient or *redis.Ring created without
// ContextTimeoutEnabled: true whose ReadTimeout and WriteTimeout are not
// both within WithTimeout (go-redis would then ignore the context deadline
// that bounds each call; NewHybrid has the same rule).
//
// On a *redis.Client, NewRedis opens the two connections that coalesced
// decisions use at once and loads the script on them, waiting at most 3
// timeouts (at most 1 s) and failing on nothing, as window.NewRedis does:
// a connection opened inside a decision would count its dial and
// handshake against the decision's timeout.
func NewRedis(c redis.Scripter, r throttle.Rate, burst int, opts ...Option) (*Redis, error) {
	if rediskey.NilClient(c) {
		return nil, &throttle.OptionError{Field: "client", Reason: "must not be nil"}
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	lims, err := newQuotaSet(r, burst, cfg.quotas)
	if err != nil {
		return nil, err
	}
	if err := redisopt.CheckContextTimeout(c, cfg.timeout); err != nil {
		return nil, err
	}
	l := &Redis{
		client:  c,
		rate:    r,
		lims:    lims,
		prefix:  cfg.prefix,
		clock:   cfg.clock,
		timeout: cfg.timeout,
		rt:      deadline.NewRoundTrip(cfg.timeout),
		argInt:  make([]any, maxArgInt+1),
	}
	for i := range l.argInt {
		l.argInt[i] = strconv.Itoa(i)
	}
	l.calls = &redisscript.Grouped[[]*takeCall]{Script: takeScript, Client: c, Build: l.command, Settle: l.settle, Key: groupKey, RoundTrip: l.rt}
	if cfg.oneKeyPerCall {
		l.calls.OneKeyPerCall()
	}
	l.batch = coalesce.New(l.rt.Shared(), maxBatch, l.takeOne, l.takeMany)
	// Redis expires keys on its own time: with a client clock that runs
	// slower (a test's), an expiry would look like a loss.
	l.held.Off = cfg.clock != nil
	janitor.Start(l, func(l *Redis) { l.held.Sweep() })
	if cfg.server {
		if cfg.clock != nil {
			return nil, &throttle.OptionError{Field: "WithServerClock", Reason: "cannot be combined with WithClock"}
		}
		t, ok := c.(redisclock.Timer)
		if !ok {
			return nil, &throttle.OptionError{Field: "WithServerClock", Reason: fmt.Sprintf("the client %T has no Time method", c)}
		}
		l.server = redisclock.New(t, cfg.serverLocal)
		l.clock = l.server
	}
	takeScript.Warm(c, coalesce.MaxInFlight, min((1+deadline.MaxGrace)*cfg.timeout, time.Second))
	return l, nil
}

// Clock returns the clock the limiter decides on: WithClock's (or
// WithServerClock's), nil for Redis's TIME. All reads it to place one slot
// in every part.
func (l *Redis) Clock() throttle.Clock { return l.clock }

// Rate returns the refill rate.
func (l *Redis) Rate() throttle.Rate { return l.rate }

// Burst returns the capacity, in tokens.
func (l *Redis) Burst() int { return l.lims.def.p.burst }

// Algorithm returns "token_bucket".
func (l *Redis) Algorithm() string { return algorithm }

// Allow is AllowN(ctx, key, 1).
func (l *Redis) Allow(ctx context.Context, key string) (throttle.Decision, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN admits a request of cost n for key if the key's bucket holds n
// tokens at the current instant (the Redis server's TIME, or the WithClock
// clock), and takes them; otherwise it rejects, writing nothing, with a
// RetryAfter of (n - tokens) / rate rounded up to the millisecond.
// Remaining is the whole tokens left; ResetAfter the time until the bucket
// is full again. The Decision's Source is throttle.SourceRedis.
//
// Every key is usable, including "" and binary or very long keys: the key
// is escaped into a Redis Cluster hash tag (see the package documentation).
//
// With WithQuotas, rate, burst and Limit are the key's quota's.
//
// Errors: one wrapping throttle.ErrInvalidCost for n < 1 or n > burst,
// and (WithQuotas) one wrapping throttle.ErrInvalidOption for an invalid
// quota, returned before any Redis call; otherwise a Redis or context
// error (including the WithTimeout deadline), wrapped as "bucket: redis:
// ...", meaning the limiter could not decide.
func (l *Redis) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	lim, err := l.lims.of(key)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	if n < 1 || n > lim.p.burst {
		return throttle.Decision{}, throttle.CheckCost(n, lim.p.burst)
	}
	t, err := l.batch.Do(ctx, l.takeReq(key, lim, n, n))
	if err != nil {
		return throttle.Decision{}, err
	}
	return allowDecision(lim, n, t), nil
}

// allowDecision is AllowN's Decision for a request of cost n under lim
// that bucket.lua answered with t.
func allowDecision(lim *keyLimits, n int, t taken) throttle.Decision {
	d := lim.p.decision(t.granted > 0, n, t.credit, lim.limit, throttle.SourceRedis)
	if t.paused > 0 {
		d = pause.Decision(d, micros(t.paused))
	}
	return d
}

// grant is the result of a lease call.
type grant struct {
	lim        *keyLimits    // the limits the tokens were taken under
	granted    int           // tokens taken (0..max)
	remaining  float64       // tokens left in the Redis bucket after the call
	retryAfter time.Duration // when granted < min: time until min tokens will be there (ms, rounded up, > 0); else 0
	resetAfter time.Duration // time until the Redis bucket is full again (ms, rounded up)
	paused     time.Duration // > 0: the key is paused for this long more (ms, rounded up), and nothing was granted
}

// lease atomically takes from key's Redis bucket as many whole tokens as
// are available, up to max, but only if at least min are; otherwise it
// takes nothing (and writes nothing). One round trip (bucket.lua, as
// AllowN), bounded by the WithTimeout deadline.
//
// min must be >= 1 and <= burst, and max >= min; max beyond burst is
// treated as burst. Otherwise the error wraps throttle.ErrInvalidCost and
// Redis is not called. Other errors are Redis or context errors wrapped as
// "bucket: redis: ...": then nothing is known to have been taken (a
// timeout may still have taken tokens that are then lost until refill).
func (l *Redis) lease(ctx context.Context, key string, lim *keyLimits, min, max int) (grant, error) {
	p := &lim.p
	if min < 1 || min > p.burst {
		return grant{}, throttle.CheckCost(min, p.burst)
	}
	if max < min {
		return grant{}, fmt.Errorf("%w: lease max=%d is below min=%d", throttle.ErrInvalidCost, max, min)
	}
	max = minInt(max, p.burst)
	t, err := l.batch.Do(ctx, l.takeReq(key, lim, min, max))
	if err != nil {
		return grant{}, err
	}
	g := grant{
		lim:        lim,
		granted:    t.granted,
		remaining:  float64(t.credit) / float64(p.perUS),
		resetAfter: micros(p.waitUS(p.cap, t.credit)),
	}
	if t.granted == 0 {
		g.retryAfter = maxDuration(micros(p.waitUS(int64(min)*p.perUS, t.credit)), time.Millisecond)
	}
	if t.paused > 0 {
		g.paused = maxDuration(micros(t.paused), time.Millisecond)
		g.retryAfter = maxDuration(g.retryAfter, g.paused)
		g.resetAfter = maxDuration(g.resetAfter, g.paused)
	}
	return g, nil
}

// giveBack returns n unused tokens, taken under lim, to key's Redis
// bucket, capped at burst, without moving its refill timeline: the bucket
// is as if those tokens had never been taken (a bucket that is gone, i.e.
// full, stays full). If the key's quota is no longer lim's (WithQuotas),
// the tokens are dropped instead: they were taken under the old quota, and
// returning them would add them to the new one. One round trip
// (giveback.lua), bounded by the WithTimeout deadline. n < 1 is a no-op;
// n beyond burst is treated as burst. Errors are Redis or context errors
// wrapped as "bucket: redis: ...".
func (l *Redis) giveBack(ctx context.Context, key string, lim *keyLimits, n int) error {
	if n < 1 {
		return nil
	}
	if cur, err := l.lims.of(key); err != nil || cur.quota != lim.quota {
		return nil
	}
	n = minInt(n, lim.p.burst)
	ctx, cancel := l.rt.Bound(ctx)
	defer cancel()
	if err := l.ready(ctx); err != nil {
		return err
	}
	keys := []string{l.key(key)}
	l.held.Forget(keys[0]) // the bucket may be full after it
	var err error
	if l.clock == nil {
		err = giveBackScript.Run(ctx, l.client, keys, lim.argPer, lim.argCount, lim.argCap, l.arg(n)).Err()
	} else {
		now := strconv.FormatInt(l.clock.Now().UnixMicro(), 10)
		err = giveBackScript.Run(ctx, l.client, keys, lim.argPer, lim.argCount, lim.argCap, l.arg(n), now).Err()
	}
	if err != nil {
		return fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
	}
	return nil
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func maxDuration(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

var errReply = errors.New("bucket: redis: unexpected script reply")

// key returns the Redis key of key's bucket (see internal/rediskey).
func (l *Redis) key(key string) string { return rediskey.Key(l.prefix, key) }

// arg returns i as a boxed string argument, allocating only for large i.
func (l *Redis) arg(i int) any {
	if i < len(l.argInt) {
		return l.argInt[i]
	}
	return strconv.Itoa(i)
}
