package bucket

import (
	"context"
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Pause rejects every decision for key for d, in every process sharing the
// Redis bucket, as throttle.Pauser describes: the pause is recorded in
// this process at once (AllowN rejects locally from then on, with
// Remaining 0 and a RetryAfter of the time left, and the key's leased
// stock goes back to Redis) and in Redis as bucket.Redis's Pause records
// it, where every lease of every Hybrid on the key is refused until it
// ends. The Redis call is bounded by the timeout and does not go through
// the circuit breaker. See Hybrid for how soon other processes see it.
//
// Errors: one wrapping throttle.ErrInvalidOption, naming "d", for d <= 0 or
// d beyond 2^52 µs, and ErrHybridClosed after Close, both pausing nothing;
// otherwise a Redis or context error, wrapped as "bucket: hybrid: ...":
// the pause then holds in this process only (and in Redis too if the
// script ran after all).
func (h *Hybrid) Pause(ctx context.Context, key string, d time.Duration) error {
	if err := pause.Check(d); err != nil {
		return err
	}
	if h.closed.Load() {
		return ErrHybridClosed
	}
	lim, err := h.redis.lims.of(key)
	if err != nil && !blocked.Is(err) { // a blocked key pauses under the limiter's own limits
		return err
	}
	s, e := h.lock(key, lim)
	h.notePause(e, h.clock.Now(), d)
	s.mu.Unlock()
	if _, err := h.redis.pauseFor(ctx, key, d); err != nil {
		return fmt.Errorf("bucket: hybrid: %w", err)
	}
	return nil
}

// notePause records, under e's shard lock, that e's key is paused for d
// from now: in the Hybrid's pauses, which AllowN reads first, and by
// returning the key's stock to Redis (it must not be spent meanwhile, and
// others may need it after the pause).
func (h *Hybrid) notePause(e *hybridKey, now time.Time, d time.Duration) {
	us := now.UnixMicro()
	h.pauses.Extend(e.key, us, us+pause.Micros(d))
	if k := e.stock; k > 0 {
		e.stock, e.fresh = 0, 0
		h.giveBackAsync(e.key, e.lim, k)
	}
}

// pausedDecision is the local rejection of a request of cost n for e's
// key, paused for left µs more at now. It is entered with s locked and
// leaves it unlocked.
func (h *Hybrid) pausedDecision(ctx context.Context, s *hybridShard, e *hybridKey, now time.Time, n int, left int64) throttle.Decision {
	d := pause.Decision(h.decision(e, now, n, false, 0), micros(left))
	s.local++
	s.mu.Unlock()
	h.decisions.Add(ctx, 1, h.decisionOpts[0][throttle.SourceLocal]...)
	return d
}
