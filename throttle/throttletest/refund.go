package throttletest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// NewRefunderFunc returns the Refunder under test, enforcing r (a token
// bucket with a burst of r.Count) and reading time from c, with no state
// for any key.
type NewRefunderFunc func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Refunder

// RunRefund checks throttle.Refunder at fixed instants: a refunded
// admission is room again, exactly once and exactly its own cost; a
// refunded reservation frees its slot; refunding what holds nothing (an
// unknown id or key, twice the same id) reports false and gives nothing;
// a refunded id is a new request; a bad cost is an error wrapping
// throttle.ErrInvalidCost. Rules that hold for windows and token buckets
// alike, with a burst equal to Count.
func RunRefund(t *testing.T, newLimiter NewRefunderFunc) {
	t.Helper()
	ctx := context.Background()
	r := throttle.Rate{Count: 4, Per: time.Second}
	allow := func(t *testing.T, l throttle.Refunder, key string, n int, want bool) {
		t.Helper()
		d, err := l.AllowN(ctx, key, n)
		if err != nil || d.Allowed != want {
			t.Fatalf("AllowN(%q, %d) = %s, %v; want Allowed %v", key, n, fmtDecision(d), err, want)
		}
	}
	allowID := func(t *testing.T, l throttle.Refunder, key string, n int, id string, want bool) {
		t.Helper()
		d, err := l.AllowID(ctx, key, n, id, 0)
		if err != nil || d.Allowed != want {
			t.Fatalf("AllowID(%q, %d, %q) = %s, %v; want Allowed %v", key, n, id, fmtDecision(d), err, want)
		}
	}
	refund := func(t *testing.T, l throttle.Refunder, key string, n int, id string, want bool) {
		t.Helper()
		held, err := l.Refund(ctx, key, n, id)
		if err != nil || held != want {
			t.Fatalf("Refund(%q, %d, %q) = %v, %v; want %v, nil", key, n, id, held, err, want)
		}
	}

	t.Run("a refunded admission is room again, once", func(t *testing.T) {
		l := newLimiter(t, r, NewClock(T0))
		allow(t, l, "k", 2, true)
		allowID(t, l, "k", 1, "x", true)
		allowID(t, l, "k", 1, "y", true)
		allow(t, l, "k", 1, false)
		refund(t, l, "k", 1, "x", true)
		refund(t, l, "k", 1, "x", false) // twice gives back once
		allow(t, l, "k", 1, true)        // x's unit, and only it
		allow(t, l, "k", 1, false)
		// y was not touched: still admitted, not charged again.
		allowID(t, l, "k", 1, "y", true)
		allow(t, l, "k", 1, false)
	})
	t.Run("the cost of the id", func(t *testing.T) {
		l := newLimiter(t, r, NewClock(T0))
		allowID(t, l, "k", 3, "big", true)
		allow(t, l, "k", 1, true)
		allow(t, l, "k", 1, false)
		refund(t, l, "k", 3, "big", true)
		allow(t, l, "k", 3, true)
		allow(t, l, "k", 1, false)
	})
	t.Run("a refunded id is a new request", func(t *testing.T) {
		l := newLimiter(t, r, NewClock(T0))
		allowID(t, l, "k", 4, "x", true)
		refund(t, l, "k", 4, "x", true)
		allowID(t, l, "k", 4, "x", true) // charged anew
		allow(t, l, "k", 1, false)
	})
	t.Run("a refunded reservation frees its slot", func(t *testing.T) {
		clock := NewClock(T0)
		l := newLimiter(t, throttle.Rate{Count: 2, Per: time.Second}, clock)
		allow(t, l, "k", 2, true)
		d, err := l.AllowID(ctx, "k", 1, "r", 5*time.Second)
		if err != nil || !d.Reserved {
			t.Fatalf("AllowID with a horizon = %s, %v; want Reserved", fmtDecision(d), err)
		}
		refund(t, l, "k", 1, "r", true)
		clock.Set(T0.Add(time.Second))
		allow(t, l, "k", 2, true) // the reservation would have held one unit
	})
	t.Run("nothing held", func(t *testing.T) {
		l := newLimiter(t, r, NewClock(T0))
		refund(t, l, "never seen", 1, "x", false)
		allow(t, l, "k", 4, true)
		refund(t, l, "k", 1, "x", false)
		allow(t, l, "k", 1, false) // nothing given back
	})
	t.Run("keys are independent", func(t *testing.T) {
		l := newLimiter(t, r, NewClock(T0))
		allowID(t, l, "a", 4, "x", true)
		allowID(t, l, "b", 4, "x", true)
		refund(t, l, "a", 4, "x", true)
		allow(t, l, "a", 4, true)
		allow(t, l, "b", 1, false)
	})
	t.Run("bad cost", func(t *testing.T) {
		l := newLimiter(t, r, NewClock(T0))
		for _, n := range []int{0, -1} {
			if _, err := l.Refund(ctx, "k", n, "x"); !errors.Is(err, throttle.ErrInvalidCost) {
				t.Fatalf("Refund(n=%d) error = %v; want ErrInvalidCost", n, err)
			}
		}
	})
}
