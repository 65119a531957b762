package throttle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

func TestGatePause(t *testing.T) {
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	l, err := window.NewMemory(throttle.Rate{Count: 5, Per: time.Second}, window.WithClock(clock))
	require.NoError(t, err)
	g, err := throttle.NewGate(l)
	require.NoError(t, err)

	require.NoError(t, g.Pause(ctx, "k", 2*time.Second))
	d, err := g.AdmitID(ctx, "k", 1, "id")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.False(t, d.Reserved)
	require.Equal(t, 2*time.Second, d.RetryAfter)
	d, err = g.Admit(ctx, "other", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed, "another key")

	var oe *throttle.OptionError
	require.ErrorAs(t, g.Pause(ctx, "k", 0), &oe)
	require.Equal(t, "d", oe.Field)

	clock.Advance(2 * time.Second)
	d, err = g.Admit(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed, "after the pause")
}

func TestGatePauseUnsupported(t *testing.T) {
	g, err := throttle.NewGate(throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{Allowed: true}, nil
	}))
	require.NoError(t, err)
	err = g.Pause(context.Background(), "k", time.Second)
	require.True(t, errors.Is(err, throttle.ErrCannotPause), "%v", err)

	var zero *throttle.Gate
	require.ErrorIs(t, zero.Pause(context.Background(), "k", time.Second), throttle.ErrInvalidOption)
}
