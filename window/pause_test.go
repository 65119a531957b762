package window

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestRedisPauseServerTime pauses on the Redis server's TIME: the pause
// holds for its time, then the key is admitted again, and the pause key
// is gone once it ended.
func TestRedisPauseServerTime(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	l := newTestRedis(t, client, throttle.Rate{Count: 5, Per: time.Second})
	ctx := context.Background()
	const d = 300 * time.Millisecond
	start := time.Now()
	if err := l.Pause(ctx, "k", d); err != nil {
		t.Fatal(err)
	}
	dec, err := l.Allow(ctx, "k")
	if err != nil || dec.Allowed || dec.RetryAfter <= 0 || dec.RetryAfter > d+time.Millisecond {
		t.Fatalf("while paused: %+v, %v; want a rejection with RetryAfter in (0, %v]", dec, err, d)
	}
	if p, err := l.Peek(ctx, "k", 1); err != nil || p.Allowed || p.RetryAfter <= 0 {
		t.Fatalf("Peek while paused: %+v, %v", p, err)
	}
	if left := d - time.Since(start); dec.RetryAfter < left {
		t.Fatalf("RetryAfter %v < the %v left of the pause", dec.RetryAfter, left)
	}
	time.Sleep(dec.RetryAfter)
	if dec, err = l.Allow(ctx, "k"); err != nil || !dec.Allowed {
		t.Fatalf("after the pause: %+v, %v; want admitted", dec, err)
	}
	time.Sleep(5 * time.Millisecond) // past the key's expiry (1 ms after the pause)
	if n, err := client.Exists(ctx, l.key("k")+":pause").Result(); err != nil || n != 0 {
		t.Fatalf("pause key exists = %d, %v after the pause; want it expired", n, err)
	}
}

// TestPauseDelaysReservations: a pause moves the reservations ahead later
// by as much as it grew, keeping their order and spacing; a shorter pause
// moves nothing, a longer one the difference. Back after the pause, each
// request finds its slot where it moved and claims it there. Memory and
// Redis alike, on a fake clock.
func TestPauseDelaysReservations(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 1, Per: time.Second}
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
			p := l.(throttle.Pauser)
			want := func(id string, allowed bool, retry time.Duration) {
				t.Helper()
				d, err := l.AllowID(ctx, "k", 1, id, time.Minute)
				if err != nil || d.Allowed != allowed || (!allowed && d.RetryAfter != retry) {
					t.Fatalf("%s at %v: %+v, %v; want allowed %v, retry %v", id, clock.Now().Sub(throttletest.T0), d, err, allowed, retry)
				}
			}
			want("a", true, 0)
			want("b", false, time.Second)
			want("c", false, 2*time.Second)
			if err := p.Pause(ctx, "k", 500*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if err := p.Pause(ctx, "k", 300*time.Millisecond); err != nil { // shorter: nothing moves
				t.Fatal(err)
			}
			clock.Advance(100 * time.Millisecond)
			if err := p.Pause(ctx, "k", 700*time.Millisecond); err != nil { // to T0+800ms: 300ms more
				t.Fatal(err)
			}
			clock.Set(throttletest.T0.Add(800 * time.Millisecond))
			want("b", false, time.Second)   // at T0+1.8s
			want("c", false, 2*time.Second) // at T0+2.8s
			want("d", false, 3*time.Second) // after them
			clock.Set(throttletest.T0.Add(1800 * time.Millisecond))
			want("b", true, 0)
			want("c", false, time.Second)
		})
	}
}
