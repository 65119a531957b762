package throttletest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// PeekResetter is a limiter that can tell what AllowN would say without
// charging (Peek) and forget a key (Reset). If it is also a
// throttle.IDLimiter, RunPeekReset mixes reservations in.
type PeekResetter interface {
	throttle.Limiter
	Peek(ctx context.Context, key string, n int) (throttle.Decision, error)
	Reset(ctx context.Context, key string) error
}

// RunPeekReset checks Peek and Reset on random schedules of admissions and
// (for a throttle.IDLimiter) reservations, at fixed instants through the
// Clock, at 4 per second (a token bucket's burst is 4): Peek always says what
// the AllowN right after it says, and charges nothing (two Peeks agree, and
// a Peek between two decisions changes neither); Reset puts a key back to
// its initial state, and an unknown key resets without an error.
func RunPeekReset(t *testing.T, newLimiter func(t *testing.T, r throttle.Rate, c throttle.Clock) PeekResetter) {
	t.Helper()
	ctx := context.Background()
	r := throttle.Rate{Count: 4, Per: time.Second}
	t.Run("Peek says what AllowN says", func(t *testing.T) {
		clock := NewClock(T0)
		l := newLimiter(t, r, clock)
		ids, _ := l.(throttle.IDLimiter)
		rng := rand.New(rand.NewPCG(3, 4))
		at := time.Duration(0)
		for i := range 300 {
			at += time.Duration(rng.IntN(200_000)) * time.Microsecond
			clock.Set(T0.Add(at))
			n := 1 + rng.IntN(3)
			if rng.IntN(2) == 0 && ids != nil {
				// Reservations and claims, so Peek sees a schedule ahead.
				if _, err := ids.AllowID(ctx, "peek", n, fmt.Sprint("id-", rng.IntN(40)), 3*time.Second); err != nil {
					t.Fatal(err)
				}
				continue
			}
			p1, err1 := l.Peek(ctx, "peek", n)
			p2, err2 := l.Peek(ctx, "peek", n)
			d, err := l.AllowN(ctx, "peek", n)
			if err1 != nil || err2 != nil || err != nil {
				t.Fatalf("step %d: errors %v, %v, %v", i, err1, err2, err)
			}
			p1.Source, p2.Source, d.Source = 0, 0, 0
			if p1 != p2 || p1 != d {
				t.Fatalf("step %d at %v (n %d):\n peek   %s\n peek   %s\n AllowN %s", i, at, n, fmtDecision(p1), fmtDecision(p2), fmtDecision(d))
			}
		}
	})
	t.Run("Reset", func(t *testing.T) {
		clock := NewClock(T0)
		l := newLimiter(t, r, clock)
		for range 4 {
			if _, err := l.AllowN(ctx, "reset", 1); err != nil {
				t.Fatal(err)
			}
		}
		if ids, ok := l.(throttle.IDLimiter); ok {
			if _, err := ids.AllowID(ctx, "reset", 1, "reserved", time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Reset(ctx, "reset"); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		d, err := l.AllowN(ctx, "reset", 4)
		if err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("after Reset: %s, %v; want 4 units admitted, Remaining 0", fmtDecision(d), err)
		}
		if err := l.Reset(ctx, "never seen"); err != nil {
			t.Fatalf("Reset of an unknown key: %v", err)
		}
	})
}
