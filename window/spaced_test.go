package window

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestSpacedReservations: with WithSpacedReservations, at 4 per second,
// four admitted together at T0 are followed by reservations a quarter of
// a second apart (T0+1s, 1.25s, 1.5s, 1.75s, 2s), where without it the
// first four all take T0+1s (the bunch repeated a window later); a unit
// of cost 2 takes half a second. Claims and room now are as without it.
// Memory and Redis alike, on a fake clock.
func TestSpacedReservations(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	for _, spaced := range []bool{false, true} {
		var opts []Option
		slots := []time.Duration{1000, 1000, 1000, 1000, 2000}
		if spaced {
			opts = append(opts, WithSpacedReservations())
			slots = []time.Duration{1000, 1250, 1500, 1750, 2000}
		}
		mem, red, clock := newTwins(t, client, throttle.Rate{Count: 4, Per: time.Second}, opts...)
		for name, l := range map[string]throttle.IDLimiter{"Memory": mem, "Redis": red} {
			clock.Set(throttletest.T0)
			want := func(id string, n int, allowed bool, retry time.Duration) {
				t.Helper()
				d, err := l.AllowID(ctx, "k", n, id, time.Minute)
				if err != nil || d.Allowed != allowed || (!allowed && (!d.Reserved || d.RetryAfter != retry)) {
					t.Fatalf("%s, spaced %v: %s at %v: %+v, %v; want allowed %v, reserved in %v", name, spaced, id, clock.Now().Sub(throttletest.T0), d, err, allowed, retry)
				}
			}
			for _, id := range []string{"a", "b", "c", "d"} {
				want(id, 1, true, 0)
			}
			for i, id := range []string{"e", "f", "g", "h", "i"} {
				want(id, 1, false, slots[i]*time.Millisecond)
			}
			clock.Advance(time.Second)
			want("e", 1, true, 0) // its slot: claimed
			want("f", 1, !spaced, (slots[1]-1000)*time.Millisecond)
			if spaced {
				want("j", 2, false, 1500*time.Millisecond) // after i (T0+2s), by half a second
			}
		}
	}
}
