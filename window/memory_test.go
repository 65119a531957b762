package window_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

func TestMemoryEvictsIdleKeys(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	m, err := window.NewMemory(throttle.PerSecond(1), window.WithClock(clock))
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 10_000 {
		_, err := m.Allow(ctx, fmt.Sprint("key-", i))
		require.NoError(t, err)
	}
	require.Equal(t, 10_000, m.Len())

	// Still inside the window: every key's admission is still counted.
	clock.Advance(999 * time.Millisecond)
	d, err := m.Allow(ctx, "key-1")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, time.Millisecond, d.RetryAfter)

	// Two windows later, one call in each shard sweeps the idle keys.
	clock.Advance(2 * time.Second)
	for i := range 1000 {
		_, err := m.Allow(ctx, fmt.Sprint("fresh-", i))
		require.NoError(t, err)
	}
	require.LessOrEqual(t, m.Len(), 1000, "idle keys must be evicted")
	require.GreaterOrEqual(t, m.Len(), 1000-1, "keys in their window must stay")
}

func TestMemoryConcurrentNeverOverAdmits(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	const limit = 50
	m, err := window.NewMemory(throttle.Rate{Count: limit, Per: time.Second}, window.WithClock(clock))
	require.NoError(t, err)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				d, err := m.Allow(context.Background(), "shared")
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, limit, admitted, "the clock stood still: exactly Count admissions")
}

func ExampleMemory() {
	clock := throttletest.NewClock(throttletest.T0)
	m, _ := window.NewMemory(throttle.Rate{Count: 2, Per: time.Second}, window.WithClock(clock))
	ctx := context.Background()
	for _, at := range []time.Duration{0, 200 * time.Millisecond, 500 * time.Millisecond, 999 * time.Millisecond, time.Second} {
		clock.Set(throttletest.T0.Add(at))
		d, _ := m.Allow(ctx, "tenant-a")
		fmt.Printf("t=%v allowed=%v retry-after=%v reset-after=%v\n", at, d.Allowed, d.RetryAfter, d.ResetAfter)
	}
	// Output:
	// t=0s allowed=true retry-after=0s reset-after=1s
	// t=200ms allowed=true retry-after=0s reset-after=1s
	// t=500ms allowed=false retry-after=500ms reset-after=700ms
	// t=999ms allowed=false retry-after=1ms reset-after=201ms
	// t=1s allowed=true retry-after=0s reset-after=1s
}

func TestWindowTooLong(t *testing.T) {
	for _, per := range []time.Duration{math.MaxInt64, 143 * 365 * 24 * time.Hour} {
		_, err := window.NewMemory(throttle.Rate{Count: 1, Per: per})
		var oe *throttle.OptionError
		require.ErrorAs(t, err, &oe)
		require.Equal(t, "Rate.Per", oe.Field)
	}
	m, err := window.NewMemory(throttle.Rate{Count: 1, Per: 100 * 365 * 24 * time.Hour})
	require.NoError(t, err)
	for i, want := range []bool{true, false} {
		d, err := m.Allow(context.Background(), "k")
		require.NoError(t, err)
		require.Equal(t, want, d.Allowed, "call %d", i)
	}
}
