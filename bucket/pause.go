package bucket

import (
	"context"
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Pause rejects every decision for key for d from now (the Local's clock),
// as throttle.Pauser describes: AllowN and AllowID return a rejection with
// Remaining 0 and a RetryAfter of at least the time left of the pause (the
// refill's wait, when longer), taking and reserving nothing. A longer
// pause extends the one in force, a shorter one never shortens it. Pauses
// are kept apart from the buckets, so forgetting an idle key never
// forgets its pause. The only error wraps throttle.ErrInvalidOption,
// naming "d", for d <= 0 or d beyond 2^52 µs. ctx is unused.
func (l *Local) Pause(_ context.Context, key string, d time.Duration) error {
	if err := pause.Check(d); err != nil {
		return err
	}
	now := l.now()
	l.pauses.Extend(key, now, now+pause.Micros(d))
	return nil
}

// paused returns the Decision of a request of cost n for key, paused for
// left µs more at now: the bucket is read, not written (a key without
// state reads full).
func (l *Local) paused(key string, lim *keyLimits, n int, now, left int64) throttle.Decision {
	credit := lim.p.cap
	if st, err := l.locked(key, now, &lim.p); err == nil {
		credit, _ = st.refill(&lim.p, now)
		st.mu.Unlock()
	}
	return pause.Decision(lim.p.decision(false, n, credit, lim.limit, throttle.SourceLocal), micros(left))
}

// Pause rejects every decision for key for d, in every process sharing the
// Redis, as throttle.Pauser describes: AllowN, AllowID and the Hybrid's
// leases are refused (RetryAfter at least the time left of the pause, the
// refill's wait when longer; Remaining 0), taking and reserving nothing.
// The pause is a string key beside the key's bucket, prefix + "{" + escaped
// key + "}" + ":pause" (same cluster slot), holding the instant the pause
// ends on the bucket's clock (the Redis server's TIME, or the WithClock
// clock); one script sets it only if that is later than the end already
// recorded (a longer pause extends, a shorter one never shortens), and it
// expires when the pause ends. bucket.lua reads the pauses of every key
// of a coalesced flush with one MGET, bucket_id.lua with one GET.
//
// With WithClock the key still expires after d of the Redis server's real
// time: a client clock that runs slower than real time sees the pause end
// early.
//
// Errors: one wrapping throttle.ErrInvalidOption, naming "d", for d <= 0 or
// d beyond 2^52 µs, before any Redis call; otherwise a Redis or context
// error (bounded by WithTimeout), wrapped as "bucket: redis: ...".
func (l *Redis) Pause(ctx context.Context, key string, d time.Duration) error {
	_, err := l.pauseFor(ctx, key, d)
	return err
}

// pauseFor is Pause; it returns how long key stays paused (d, or the
// longer pause already recorded).
func (l *Redis) pauseFor(ctx context.Context, key string, d time.Duration) (time.Duration, error) {
	if err := pause.Check(d); err != nil {
		return 0, err
	}
	ctx, cancel := deadline.Bound(ctx, l.timeout)
	defer cancel()
	if err := l.ready(ctx); err != nil {
		return 0, err
	}
	now := int64(-1)
	if l.clock != nil {
		now = l.clock.Now().UnixMicro()
	}
	left, err := pause.Redis(ctx, l.client, rediskey.Key(l.prefix, key), false, d, now)
	if err != nil {
		return 0, fmt.Errorf("bucket: redis: pause: %w", err)
	}
	return left, nil
}

var (
	_ throttle.Pauser = (*Local)(nil)
	_ throttle.Pauser = (*Redis)(nil)
	_ throttle.Pauser = (*Hybrid)(nil)
)
