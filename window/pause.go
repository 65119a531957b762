package window

import (
	"context"
	"fmt"
	"hash/maphash"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Pause rejects every decision for key for d from now (the Memory's
// clock), as throttle.Pauser describes: AllowN, AllowID and Peek return a
// rejection with Remaining 0 and a RetryAfter of the time left of the
// pause, recording and reserving nothing. A longer pause extends the one
// in force, a shorter one never shortens it, and Reset ends it. The pause
// is kept apart from the key's log, so the sweep of idle keys never
// forgets it. The only error wraps throttle.ErrInvalidOption, naming "d",
// for d <= 0 or d beyond 2^52 µs. ctx is unused.
func (m *Memory) Pause(_ context.Context, key string, d time.Duration) error {
	if err := pause.Check(d); err != nil {
		return err
	}
	now, _ := instant(m.clock.Now(), 0)
	m.pauses.Extend(key, now, now+pause.Micros(d))
	return nil
}

// paused returns the Decision for key, paused for left µs more at now: a
// rejection whose ResetAfter also covers the newest unit of the key's log,
// as window.lua's pause check computes it.
func (m *Memory) paused(key string, now, left int64, r throttle.Rate, perUS int64) throttle.Decision {
	d := throttle.Decision{Limit: r.Count, Source: throttle.SourceLocal}
	s := &m.shards[maphash.String(m.seed, key)%memoryShards]
	s.mu.Lock()
	if l := s.logs[key]; l != nil {
		d.ResetAfter = micros(max(l.newest()+perUS-now, 0))
	}
	s.mu.Unlock()
	return pause.Decision(d, time.Duration(left)*time.Microsecond)
}

// Pause rejects every decision for key for d, in every process sharing the
// Redis, as throttle.Pauser describes: AllowN, AllowID and Peek return a
// rejection with Remaining 0 and a RetryAfter of the time left of the
// pause, writing nothing. The pause is a string key beside the key's
// sorted set, prefix + "{" + escaped key + "}" + ":pause" (same cluster
// slot), holding the instant the pause ends on the window's clock (the
// Redis server's TIME, or the WithClock clock); one script sets it only if
// that is later than the end already recorded (a longer pause extends, a
// shorter one never shortens), and it expires when the pause ends.
// window.lua reads it with the key's schedule, with one EXISTS per script
// call (every request of a coalesced batch is rejected while it holds),
// and a lone AllowN only when the set's expiry marker is missing, which
// this script drops (see the package documentation). Reset ends it.
//
// With WithClock the key still expires after d of the Redis server's real
// time: a client clock that runs slower than real time sees the pause end
// early.
//
// Errors: one wrapping throttle.ErrInvalidOption, naming "d", for d <= 0 or
// d beyond 2^52 µs, before any Redis call; otherwise a Redis or context
// error (bounded by WithTimeout), wrapped as "window: redis: ...".
func (l *Redis) Pause(ctx context.Context, key string, d time.Duration) error {
	if err := pause.Check(d); err != nil {
		return err
	}
	ctx, cancel := deadline.Bound(ctx, l.timeout)
	defer cancel()
	if err := l.ready(ctx); err != nil {
		return err
	}
	now := int64(-1)
	if l.clock != nil {
		now, _ = instant(l.clock.Now(), 0)
	}
	if _, err := pause.Redis(ctx, l.client, l.key(key), true, d, now); err != nil {
		return fmt.Errorf("window: redis: pause: %w", err)
	}
	return nil
}

var _ throttle.Pauser = (*Memory)(nil)
var _ throttle.Pauser = (*Redis)(nil)
