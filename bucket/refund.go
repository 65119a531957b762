package bucket

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Refund takes back what id holds for key (see throttle.Refunder): the n
// tokens AllowID took for its admission, while the bucket remembers the id
// (burst × Per / Count after it), or for its reservation. They go back
// without moving the refill timeline, capped at burst, so the bucket holds
// what it would had the request never been made; the id is forgotten. It
// reports whether id held anything. The only error wraps
// throttle.ErrInvalidCost, for n < 1 or n > burst. ctx is unused.
func (l *Local) Refund(_ context.Context, key string, n int, id string) (bool, error) {
	lim, err := l.lims.of(key)
	if blocked.Is(err) {
		return false, nil // a blocked key holds nothing to give back under its quota
	}
	if err != nil {
		return false, err
	}
	p := &lim.p
	if n < 1 || n > p.burst {
		return false, throttle.CheckCost(n, p.burst)
	}
	s := &l.shards[l.shardOf(key)]
	v, ok := s.index.Load(key)
	if !ok {
		return false, nil // forgotten: the bucket reads full
	}
	st := v.(*localState)
	now := l.now()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.dead || st.ids == nil {
		return false, nil
	}
	credit, ts := st.refill(p, now)
	st.ids.forget(ts - p.memUS)
	if _, ok := st.ids.m[id]; !ok {
		return false, nil
	}
	delete(st.ids.m, id) // its queue items go when forgotten (see idSet.forget)
	st.credit, st.ts, st.p = min(credit+int64(n)*p.perUS, p.cap), ts, p
	return true, nil
}

var (
	//go:embed refund.lua
	refundLua    string
	refundScript = redis.NewScript(convertLua + refundLua)
)

// Refund takes back what id holds for key (see throttle.Refunder): the n
// tokens AllowID took for its admission, while the key's ids set remembers
// it, or for its reservation. One script call (refund.lua) gives them back
// without moving the refill timeline, capped at burst, and forgets the id,
// so refunding twice gives back once. It reports whether id held anything.
//
// Errors: one wrapping throttle.ErrInvalidCost for n < 1 or n > burst,
// before any Redis call; otherwise a Redis or context error (bounded by
// WithTimeout), wrapped as "bucket: redis: ...", after which the tokens
// may still be taken (refunding again is safe).
func (l *Redis) Refund(ctx context.Context, key string, n int, id string) (bool, error) {
	lim, err := l.lims.of(key)
	if blocked.Is(err) {
		return false, nil // a blocked key holds nothing to give back under its quota
	}
	if err != nil {
		return false, err
	}
	if n < 1 || n > lim.p.burst {
		return false, throttle.CheckCost(n, lim.p.burst)
	}
	ctx, cancel := deadline.Bound(ctx, l.timeout)
	defer cancel()
	if err := l.ready(ctx); err != nil {
		return false, err
	}
	k := rediskey.Key(l.prefix, key)
	l.held.Forget(k) // the bucket may be full after it
	keys := []string{k, k + idsSuffix}
	var cmd *redis.Cmd
	if l.clock == nil {
		cmd = refundScript.Run(ctx, l.client, keys, lim.argPer, lim.argCount, lim.argCap, l.arg(n), id, lim.argMem)
	} else {
		now := strconv.FormatInt(l.clock.Now().UnixMicro(), 10)
		cmd = refundScript.Run(ctx, l.client, keys, lim.argPer, lim.argCount, lim.argCap, l.arg(n), id, lim.argMem, now)
	}
	held, err := cmd.Int64()
	if err != nil {
		return false, fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
	}
	return held == 1, nil
}

var (
	_ throttle.Refunder = (*Local)(nil)
	_ throttle.Refunder = (*Redis)(nil)
)
