package concurrency

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/janitor"
	"github.com/queuethrottle/queuethrottle/internal/lost"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/throttle"
)

//go:embed slots.lua
var slotsLua string

// slotsScript is run with EVALSHA, and reloaded with EVAL on NOSCRIPT.
var slotsScript = redis.NewScript(slotsLua)

// The modes of slots.lua, boxed once.
var (
	modeAcquire any = "acquire"
	modeRenew   any = "renew"
	modeRelease any = "release"
	argNoLease  any = "0"
	// argServerTime is slots.lua's ARGV[5] for the server's TIME.
	argServerTime any = ""
)

// clockSuffix follows a key's Redis key to name its clock floor, kept only
// with WithClock. The Redis key ends with the '}' of its hash tag, and no
// escaped tag contains '}', so the floor never collides with another key
// and shares its key's cluster slot.
const clockSuffix = ":clock"

// Redis is an in-flight limit kept in Redis: at most limit ids hold a
// slot of a key at once, each until it releases the slot or its lease
// ends. Each key is one sorted set whose members are the ids holding a
// slot, scored by the end of their lease in microseconds; one Lua script
// per call (slots.lua) drops the ended leases and acquires, renews or
// releases atomically, then sets the key to expire when its last lease
// ends. It follows the concurrent limiter of Sidekiq Enterprise and the
// Redis counting semaphore with timed-out holders (see the package
// documentation).
//
// By default the instant is the Redis server's TIME, so every process
// sharing the Redis shares one clock. With WithClock the client sends its
// own time, and the script clamps it to the latest instant used on the
// key so that stored time never moves backwards.
//
// A Redis is safe for concurrent use by any number of goroutines and
// processes. It holds no per-key state in the process. The zero Redis is
// not usable: create one with NewRedis.
type Redis struct {
	client   redis.Scripter
	limit    int
	prefix   string
	clock    throttle.Clock // nil: Redis TIME
	timeout  time.Duration  // per call
	rt       *deadline.RoundTrip
	argLimit any // limit as an ARGV string, boxed once
	lastArg  atomic.Pointer[leaseArg]
	held     lost.Held // until when the sets this process was given slots in live, to tell a lost one
}

// leaseArg is a lease in µs and its ARGV string, boxed: callers mostly
// pass one lease, so the last one is kept for reuse.
type leaseArg struct {
	us  int64
	arg any
}

// leaseArg returns the ARGV string of a lease of us µs.
func (l *Redis) leaseArg(us int64) any {
	if a := l.lastArg.Load(); a != nil && a.us == us {
		return a.arg
	}
	a := &leaseArg{us: us, arg: strconv.FormatInt(us, 10)}
	l.lastArg.Store(a)
	return a.arg
}

// NewRedis returns an in-flight limit of limit slots per key, stored in c
// (a *redis.Client, *redis.ClusterClient or *redis.Ring).
//
// Options: WithClock (default: the Redis server's TIME), WithPrefix
// (default "throttle:concurrency:") and WithTimeout (default 50 ms). Errors
// wrap throttle.ErrInvalidOption and name the field at fault: "client" for
// a nil c (or a typed nil such as (*redis.Client)(nil)) and for a
// *redis.Client, *redis.ClusterClient or *redis.Ring created without
// ContextTimeoutEnabled: true whose ReadTimeout and WriteTimeout are not
// both within WithTimeout (go-redis would ignore the context deadline that
// bounds each call); "limit" for a limit < 1 or above 2^53 (the script's
// Lua numbers are doubles); or the option.
func NewRedis(c redis.Scripter, limit int, opts ...Option) (*Redis, error) {
	if rediskey.NilClient(c) {
		return nil, &throttle.OptionError{Field: "client", Reason: "must not be nil"}
	}
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	if err := redisopt.CheckExact("limit", int64(limit)); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := redisopt.CheckContextTimeout(c, cfg.timeout); err != nil {
		return nil, err
	}
	l := &Redis{
		client:   c,
		limit:    limit,
		prefix:   cfg.prefix,
		clock:    cfg.clock,
		timeout:  cfg.timeout,
		rt:       deadline.NewRoundTrip(cfg.timeout),
		argLimit: strconv.Itoa(limit),
	}
	// Redis expires keys on its own time: with a client clock that runs
	// slower (a test's), an expiry would look like a loss.
	l.held.Off = cfg.clock != nil
	janitor.Start(l, func(l *Redis) { l.held.Sweep() })
	return l, nil
}

