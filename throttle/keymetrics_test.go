package throttle_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestGateKeyMetrics: with WithKeyMetrics the decisions carry the key's
// label, the first max labels their own and every later one "other", so
// the attribute never has more than max + 1 values; without it, none.
func TestGateKeyMetrics(t *testing.T) {
	ctx := context.Background()
	lim := memoryWindow(t, throttle.PerSecond(1), nil)
	t.Run("bounded", func(t *testing.T) {
		tel := newTelemetry(t)
		tenant := func(key string) string { return strings.TrimPrefix(key, "tenant.") }
		g, err := throttle.NewGate(lim, append(tel.options(), throttle.WithKeyMetrics(tenant, 2))...)
		require.NoError(t, err)
		for _, key := range []string{"tenant.a", "tenant.a", "tenant.b", "tenant.c", "tenant.d", "tenant.b"} {
			_, err := g.Admit(ctx, key, 1)
			require.NoError(t, err)
		}
		require.Equal(t, map[string]int64{
			"a/admitted": 1, "a/rejected": 1,
			"b/admitted": 1, "b/rejected": 1,
			"other/admitted": 2,
		}, throttletest.Sums(t, tel.reader, throttle.DecisionsMetric, throttle.KeyAttr, throttle.OutcomeAttr))
	})
	t.Run("off", func(t *testing.T) {
		tel := newTelemetry(t)
		g, err := throttle.NewGate(lim, tel.options()...)
		require.NoError(t, err)
		_, err = g.Admit(ctx, "e", 1)
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"-/admitted": 1}, throttletest.Sums(t, tel.reader, throttle.DecisionsMetric, throttle.KeyAttr, throttle.OutcomeAttr))
	})
	t.Run("bad max", func(t *testing.T) {
		for _, max := range []int{0, throttle.MaxKeyMetrics + 1} {
			_, err := throttle.NewGate(lim, throttle.WithKeyMetrics(nil, max))
			require.ErrorIs(t, err, throttle.ErrInvalidOption)
			require.ErrorContains(t, err, "WithKeyMetrics")
		}
	})
}
