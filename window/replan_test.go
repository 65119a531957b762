package window

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// replanner is the window that drops reservations ahead.
type replanner interface {
	throttle.IDLimiter
	DropReservations(ctx context.Context, key string) (int, error)
}

// TestDropReservations: the reservations ahead go (admissions stay), so a
// new request after a limit went down is planned from what was admitted;
// a request whose reservation was dropped is planned again when it comes
// back. Memory and Redis alike, on a fake clock.
func TestDropReservations(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 2, Per: time.Second}
	for name, build := range map[string]func(c throttle.Clock) replanner{
		"Memory": func(c throttle.Clock) replanner {
			m, err := NewMemory(r, WithClock(c))
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
		"Redis": func(c throttle.Clock) replanner { return newTestRedis(t, client, r, WithClock(c)) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clock := throttletest.NewClock(throttletest.T0)
			l := build(clock)
			want := func(id string, allowed bool, retry time.Duration) {
				t.Helper()
				d, err := l.AllowID(ctx, "k", 1, id, time.Minute)
				if err != nil || d.Allowed != allowed || (!allowed && (!d.Reserved || d.RetryAfter != retry)) {
					t.Fatalf("%s: %+v, %v; want allowed %v, reserved at %v", id, d, err, allowed, retry)
				}
			}
			want("a", true, 0)
			want("b", true, 0)
			want("c", false, time.Second)
			want("d", false, time.Second)
			want("e", false, 2*time.Second)
			n, err := l.DropReservations(ctx, "k")
			if err != nil || n != 3 {
				t.Fatalf("DropReservations: %d, %v; want the 3 reserved units", n, err)
			}
			want("f", false, time.Second) // planned from the admissions alone
			want("a", true, 0)            // still admitted
			clock.Advance(time.Second)
			want("c", true, 0) // planned again on its return: room at T0+1s beside f
			want("d", false, time.Second)
			if n, err := l.DropReservations(ctx, "unknown"); err != nil || n != 0 {
				t.Fatalf("DropReservations(unknown): %d, %v", n, err)
			}
		})
	}
}