// Acquire gives id a slot of key for lease (rounded up to a whole
// microsecond) if fewer than limit ids hold one, and admits it; otherwise
// it rejects, taking nothing. An id that already holds a slot of key is
// admitted again with its lease renewed to end lease from now (never a
// second slot), so a redelivered message or a retry after a lost reply is
// not counted twice.
//
// The Decision: Limit = limit; Remaining = the slots free after the call;
// ResetAfter = the time until the last lease of key ends; for a rejection,
// RetryAfter = the time until the earliest lease ends (an upper bound: a
// Release may free a slot sooner). Durations are rounded up to the
// millisecond and a RetryAfter is never 0. Source is throttle.SourceRedis.
//
// Every key and id is usable, including "" and binary or very long ones.
//
// Errors: one wrapping throttle.ErrInvalidCost for lease <= 0 (or longer
// than 2^52 µs), returned before any Redis call; otherwise a Redis or
// context error (including the WithTimeout deadline, default 50 ms),
// wrapped as "concurrency: redis: ...", meaning the limiter could not
// decide.
func (l *Redis) Acquire(ctx context.Context, key, id string, lease time.Duration) (throttle.Decision, error) {
	us, err := leaseMicros(lease)
	if err != nil {
		return throttle.Decision{}, err
	}
	v, err := l.run(ctx, key, modeAcquire, id, l.leaseArg(us))
	if err != nil {
		return throttle.Decision{}, err
	}
	if v[0] == 1 {
		l.held.Note(l.key(key), v[4]+us, v[4])
	}
	return decision(v[0] == 1, l.limit, int(v[1]), v[2], v[3], throttle.SourceRedis), nil
}

// Renew makes the lease of id on key end lease (rounded up to a whole
// microsecond) from now, if id holds a slot of key; a lease may be
// shortened as well as extended. It returns an error wrapping ErrNotHeld
// if id holds no slot (never acquired, released, or its lease ended), one
// wrapping throttle.ErrInvalidCost for lease <= 0 (before any Redis call),
// or a Redis or context error wrapped as "concurrency: redis: ...".
func (l *Redis) Renew(ctx context.Context, key, id string, lease time.Duration) error {
	us, err := leaseMicros(lease)
	if err != nil {
		return err
	}
	v, err := l.run(ctx, key, modeRenew, id, l.leaseArg(us))
	if err != nil {
		return err
	}
	if v[0] != 1 {
		return ErrNotHeld
	}
	l.held.Note(l.key(key), v[4]+us, v[4])
	return nil
}

// Release frees the slot id holds on key. Releasing a slot that is not
// held (released before, ended, or never acquired) is not an error. The
// only errors are Redis or context errors, wrapped as
// "concurrency: redis: ...".
func (l *Redis) Release(ctx context.Context, key, id string) error {
	_, err := l.run(ctx, key, modeRelease, id, argNoLease)
	return err
}

var errReply = errors.New("concurrency: redis: unexpected script reply")

// run runs slots.lua for key in mode and returns its four integers.
func (l *Redis) run(ctx context.Context, key string, mode any, id string, lease any) ([5]int64, error) {
	var v [5]int64
	ctx, cancel := l.rt.Bound(ctx)
	defer cancel()
	k := l.key(key)
	held := l.held.Arg(k)
	var res any
	var err error
	start := time.Now()
	if l.clock == nil {
		res, err = slotsScript.Run(ctx, l.client, []string{k}, mode, member(id), lease, l.argLimit, argServerTime, held).Result()
	} else {
		now := strconv.FormatInt(l.clock.Now().UnixMicro(), 10)
		res, err = slotsScript.Run(ctx, l.client, []string{k, k + clockSuffix}, mode, member(id), lease, l.argLimit, now, held).Result()
	}
	if err != nil {
		return v, fmt.Errorf("concurrency: redis: %w", redisopt.Explain("concurrency", l.rt.Done(start, -1, err)))
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != len(v) {
		return v, fmt.Errorf("%w: %v", errReply, res)
	}
	for i, x := range vals {
		if v[i], ok = x.(int64); !ok {
			return v, fmt.Errorf("%w: %v", errReply, res)
		}
	}
	l.rt.Done(start, v[4], nil) // and the server's instant
	return v, nil
}

// key returns the Redis key that holds the slots of key: prefix + "{" +
// escaped key + "}" (see internal/rediskey and the package documentation).
func (l *Redis) key(key string) string { return rediskey.Key(l.prefix, key) }

// member is id's member in the set: id itself, but for an id that starts
// with a NUL byte, which gets one more in front, so that no id is ever
// one of slots.lua's own members ("\x00alive", "\x00lost:" + i).
func member(id string) string {
	if id != "" && id[0] == 0 {
		return "\x00" + id
	}
	return id
}
