package throttle_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		want  throttle.Rate
		field string // non-empty: an error naming this field
	}{
		{name: "bare second", in: "100/s", want: throttle.PerSecond(100)},
		{name: "minute", in: "100/1m", want: throttle.PerMinute(100)},
		{name: "bare hour", in: "7/h", want: throttle.PerHour(7)},
		{name: "milliseconds", in: "5/250ms", want: throttle.Rate{Count: 5, Per: 250 * time.Millisecond}},
		{name: "bare millisecond", in: "1/ms", want: throttle.Rate{Count: 1, Per: time.Millisecond}},
		{name: "spaces", in: " 20 / 1s ", want: throttle.PerSecond(20)},
		{name: "no slash", in: "100", field: "Rate"},
		{name: "count not a number", in: "x/s", field: "Rate.Count"},
		{name: "zero count", in: "0/s", field: "Rate.Count"},
		{name: "negative count", in: "-1/s", field: "Rate.Count"},
		{name: "bad period", in: "10/fortnight", field: "Rate.Per"},
		{name: "zero period", in: "10/0s", field: "Rate.Per"},
		{name: "negative period", in: "10/-1s", field: "Rate.Per"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := throttle.ParseRate(tt.in)
			if tt.field == "" {
				require.NoError(t, err)
				require.Equal(t, tt.want, got)
				back, err := throttle.ParseRate(got.String())
				require.NoError(t, err)
				require.Equal(t, got, back, "String must round-trip through ParseRate")
				return
			}
			require.ErrorIs(t, err, throttle.ErrInvalidOption)
			var oe *throttle.OptionError
			require.True(t, errors.As(err, &oe))
			require.Equal(t, tt.field, oe.Field)
		})
	}
}

func TestCeilMillisecond(t *testing.T) {
	for _, tt := range []struct{ in, want time.Duration }{
		{-time.Second, 0},
		{0, 0},
		{1, time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{time.Millisecond + 1, 2 * time.Millisecond},
		{999*time.Millisecond + 999*time.Microsecond, time.Second},
	} {
		require.Equal(t, tt.want, throttle.CeilMillisecond(tt.in), "CeilMillisecond(%v)", tt.in)
	}
}

func TestCheckCost(t *testing.T) {
	require.NoError(t, throttle.CheckCost(1, 1))
	require.NoError(t, throttle.CheckCost(10, 10))
	for _, n := range []int{-1, 0, 11} {
		err := throttle.CheckCost(n, 10)
		require.ErrorIs(t, err, throttle.ErrInvalidCost, "n=%d", n)
		require.True(t, throttle.IsUsageError(err))
	}
}

func TestLimitedError(t *testing.T) {
	var err error = &throttle.LimitedError{Key: "k", Decision: throttle.Decision{RetryAfter: 300 * time.Millisecond}}
	require.ErrorIs(t, err, throttle.ErrLimited)
	var le *throttle.LimitedError
	require.ErrorAs(t, err, &le)
	require.Equal(t, 300*time.Millisecond, le.RetryAfter())
	require.Contains(t, err.Error(), "300ms")
	require.NotErrorIs(t, errors.New("other"), throttle.ErrLimited)
}

func TestSourceString(t *testing.T) {
	require.Equal(t, "local", throttle.SourceLocal.String())
	require.Equal(t, "redis", throttle.SourceRedis.String())
	require.Equal(t, "degraded", throttle.SourceDegraded.String())
	require.Equal(t, "unknown", throttle.Source(0).String())
}

func TestRatePerMicros(t *testing.T) {
	for _, tt := range []struct {
		per  time.Duration
		want int64
	}{
		{1, 1},
		{time.Microsecond, 1},
		{time.Microsecond + 1, 2},
		{time.Second, 1_000_000},
		{math.MaxInt64, math.MaxInt64/1000 + 1}, // no overflow to a tiny window
	} {
		require.Equal(t, tt.want, throttle.Rate{Count: 1, Per: tt.per}.PerMicros(), "Per %d", tt.per)
	}
}

func TestSystemClockFollowsTheWallClock(t *testing.T) {
	for range 3 {
		before := time.Now()
		got := throttle.SystemClock.Now()
		after := time.Now()
		require.False(t, got.Before(before.Add(-time.Millisecond)), "SystemClock %v before time.Now %v", got, before)
		require.False(t, got.After(after.Add(time.Millisecond)), "SystemClock %v after time.Now %v", got, after)
		time.Sleep(10 * time.Millisecond)
	}
	a := throttle.SystemClock.Now()
	b := throttle.SystemClock.Now()
	require.False(t, b.Before(a), "never backwards")
}
