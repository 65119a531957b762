package bucket

import (
	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestLocalRefund(t *testing.T) {
	throttletest.RunRefund(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder {
		l, err := NewLocal(r, r.Count, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisRefund(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunRefund(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder {
		l, err := NewRedis(client, r, r.Count, WithClock(c), WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestLocalAll(t *testing.T) {
	throttletest.RunAll(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder {
		l, err := NewLocal(r, r.Count, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisAll(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunAll(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder {
		l, err := NewRedis(client, r, r.Count, WithClock(c), WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}
