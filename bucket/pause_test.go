package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestRedisPauseServerTime pauses on the Redis server's TIME: AllowN and
// AllowID are refused for the pause's time, reserving nothing, then the
// key is admitted again.
func TestRedisPauseServerTime(t *testing.T) {
	l, _ := newTestRedis(t, throttle.PerSecond(5), 5)
	ctx := context.Background()
	const d = 300 * time.Millisecond
	start := time.Now()
	require.NoError(t, l.Pause(ctx, "k", d))
	dec, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, dec.Allowed)
	require.Zero(t, dec.Remaining)
	require.LessOrEqual(t, dec.RetryAfter, d+time.Millisecond)
	require.GreaterOrEqual(t, dec.RetryAfter, d-time.Since(start))
	id, err := l.AllowID(ctx, "k", 1, "id", time.Minute)
	require.NoError(t, err)
	require.False(t, id.Allowed)
	require.False(t, id.Reserved, "a paused key reserves nothing")
	require.Positive(t, id.RetryAfter)
	time.Sleep(max(dec.RetryAfter, id.RetryAfter))
	for i := range 5 { // the whole burst: nothing was taken meanwhile
		dec, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, dec.Allowed, "after the pause, %d", i)
	}
}
