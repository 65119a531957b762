package window

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// replanner is the window that thins reservations ahead.
type replanner interface {
	throttle.IDLimiter
	Replan(ctx context.Context, key string) (int, error)
}

// TestReplan: after the key's limit went down (4 to 2 per second), the
// reservations ahead are thinned to it in slot order, each whole: of those
// at T0+1s the first two units stay (a reservation of cost 2) and the
// rest go; the one at T0+2s fits and stays; admissions stay. A request
// whose reservation went is planned again when it comes back, after
// those kept. Memory and Redis alike, on a fake clock.
func TestReplan(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 4, Per: time.Second}
	var limit atomic.Int64
	quotas := WithQuotas(func(string) throttle.Quota {
		return throttle.Quota{Rate: throttle.Rate{Count: int(limit.Load()), Per: time.Second}}
	})
	for name, build := range map[string]func(c throttle.Clock) replanner{
		"Memory": func(c throttle.Clock) replanner {
			m, err := NewMemory(r, WithClock(c), quotas)
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
		"Redis": func(c throttle.Clock) replanner { return newTestRedis(t, client, r, WithClock(c), quotas) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clock := throttletest.NewClock(throttletest.T0)
			limit.Store(4)
			l := build(clock)
			want := func(id string, n int, allowed bool, retry time.Duration) {
				t.Helper()
				d, err := l.AllowID(ctx, "k", n, id, time.Minute)
				if err != nil || d.Allowed != allowed || (!allowed && (!d.Reserved || d.RetryAfter != retry)) {
					t.Fatalf("%s: %+v, %v; want allowed %v, reserved at %v", id, d, err, allowed, retry)
				}
			}
			for _, id := range []string{"a", "b", "c", "d"} {
				want(id, 1, true, 0)
			}
			want("e", 2, false, time.Second)
			want("f", 1, false, time.Second)
			want("g", 1, false, time.Second)
			want("h", 1, false, 2*time.Second)
			limit.Store(2)
			n, err := l.Replan(ctx, "k")
			if err != nil || n != 2 {
				t.Fatalf("Replan: %d, %v; want f and g dropped (2 units), e and h kept", n, err)
			}
			want("e", 2, false, time.Second)   // kept
			want("h", 1, false, 2*time.Second) // kept
			want("a", 1, true, 0)              // still admitted
			want("f", 1, false, 2*time.Second) // planned again: beside h
			want("g", 1, false, 3*time.Second)
			if n, err := l.Replan(ctx, "k"); err != nil || n != 0 {
				t.Fatalf("Replan again: %d, %v; want nothing more to drop", n, err)
			}
			if n, err := l.Replan(ctx, "unknown"); err != nil || n != 0 {
				t.Fatalf("Replan(unknown): %d, %v", n, err)
			}
		})
	}
}
