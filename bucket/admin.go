package bucket

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Peek returns what AllowN(ctx, key, n) would return at this instant, and
// takes nothing: the key's bucket is read, refilled to now, and left as it
// was (a key without state reads full and stays without state). A debt of
// reservations counts, as in AllowN. Errors are those of AllowN. ctx is
// unused. While key is paused, Peek says so, as AllowN would.
func (l *Local) Peek(_ context.Context, key string, n int) (throttle.Decision, error) {
	lim, err := l.lims.of(key)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	p := &lim.p
	if n < 1 || n > p.burst {
		return throttle.Decision{}, throttle.CheckCost(n, p.burst)
	}
	now := l.now()
	credit := p.cap
	s := &l.shards[l.shardOf(key)]
	if v, ok := s.index.Load(key); ok {
		st := v.(*localState)
		st.mu.Lock()
		if !st.dead {
			credit, _ = st.refill(p, now)
		}
		st.mu.Unlock()
	}
	if left := l.pauses.Left(key, now); left > 0 {
		return pause.Decision(p.decision(false, n, credit, lim.limit, throttle.SourceLocal), micros(left)), nil
	}
	need := int64(n) * p.perUS
	if credit >= need {
		return p.decision(true, n, credit-need, lim.limit, throttle.SourceLocal), nil
	}
	return p.decision(false, n, credit, lim.limit, throttle.SourceLocal), nil
}

// Reset forgets key: its bucket is full again, its ids (AllowID's
// admissions and reservations) are forgotten and a pause ends. Resetting an unknown key is
// not an error; Reset never fails. ctx is unused.
func (l *Local) Reset(_ context.Context, key string) error {
	l.pauses.Clear(key)
	s := &l.shards[l.shardOf(key)]
	s.mu.Lock()
	s.lru.Remove(key) // calls evicted: a decision holding it looks again
	s.mu.Unlock()
	return nil
}

var (
	//go:embed peek.lua
	peekLua string
	//go:embed reset.lua
	resetLua string

	peekScript  = redis.NewScript(convertLua + peekLua)
	resetScript = redis.NewScript(resetLua)
)

// Peek returns what AllowN(ctx, key, n) would return at this instant (the
// Redis server's TIME, or the WithClock clock), and takes nothing: one
// script call (peek.lua) that reads the key's bucket and writes nothing,
// so no token is taken, no expiry renewed and a missing key stays missing.
// Errors are those of AllowN.
func (l *Redis) Peek(ctx context.Context, key string, n int) (throttle.Decision, error) {
	lim, err := l.lims.of(key)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	p := &lim.p
	if n < 1 || n > p.burst {
		return throttle.Decision{}, throttle.CheckCost(n, p.burst)
	}
	credit, paused, err := l.peek(ctx, key, lim)
	if err != nil {
		return throttle.Decision{}, err
	}
	if paused > 0 {
		return pause.Decision(p.decision(false, n, credit, lim.limit, throttle.SourceRedis), micros(paused)), nil
	}
	if need := int64(n) * p.perUS; credit >= need {
		return p.decision(true, n, credit-need, lim.limit, throttle.SourceRedis), nil
	}
	return p.decision(false, n, credit, lim.limit, throttle.SourceRedis), nil
}

// peek runs peek.lua under lim: the credit of key's bucket now, and the
// µs left of its pause (0: not paused).
func (l *Redis) peek(ctx context.Context, key string, lim *keyLimits) (int64, int64, error) {
	ctx, cancel := deadline.Bound(ctx, l.timeout)
	defer cancel()
	if err := l.ready(ctx); err != nil {
		return 0, 0, err
	}
	k := rediskey.Key(l.prefix, key)
	keys := []string{k, k + pause.Suffix}
	var cmd *redis.Cmd
	if l.clock == nil {
		cmd = peekScript.Run(ctx, l.client, keys, lim.argPer, lim.argCount, lim.argCap)
	} else {
		now := strconv.FormatInt(l.clock.Now().UnixMicro(), 10)
		cmd = peekScript.Run(ctx, l.client, keys, lim.argPer, lim.argCount, lim.argCap, now)
	}
	v, err := cmd.Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
	}
	if len(v) != 2 || v[0] < -lim.p.maxDebt || v[0] > lim.p.cap || v[1] < 0 {
		return 0, 0, fmt.Errorf("%w: %v", errReply, v)
	}
	return v[0], v[1], nil
}

// Reset deletes key's bucket, its ids set and its pause: the key is
// full again, with no id remembered and not paused, in every process that
// shares the Redis.
// Resetting an unknown key is not an error. Errors are Redis or context
// errors (bounded by WithTimeout), wrapped as "bucket: redis: ...".
func (l *Redis) Reset(ctx context.Context, key string) error {
	ctx, cancel := deadline.Bound(ctx, l.timeout)
	defer cancel()
	k := rediskey.Key(l.prefix, key)
	l.held.Forget(k) // emptied on purpose
	if err := resetScript.Run(ctx, l.client, []string{k, k + idsSuffix, k + pause.Suffix}).Err(); err != nil {
		return fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
	}
	return nil
}
