package bucket

import (
	"context"

	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestLocalConformance(t *testing.T) {
	throttletest.RunBucket(t, func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.Limiter {
		l, err := NewLocal(r, burst, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestLocalConformanceSystemClock(t *testing.T) {
	throttletest.RunBucketRealTime(t, func(t *testing.T, r throttle.Rate, burst int) throttle.Limiter {
		l, err := NewLocal(r, burst)
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisConformance(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunBucket(t, func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.Limiter {
		l, err := NewRedis(client, r, burst, WithClock(c), WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

// TestRedisConformanceServerTime runs with the Redis server's TIME, at a
// short real period (10 per 200ms).
func TestRedisConformanceServerTime(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunBucketRealTime(t, func(t *testing.T, r throttle.Rate, burst int) throttle.Limiter {
		l, err := NewRedis(client, r, burst, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestLocalReservations(t *testing.T) {
	throttletest.RunBucketReservations(t, func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.IDLimiter {
		l, err := NewLocal(r, burst, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisReservations(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunBucketReservations(t, func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.IDLimiter {
		l, err := NewRedis(client, r, burst, WithClock(c), WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestLocalQuotas(t *testing.T) {
	throttletest.RunBucketQuotas(t, func(t *testing.T, r throttle.Rate, burst int, q throttle.QuotaFunc, c throttle.Clock) throttle.Limiter {
		l, err := NewLocal(r, burst, WithClock(c), WithQuotas(q))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisQuotas(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunBucketQuotas(t, func(t *testing.T, r throttle.Rate, burst int, q throttle.QuotaFunc, c throttle.Clock) throttle.Limiter {
		l, err := NewRedis(client, r, burst, WithClock(c), WithQuotas(q), WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestLocalPeekReset(t *testing.T) {
	throttletest.RunPeekReset(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttletest.PeekResetter {
		l, err := NewLocal(r, r.Count, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisPeekReset(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunPeekReset(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttletest.PeekResetter {
		l, err := NewRedis(client, r, r.Count, WithClock(c), WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

// settledHybrid is a Hybrid whose AllowN returns once no lease is in
// flight for the key, so that a background refresh cannot land between a
// Peek and the next decision of a table.
type settledHybrid struct {
	*Hybrid
	t *testing.T
}

func (h settledHybrid) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	d, err := h.Hybrid.AllowN(ctx, key, n)
	settle(h.t, h.Hybrid, key)
	return d, err
}

func TestHybridPeekReset(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunPeekReset(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttletest.PeekResetter {
		return settledHybrid{newTestHybrid(t, client, r, r.Count, WithClock(c)), t}
	})
}

func TestLocalPause(t *testing.T) {
	throttletest.RunPause(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) (throttle.Pauser, throttle.Pauser) {
		l, err := NewLocal(r, r.Count, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l, nil
	})
}

func TestRedisPause(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunPause(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) (throttle.Pauser, throttle.Pauser) {
		prefix := freshPrefix()
		var ls [2]throttle.Pauser
		for i := range ls {
			l, err := NewRedis(client, r, r.Count, WithClock(c), WithPrefix(prefix), WithTimeout(redistest.CallTimeout))
			if err != nil {
				t.Fatal(err)
			}
			ls[i] = l
		}
		return ls[0], ls[1]
	})
}

func TestHybridPause(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunPause(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) (throttle.Pauser, throttle.Pauser) {
		prefix := freshPrefix()
		return newTestHybrid(t, client, r, r.Count, WithClock(c), WithPrefix(prefix)),
			newTestHybrid(t, client, r, r.Count, WithClock(c), WithPrefix(prefix))
	})
}
