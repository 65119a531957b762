package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestHybridPauseElsewhere checks the bound on how late a Hybrid sees a
// pause made by another process (on a fixed clock): it spends at most the
// stock it held when the pause was made, never more, and from maxHold
// after its lease on it rejects, with the time left of the pause, without
// asking Redis again.
func TestHybridPauseElsewhere(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	prefix := freshPrefix()
	r := throttle.PerSecond(1000)
	h1 := newTestHybrid(t, c, r, 400, WithClock(clock), WithPrefix(prefix))
	h2 := newTestHybrid(t, c, r, 400, WithClock(clock), WithPrefix(prefix))

	// Demand of 1000/s makes h1 lease ahead: a stock of up to 100 tokens.
	var leasedAt time.Time
	for range 200 {
		clock.Advance(time.Millisecond)
		d, err := h1.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		settle(t, h1, "k")
		if d.Source == throttle.SourceRedis {
			leasedAt = clock.Now()
		}
	}
	settle(t, h1, "k")
	stock, _ := hybridStock(h1, "k")
	require.Positive(t, stock, "h1 holds leased tokens")
	s, e := h1.lock("k", h1.redis.lims.def)
	freshAt := e.freshAt
	s.mu.Unlock()
	if freshAt.After(leasedAt) {
		leasedAt = freshAt
	}

	const pause = 10 * time.Second
	require.NoError(t, h2.Pause(ctx, "k", pause))
	pausedAt := clock.Now()

	// h1 may spend what it holds, and nothing more.
	admitted := 0
	for range stock + 20 {
		d, err := h1.Allow(ctx, "k")
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
		settle(t, h1, "k")
	}
	require.LessOrEqual(t, admitted, stock, "admitted after the pause elsewhere")

	// From maxHold after the newest lease, h1 rejects with the pause's time.
	clock.Set(leasedAt.Add(maxHold + time.Millisecond))
	left := pause - clock.Now().Sub(pausedAt)
	d, err := h1.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed, "maxHold after the lease")
	require.Zero(t, d.Remaining)
	require.GreaterOrEqual(t, d.RetryAfter, left)
	before := h1.Stats()
	d, err = h1.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, throttle.SourceLocal, d.Source, "known paused: decided locally")
	require.Equal(t, before.Redis, h1.Stats().Redis)

	// Once the pause ends, h1 admits again.
	clock.Set(pausedAt.Add(pause))
	d, err = h1.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, d.Allowed, "after the pause")
}

// TestHybridPauseReturnsStock checks that a Hybrid's own Pause gives its
// leased stock back to Redis, so the tokens are not held idle during it.
func TestHybridPauseReturnsStock(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	h := newTestHybrid(t, c, throttle.PerSecond(1000), 400, WithClock(clock))
	for range 200 {
		clock.Advance(time.Millisecond)
		_, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		settle(t, h, "k")
	}
	stock, _ := hybridStock(h, "k")
	require.Positive(t, stock)
	inRedis := redisTokensAt(t, c, h, "k", clock.Now())
	require.NoError(t, h.Pause(ctx, "k", time.Minute))
	got, _ := hybridStock(h, "k")
	require.Zero(t, got, "stock after Pause")
	require.Eventually(t, func() bool {
		return redisTokensAt(t, c, h, "k", clock.Now()) >= inRedis+float64(stock)-1e-9
	}, 2*time.Second, time.Millisecond, "the stock went back to Redis")
}
