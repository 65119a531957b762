package window

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
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

//go:embed window.lua
var windowLua string

// windowHeadLua is the start of window.lua's script: the instant, and the
// keys' schedules and pauses.
//
//go:embed window_head.lua
var windowHeadLua string

// plainLua follows unitsLua in window.lua's script: the call's leading
// plain keys decided before the rest of the script is built.
//
//go:embed plain.lua
var plainLua string

// unitsLua is the prelude of window.lua and joint.lua: unit members, their
// ZADDs, the newest score and exclusive score bounds.
//
//go:embed units.lua
var unitsLua string

// windowScript is run with EVALSHA, and reloaded with EVAL on NOSCRIPT.
var windowScript = redisscript.New(windowHeadLua + unitsLua + plainLua + redisscript.GroupedLua + windowLua)

// Redis is a sliding window log kept in Redis: one sorted set per key whose
// members are the admitted units, scored by their admission time in
// microseconds. A Lua script counts the members in the window and, only
// if count + n <= Count, adds n members at the current instant, the key
// expiring one Per to one and a half after it (see the package
// documentation: the expiry marker). A rejection adds nothing and does
// not renew the expiry. Concurrent decisions are
// coalesced: while a call is in flight, the others queue and go together,
// one script call per key (see the package documentation).
//
// By default the instant is the Redis server's TIME, so every process
// sharing the Redis shares one clock. With WithClock the client sends its
// own time, and the script clamps it to the newest admission of the key so
// that stored time never moves backwards. With WithServerClock, for a
// Redis whose scripts may not call TIME, the client sends the server's
// time as estimated from the TIME command.
//
// The algorithm is the sliding window log (see the package documentation),
// on the common Redis layout of a sorted set of admission times, decided in
// one atomic script rather than a MULTI.
//
// A Redis is safe for concurrent use by any number of goroutines and
// processes. It holds no per-key state in the process. The zero Redis is
// not usable: create one with NewRedis.
type Redis struct {
	client   redis.Scripter
	rate     throttle.Rate
	prefix   string
	clock    throttle.Clock      // nil: Redis TIME
	server   *redisclock.Clock   // WithServerClock: clock is it; nil otherwise
	timeout  time.Duration       // per call
	rt       *deadline.RoundTrip // bounds each call: timeout + one round trip
	argWin   any                 // precomputed ARGV strings, boxed once
	argLimit any
	spaced   bool // WithSpacedReservations
	// wholeArgs: send a lone AllowN of cost 1 in the whole form, not the
	// short one (see window.lua), for the scripts of earlier versions that
	// tests run in its place.
	wholeArgs bool
	member    memberSource
	quotas    throttle.QuotaFunc
	batch     *coalesce.Batcher[request, throttle.Decision]
	// calls sends a flush: one script call for every key on a
	// *redis.Client, one per hash slot on a *redis.ClusterClient, one per
	// key on a *redis.Ring or any other client and with WithOneKeyPerCall,
	// and the next of these once a server refused keys of several slots in
	// one call (see redisscript.Grouped).
	calls *redisscript.Grouped[[]*call]

	lastExpiry atomic.Pointer[expiryArg] // see expiry
	held       lost.Held                 // what this process saw admitted, to tell a lost set
}

// NewRedis returns a sliding window admitting r.Count units per r.Per for
// each key, stored in c (a *redis.Client, *redis.ClusterClient or
// *redis.Ring). The window is r.Per rounded up to a whole microsecond.
//
// Options: WithClock or WithServerClock (default: the Redis server's TIME
// inside the script), WithPrefix (default "throttle:window:") and
// WithTimeout (default 50 ms). Errors wrap throttle.ErrInvalidOption and
// name the field at fault: a nil c; an invalid r, or r.Count above 2^53
// (the script's Lua numbers are doubles); a bad option; and a
// *redis.Client, *redis.ClusterClient or *redis.Ring created without
// ContextTimeoutEnabled: true whose ReadTimeout and WriteTimeout are not
// both within WithTimeout (field "client"), since go-redis would then
// ignore the context deadline that bounds each call.
//
// On a *redis.Client, NewRedis opens the two connections that coalesced
// decisions use at once and loads the script on them, waiting at most 3
// timeouts (at most 1 s) and failing on nothing: a connection opened
// inside a decision would count its dial and handshake against the
// decision's timeout, which a burst on a starved CPU outlasts. They stay
// open as long as the client's pool keeps idle connections (its
// ConnMaxIdleTime, 30 min by default; MinIdleConns keeps them).
func NewRedis(c redis.Scripter, r throttle.Rate, opts ...Option) (*Redis, error) {
	if rediskey.NilClient(c) {
		return nil, &throttle.OptionError{Field: "client", Reason: "must not be nil"}
	}
	if err := checkRate(r); err != nil {
		return nil, err
	}
	if err := redisopt.CheckExact("Rate.Count", int64(r.Count)); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := redisopt.CheckContextTimeout(c, cfg.timeout); err != nil {
		return nil, err
	}
	window := r.PerMicros()
	l := &Redis{
		client:   c,
		rate:     r,
		prefix:   cfg.prefix,
		clock:    cfg.clock,
		timeout:  cfg.timeout,
		rt:       deadline.NewRoundTrip(cfg.timeout),
		argWin:   strconv.FormatInt(window, 10),
		argLimit: strconv.Itoa(r.Count),
		quotas:   cfg.quotas,
	}
	if cfg.server {
		if cfg.clockSet {
			return nil, &throttle.OptionError{Field: "WithServerClock", Reason: "cannot be combined with WithClock"}
		}
		t, ok := c.(redisclock.Timer)
		if !ok {
			return nil, &throttle.OptionError{Field: "WithServerClock", Reason: fmt.Sprintf("the client %T has no Time method", c)}
		}
		l.server = redisclock.New(t, cfg.serverLocal)
		l.clock = l.server
	}
	l.calls = &redisscript.Grouped[[]*call]{Script: windowScript, Client: c, Build: l.command, Settle: l.settle, Key: groupKey, RoundTrip: l.rt}
	if cfg.oneKeyPerCall {
		l.calls.OneKeyPerCall()
	}
	l.spaced = cfg.spaced
	l.batch = coalesce.New(l.rt.Shared(), maxBatch, l.one, l.many).WithUnits(func(r request) int { return r.n }, maxUnits)
	if err := l.member.init(); err != nil {
		return nil, fmt.Errorf("window: member id: %w", err)
	}
	// Redis expires keys on its own time: with a client clock that runs
	// slower (a test's), an expiry would look like a loss.
	l.held.Off = cfg.clock != nil
	janitor.Start(l, func(l *Redis) { l.held.Sweep() })
	windowScript.Warm(c, coalesce.MaxInFlight, warmBound(cfg.timeout))
	return l, nil
}

