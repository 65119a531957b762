package window

import (
	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestRedisConformance(t *testing.T) {
	srv := redistest.Shared(t)
	client := srv.Client(t)
	throttletest.RunWindow(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Limiter {
		l, err := NewRedis(client, r, WithClock(c), WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisConformanceServerTime(t *testing.T) {
	srv := redistest.Shared(t)
	client := srv.Client(t)
	throttletest.RunWindowRealTime(t, func(t *testing.T, r throttle.Rate) throttle.Limiter {
		l, err := NewRedis(client, r, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestMemoryConformance(t *testing.T) {
	throttletest.RunWindow(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Limiter {
		l, err := NewMemory(r, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestMemoryConformanceSystemClock(t *testing.T) {
	throttletest.RunWindowRealTime(t, func(t *testing.T, r throttle.Rate) throttle.Limiter {
		l, err := NewMemory(r)
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestMemoryReservations(t *testing.T) {
	throttletest.RunWindowReservations(t, func(t *testing.T, r throttle.Rate, _ int, c throttle.Clock) throttle.IDLimiter {
		l, err := NewMemory(r, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisReservations(t *testing.T) {
	srv := redistest.Shared(t)
	client := srv.Client(t)
	throttletest.RunWindowReservations(t, func(t *testing.T, r throttle.Rate, _ int, c throttle.Clock) throttle.IDLimiter {
		l, err := NewRedis(client, r, WithClock(c), WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestMemoryQuotas(t *testing.T) {
	throttletest.RunWindowQuotas(t, func(t *testing.T, r throttle.Rate, q throttle.QuotaFunc, c throttle.Clock) throttle.Limiter {
		l, err := NewMemory(r, WithClock(c), WithQuotas(q))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisQuotas(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunWindowQuotas(t, func(t *testing.T, r throttle.Rate, q throttle.QuotaFunc, c throttle.Clock) throttle.Limiter {
		return newTestRedis(t, client, r, WithClock(c), WithQuotas(q))
	})
}

func TestMemoryPeekReset(t *testing.T) {
	throttletest.RunPeekReset(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttletest.PeekResetter {
		l, err := NewMemory(r, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisPeekReset(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunPeekReset(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttletest.PeekResetter {
		return newTestRedis(t, client, r, WithClock(c))
	})
}

func TestMemoryPause(t *testing.T) {
	throttletest.RunPause(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) (throttle.Pauser, throttle.Pauser) {
		l, err := NewMemory(r, WithClock(c))
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
		l := newTestRedis(t, client, r, WithClock(c), WithPrefix(prefix))
		peer := newTestRedis(t, client, r, WithClock(c), WithPrefix(prefix))
		return l, peer
	})
}
