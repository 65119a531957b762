package bucket

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// quotaMap is a QuotaFunc over a map that tests change.
type quotaMap struct {
	mu sync.Mutex
	m  map[string]throttle.Quota
}

func (q *quotaMap) set(key string, v throttle.Quota) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = map[string]throttle.Quota{}
	}
	q.m[key] = v
}

func (q *quotaMap) get(key string) throttle.Quota {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.m[key]
}

// TestQuotasAllowID: reservations and ids follow the key's quota.
func TestQuotasAllowID(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	for _, kind := range []string{"local", "redis"} {
		t.Run(kind, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			var q quotaMap
			q.set("k", throttle.Quota{Rate: throttle.PerSecond(2)})
			opts := []Option{WithClock(clock), WithQuotas(q.get)}
			var l throttle.IDLimiter
			var err error
			if kind == "local" {
				l, err = NewLocal(throttle.PerSecond(100), 100, opts...)
			} else {
				l, err = NewRedis(client, throttle.PerSecond(100), 100, append(opts, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))...)
			}
			require.NoError(t, err)
			mustAllowID(t, l, "k", "a", 1, time.Second, true, false)
			mustAllowID(t, l, "k", "b", 1, time.Second, true, false)
			d := mustAllowID(t, l, "k", "c", 1, time.Second, false, true)
			assert.Equal(t, 500*time.Millisecond, d.RetryAfter)
			assert.Equal(t, 2, d.Limit)
			// Per changes while in debt: -0.5 tokens count as -1 at 4/2s.
			q.set("k", throttle.Quota{Rate: throttle.Rate{Count: 4, Per: 2 * time.Second}})
			d = mustAllowID(t, l, "k", "d", 1, time.Second, false, true)
			assert.Equal(t, time.Second, d.RetryAfter)
			assert.Equal(t, 4, d.Limit)
		})
	}
}

// TestHybridQuotaShrinks: a Hybrid holding stock for a key whose quota
// shrinks admits no more than the new burst.
func TestHybridQuotaShrinks(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	clock := throttletest.NewClock(throttletest.T0)
	var q quotaMap
	h := newTestHybrid(t, c, throttle.PerSecond(100), 100, WithClock(clock), WithQuotas(q.get))
	ctx := context.Background()
	for range 50 {
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		clock.Advance(time.Millisecond)
		settle(t, h, "k")
	}
	stock, _ := hybridStock(h, "k")
	require.Greater(t, stock, 5, "the check needs stock beyond the new burst")

	q.set("k", throttle.Quota{Rate: throttle.PerSecond(5)})
	admitted := 0
	for range 50 {
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
		assert.Equal(t, 5, d.Limit)
		settle(t, h, "k")
	}
	assert.Equal(t, 5, admitted, "the new burst, on a clock that stands still")

	// Grown again: the refill comes at the new rate, up to the new burst.
	q.set("k", throttle.Quota{Rate: throttle.PerSecond(50), Burst: 60})
	clock.Advance(time.Second)
	admitted = 0
	for range 100 {
		d, err := h.Allow(ctx, "k")
		require.NoError(t, err)
		if d.Allowed {
			admitted++
		}
		settle(t, h, "k")
	}
	// Not all of it: with demand above the refill, the Hybrid waits for a
	// batch (150 ms of refill, 7 tokens) before it asks Redis again.
	stock, _ = hybridStock(h, "k")
	assert.InDelta(t, 50, float64(admitted+stock)+redisTokensAt(t, c, h, "k", clock.Now()), 1e-9, "1 s at 50/s")
	assert.GreaterOrEqual(t, admitted, 50-7)
}

// TestRedisQuotasCoalesced: decisions queued behind a flush go in one
// script call per key, each key under its own quota.
func TestRedisQuotasCoalesced(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	var q quotaMap
	q.set("small", throttle.Quota{Rate: throttle.PerSecond(5)})
	l, _ := newTestRedis(t, throttle.PerSecond(100), 100, WithClock(clock), WithQuotas(q.get))
	ctx := context.Background()
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for i := range 200 {
		key := []string{"small", "big"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := l.AllowN(ctx, key, 1)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if d.Allowed {
				admitted[key]++
			}
			if want := map[string]int{"small": 5, "big": 100}[key]; d.Limit != want {
				t.Errorf("%s: Limit %d, want %d", key, d.Limit, want)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, map[string]int{"small": 5, "big": 100}, admitted)
}