// warmBound is how long NewRedis waits for the connections it opens: 3
// timeouts (a call's most with its grace), at most a second.
func warmBound(timeout time.Duration) time.Duration {
	return min((1+deadline.MaxGrace)*timeout, time.Second)
}

// Clock returns the clock the limiter decides on: WithClock's (or
// WithServerClock's), nil for Redis's TIME. All reads it to place one slot
// in every part.
func (l *Redis) Clock() throttle.Clock { return l.clock }

// Rate returns the limit the window enforces.
func (l *Redis) Rate() throttle.Rate { return l.rate }

// Algorithm returns "sliding_window_log".
func (l *Redis) Algorithm() string { return algorithm }

// Allow is AllowN(ctx, key, 1).
func (l *Redis) Allow(ctx context.Context, key string) (throttle.Decision, error) {
	return l.AllowN(ctx, key, 1)
}

var argOne any = "1"

// MaxCost is the largest n one AllowN call of a Redis window accepts. The
// log keeps one sorted-set member per admitted unit, so a call of cost n
// costs the Redis server O(n) time and memory while every other client
// waits; for weights such as bytes, use a token bucket (package bucket).
const MaxCost = 10_000

// AllowN admits n units for key if every window of Per that contains the
// current instant (the Redis server's TIME, or the WithClock clock) holds
// at most Count-n units, reservations included, and records them at that
// instant; otherwise it rejects, adding nothing, with a RetryAfter of the
// time until they would fit, rounded up to the millisecond. Without
// reservations on the key that is the time until enough of the oldest
// admissions leave the window. An admission at t counts during [t, t+Per).
//
// Every key is usable, including "" and binary or very long keys; see the
// package documentation for how keys map to Redis keys.
//
// Errors: one wrapping throttle.ErrInvalidCost for n < 1, n > Count or
// n > MaxCost, returned before any Redis call; otherwise a Redis or context
// error (including the WithTimeout deadline, default 50 ms), wrapped as
// "window: redis: ...", meaning the limiter could not decide.
// The Decision's Source is throttle.SourceRedis.
func (l *Redis) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return l.decide(ctx, key, n, "", argAllowN)
}

// AllowID is AllowN for a request with identity id (opaque bytes, scoped
// to key), as throttle.IDLimiter describes: an id admitted and still
// counted is admitted again without a charge; a rejection reserves the
// request's own slot, the earliest instant at which it fits in every
// window, when that lies within horizon. Reservations are members of the
// key's sorted set scored at their slot, so they count in every window
// like admissions; see the package documentation. The same id should be
// presented with the same n.
//
// Errors: those of AllowN, and one wrapping throttle.ErrInvalidOption for
// horizon < 0, before any Redis call.
func (l *Redis) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	if horizon < 0 {
		return throttle.Decision{}, errHorizon(horizon)
	}
	return l.decide(ctx, key, n, id, strconv.FormatInt(horizonMicros(horizon), 10))
}

