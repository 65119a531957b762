package throttle_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// keyCounts returns the throttle.decisions sums by throttle.key value ("-"
// for none) and outcome.
func (tel *telemetry) keyCounts(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != throttle.DecisionsMetric {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				key := "-"
				if v, ok := dp.Attributes.Value(throttle.KeyAttr); ok {
					key = v.AsString()
				}
				outcome, _ := dp.Attributes.Value(throttle.OutcomeAttr)
				got[key+"/"+outcome.AsString()] += dp.Value
			}
		}
	}
	return got
}

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
		}, tel.keyCounts(t))
	})
	t.Run("off", func(t *testing.T) {
		tel := newTelemetry(t)
		g, err := throttle.NewGate(lim, tel.options()...)
		require.NoError(t, err)
		_, err = g.Admit(ctx, "e", 1)
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"-/admitted": 1}, tel.keyCounts(t))
	})
	t.Run("bad max", func(t *testing.T) {
		for _, max := range []int{0, throttle.MaxKeyMetrics + 1} {
			_, err := throttle.NewGate(lim, throttle.WithKeyMetrics(nil, max))
			require.ErrorIs(t, err, throttle.ErrInvalidOption)
			require.ErrorContains(t, err, "WithKeyMetrics")
		}
	})
}
