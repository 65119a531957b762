package window

import (
	"context"
	"testing"
	"time"

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

// TestRedisRefundForgetsHint: a refund opens room that a slot search's
// hint said was not there; the next reservation takes it, as in Memory.
func TestRedisRefundForgetsHint(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	clock := throttletest.NewClock(throttletest.T0)
	rate := throttle.Rate{Count: 2, Per: time.Second}
	mem, err := NewMemory(rate, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []throttle.Refunder{mem, newTestRedis(t, client, rate, WithClock(clock))} {
		if _, err := l.AllowN(ctx, "k", 2); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"r1", "r2", "r3", "r4", "r5", "r6"} { // slots at 1 s, 2 s, 3 s
			if d, err := l.AllowID(ctx, "k", 1, id, time.Minute); err != nil || !d.Reserved {
				t.Fatalf("%T AllowID(%s): %+v, %v", l, id, d, err)
			}
		}
		for _, id := range []string{"r3", "r4"} {
			if _, err := l.Refund(ctx, "k", 1, id); err != nil {
				t.Fatal(err)
			}
		}
		d, err := l.AllowID(ctx, "k", 1, "x", time.Minute)
		if err != nil || !d.Reserved || d.RetryAfter != 2*time.Second {
			t.Fatalf("%T: AllowID after the refunds: %+v, %v; want the freed slot at 2s", l, d, err)
		}
	}
}
