package bucket

import (
	"context"
	"fmt"
	"hash/maphash"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Peek returns what AllowN(ctx, key, n) would return now, from this
// process' view, and takes nothing: it runs AllowN's decision on a copy of
// the key's local state (the stock, the demand estimate, the last Redis
// reply), and where AllowN would lease from Redis it reads the Redis
// bucket instead (one script call that writes nothing, see Redis.Peek).
// No token is taken or leased, no stock is returned, no expiry is renewed,
// and a key without local state gets none. While Redis is down it answers
// as the degraded mode would (WithLocalShare's bucket, peeked), or returns
// the error. Other processes may take tokens between a Peek and the next
// decision, as with any limiter shared by several. While the key is
// paused (here, or in Redis by another process), Peek says so, as AllowN
// would. Errors are those of AllowN.
func (h *Hybrid) Peek(ctx context.Context, key string, n int) (throttle.Decision, error) {
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
	s := h.shardOf(key)
	s.mu.Lock()
	var e hybridKey // a copy: Peek changes nothing
	if cur, ok := s.lru.Peek(key); ok {
		e = *cur
		if e.lim.quota != lim.quota { // as requota would leave it
			e.lim, e.stock, e.fresh = lim, 0, 0
			e.redisTokens, e.redisAt = 0, time.Time{}
		}
	} else {
		e = hybridKey{key: key, lim: lim}
		if h.cluster != nil {
			e.slot = rediskey.Slot(rediskey.Key(h.redis.prefix, key))
		}
	}
	e.call = nil
	slot := e.slot
	s.mu.Unlock()
	if left := h.pauses.Left(key, now.UnixMicro()); left > 0 { // as AllowN
		return pause.Decision(h.decision(&e, now, n, false, 0), micros(left)), nil
	}
	e.observe(now, n)
	if !h.healthAt(slot).down.Load() {
		if e.stock > 0 && e.oldest(now) {
			e.dropOld(now)
		}
		if e.stock >= n {
			e.take(n)
			return h.decision(&e, now, n, true, 0), nil
		}
		if wait := h.emptyWait(&e, now, n-e.stock); wait > 0 {
			return h.decision(&e, now, n, false, wait), nil
		}
	}
	credit, paused, err := h.peekRedis(ctx, key, lim)
	if err != nil {
		d, err := h.peekFallback(ctx, key, n, err)
		return d, err
	}
	if paused > 0 { // as AllowN once its lease learns of the pause
		d := pause.Decision(h.decision(&e, now, n, false, 0), micros(paused))
		d.Source = throttle.SourceRedis
		return d, nil
	}
	// As a lease of at least need = n - stock would.
	p := &lim.p
	need := max(1, n-e.stock)
	tokens := float64(credit) / float64(p.perUS)
	e.redisTokens, e.redisAt = tokens, now
	if credit < int64(need)*p.perUS {
		retry := max(micros(p.waitUS(int64(need)*p.perUS, credit)), time.Millisecond)
		d := h.decision(&e, now, n, false, retry)
		d.Source = throttle.SourceRedis
		return d, nil
	}
	granted := min(int(credit/p.perUS), max(need, h.target(&e)-e.stock), p.burst)
	e.add(granted, now)
	e.redisTokens -= float64(granted)
	e.take(n)
	d := h.decision(&e, now, n, true, 0)
	d.Source = throttle.SourceRedis
	return d, nil
}

// peekRedis reads key's Redis bucket under lim, bounded by the timeout.
func (h *Hybrid) peekRedis(ctx context.Context, key string, lim *keyLimits) (int64, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	return h.redis.peek(ctx, key, lim)
}

// peekFallback is fallback for Peek: the local share's Peek, or the error
// (always for an error about this request only, as fallback).
func (h *Hybrid) peekFallback(ctx context.Context, key string, n int, err error) (throttle.Decision, error) {
	if isRequestError(err) {
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: %w", err)
	}
	if h.share == nil {
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: redis unavailable: %w", err)
	}
	d, derr := h.share.Peek(ctx, key, n)
	if derr != nil {
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: local share: %w (redis unavailable: %w)", derr, err)
	}
	if lim, qerr := h.redis.lims.of(key); qerr == nil {
		d.Limit = lim.limit
	}
	d.Source = throttle.SourceDegraded
	return d, nil
}

// Reset puts key back to its initial state: its Redis bucket and ids are
// deleted (Redis.Reset, full again for every process), this process drops
// the tokens it holds for the key without returning them, and the local
// share (WithLocalShare) forgets the key. Other processes' Hybrids keep
// the tokens they leased before (at most a lease each, a quarter of the
// burst) until they spend them or return them. Resetting an unknown key
// is not an error. Errors are those of Redis.Reset, or one wrapping
// ErrHybridClosed after Close.
func (h *Hybrid) Reset(ctx context.Context, key string) error {
	if h.closed.Load() {
		return ErrHybridClosed
	}
	h.pauses.Clear(key)
	if err := h.redis.Reset(ctx, key); err != nil {
		return fmt.Errorf("bucket: hybrid: %w", err)
	}
	s := h.shardOf(key)
	s.mu.Lock()
	if e, ok := s.lru.Peek(key); ok {
		e.stock, e.fresh = 0, 0 // not returned: the bucket is full again
		s.lru.Remove(key)       // calls evicted
	}
	s.mu.Unlock()
	if h.share != nil {
		return h.share.Reset(ctx, key)
	}
	return nil
}

// shardOf returns key's shard (see lock).
func (h *Hybrid) shardOf(key string) *hybridShard {
	return &h.shards[maphash.String(h.seed, key)&h.mask]
}
