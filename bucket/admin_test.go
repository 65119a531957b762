package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestRedisPeekWritesNothing: Peek creates no key, changes no field and
// renews no expiry.
func TestRedisPeekWritesNothing(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, client := newTestRedis(t, throttle.PerSecond(10), 10, WithClock(clock))
	ctx := ctxT(t)
	k := rediskey.Key(l.prefix, "k")

	d, err := l.Peek(ctx, "k", 10)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Zero(t, client.Exists(ctx, k).Val(), "Peek of an unknown key created it")

	_, err = l.AllowN(ctx, "k", 5) // expires in 500 ms
	require.NoError(t, err)
	before := client.Get(ctx, k).Val()
	time.Sleep(100 * time.Millisecond)
	for range 3 {
		d, err = l.Peek(ctx, "k", 5)
		require.NoError(t, err)
		assert.True(t, d.Allowed)
		assert.Equal(t, 0, d.Remaining)
	}
	assert.Equal(t, before, client.Get(ctx, k).Val())
	ttl := client.PTTL(ctx, k).Val()
	assert.Less(t, ttl, 450*time.Millisecond, "an expiry set 100 ms ago for 500 ms was renewed")
}

func TestLocalPeekKeepsNoState(t *testing.T) {
	l, err := NewLocal(throttle.PerSecond(10), 10)
	require.NoError(t, err)
	d, err := l.Peek(context.Background(), "k", 3)
	require.NoError(t, err)
	assert.True(t, d.Allowed)
	assert.Equal(t, 7, d.Remaining)
	assert.Zero(t, l.Len(), "Peek of an unknown key made state for it")
}

// TestHybridPeekLeasesNothing: a Peek neither spends the stock nor leases
// from Redis, and a Reset drops the stock without returning it.
func TestHybridPeekLeasesNothing(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	clock := throttletest.NewClock(throttletest.T0)
	h := newTestHybrid(t, c, throttle.PerSecond(100), 100, WithClock(clock))
	ctx := context.Background()
	for range 50 { // builds a demand estimate, so leases are taken ahead
		_, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		clock.Advance(time.Millisecond)
		settle(t, h, "k")
	}
	stock, _ := hybridStock(h, "k")
	require.Greater(t, stock, 1)
	tokens, ts := redisBucket(t, c, h, "k")
	st := h.Stats()
	for _, n := range []int{1, stock, stock + 1, 100} {
		_, err := h.Peek(ctx, "k", n)
		require.NoError(t, err)
	}
	settle(t, h, "k")
	after, _ := hybridStock(h, "k")
	assert.Equal(t, stock, after)
	tokens2, ts2 := redisBucket(t, c, h, "k")
	assert.Equal(t, tokens, tokens2)
	assert.Equal(t, ts, ts2)
	assert.Equal(t, st, h.Stats(), "Peek is not a decision")

	require.NoError(t, h.Reset(ctx, "k"))
	require.NoError(t, h.Reset(ctx, "never seen"))
	stock, _ = hybridStock(h, "k")
	assert.Zero(t, stock)
	assert.Zero(t, c.Exists(ctx, rediskey.Key(h.redis.prefix, "k")).Val())
	d, err := h.AllowN(ctx, "k", 100)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "full again after Reset")
}
