package window

import (
	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestMemoryRefund(t *testing.T) {
	throttletest.RunRefund(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder {
		l, err := NewMemory(r, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

func TestRedisRefund(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunRefund(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder {
		return newTestRedis(t, client, r, WithClock(c))
	})
}

func TestMemoryAll(t *testing.T) {
	throttletest.RunAll(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder {
		l, err := NewMemory(r, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

// TestRedisAll runs All over Redis windows on one client: the one-script
// path (AllowJoint).
func TestRedisAll(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunAll(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder {
		return newTestRedis(t, client, r, WithClock(c))
	})
}