// AllowIDAfter is AllowID for a request that must not start before now +
// after (in Redis's clock, or the WithClock clock), as
// throttle.SlotLimiter describes: All uses it to hold one slot in every
// part. after is rounded up to the µs.
//
// Errors: those of AllowID, and one wrapping throttle.ErrInvalidOption
// for after < 0, before any Redis call.
func (l *Redis) AllowIDAfter(ctx context.Context, key string, n int, id string, horizon, after time.Duration) (throttle.Decision, error) {
	if horizon < 0 {
		return throttle.Decision{}, errHorizon(horizon)
	}
	us, err := throttle.AfterMicros(after)
	if err != nil {
		return throttle.Decision{}, err
	}
	h := strconv.FormatInt(horizonMicros(horizon), 10)
	if us > 0 {
		h += ">" + strconv.FormatInt(us, 10) // see window.lua's horizon
	}
	return l.decide(ctx, key, n, id, h)
}

// argAllowN is the horizon argument that tells window.lua the request has
// no id.
var argAllowN any = "-1"

func (l *Redis) decide(ctx context.Context, key string, n int, member string, horizon any) (throttle.Decision, error) {
	r, err := l.request(key, n, member, horizon)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	return l.batch.Do(ctx, r)
}

// request checks a decision's input and builds it, with key's quota.
func (l *Redis) request(key string, n int, member string, horizon any) (request, error) {
	r := request{argWin: l.argWin, argLimit: l.argLimit, win: l.rate.PerMicros(), limit: l.rate.Count, argN: argOne, n: n, member: member, horizon: horizon}
	// The key, its pause and schedule keys and AllowN's fresh member, in
	// one allocation: the schedule key starts with the pause key, which
	// starts with the key.
	var buf [len(hintSuffix) + memberLen]byte
	suffix := append(buf[:0], hintSuffix...)
	fresh := horizon == argAllowN
	if fresh {
		suffix = l.member.appendNext(suffix)
	}
	k, s := rediskey.KeyAnd(l.prefix, key, suffix)
	r.key, r.pause, r.hint = k, s[:len(k)+len(pause.Suffix)], s[:len(k)+len(hintSuffix)]
	if fresh {
		r.member = s[len(r.hint):]
	}
	if l.quotas != nil {
		q, err := quotaOf(l.quotas, l.rate, key)
		if err != nil {
			return r, err
		}
		if q != l.rate {
			if err := redisopt.CheckExact("quota Rate.Count", int64(q.Count)); err != nil {
				return r, blocked.Invalid("window", key, err)
			}
			r.argWin, r.argLimit, r.win, r.limit = strconv.FormatInt(q.PerMicros(), 10), strconv.Itoa(q.Count), q.PerMicros(), q.Count
		}
	}
	if err := throttle.CheckCost(n, r.limit); err != nil {
		return r, err
	}
	if n > MaxCost {
		return r, fmt.Errorf("%w: n=%d exceeds the Redis window's MaxCost %d (one sorted-set member per unit)", throttle.ErrInvalidCost, n, MaxCost)
	}
	if n != 1 {
		r.argN = strconv.Itoa(n)
	}
	return r, nil
}

// floorSuffix and hintSuffix name the clock-floor and schedule keys
// beside a key's sorted set (after its hash tag, so in the same slot; no
// sorted-set key ends with them). The schedule key (window.lua's KEYS[2])
// is named after the slot-search hint it first held alone.
const (
	floorSuffix = ":floor"
	hintSuffix  = pause.Suffix + ":hint" // after the pause key's (see request)
)

var errReply = errors.New("window: redis: unexpected script reply")

// key returns the Redis key that holds the window of key: prefix + "{" +
// escaped key + "}" (see internal/rediskey and the package documentation).
func (l *Redis) key(key string) string { return rediskey.Key(l.prefix, key) }

// memberSource makes AllowN's sorted-set members unique across processes
// and goroutines, even within one microsecond, in memberLen bytes (Redis
// holds one per admitted unit): a random 24-bit id per limiter, its first
// byte at least 0x80, then a 40-bit counter from a random start, big
// endian. The first byte keeps them apart from every member with a text
// prefix: AllowID's units ("A" and "R") and the hex members of earlier
// versions, which may share a key during a rolling upgrade. A limiter's
// members repeat only after 2^40 of them; two limiters' only when their
// ids match (1 in 2^23) and their counters' ranges overlap (a limiter
// that makes 10^9 decisions uses a thousandth of the range). Eight bytes
// and a microsecond score (an integer of 8 bytes) fill 20 bytes of a
// small sorted set (a listpack): 100 units fit the allocator's 2 KiB
// class, where 9 bytes took the next (2.5 KiB).
type memberSource struct {
	id  [3]byte
	seq atomic.Uint64
}

// memberLen is the length of a member of memberSource.
const memberLen = 8

func (m *memberSource) init() error {
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return err
	}
	copy(m.id[:], r[:3])
	m.id[0] |= 0x80
	m.seq.Store(binary.BigEndian.Uint64(r[:]) & (1<<40 - 1))
	return nil
}

func (m *memberSource) next() string {
	var buf [memberLen]byte
	return string(m.appendNext(buf[:0]))
}

// appendNext appends the next member to b.
func (m *memberSource) appendNext(b []byte) []byte {
	b = append(b, m.id[:]...)
	seq := m.seq.Add(1)
	return append(b, byte(seq>>32), byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq))
}
