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
// reservations ahead are planned again at it in slot order, each whole,
// spread by their share of the window (500 ms a unit): e (2 units) keeps
// T0+1s, f and g move from T0+1s to T0+2s and T0+2.5s, h from T0+2s to
// T0+3s; admissions stay. Planned again, nothing moves. At a limit of 1,
// e's 2 units never fit and go, and f, g and h spread a second apart.
// Memory and Redis alike, on a fake clock.
func TestReplan(t *testing.T) {
	testReplan(t, func(t *testing.T, l replanner, limit *atomic.Int64, want func(id string, n int, allowed bool, retry time.Duration)) {
		ctx := context.Background()
		for _, id := range []string{"a", "b", "c", "d"} {
			want(id, 1, true, 0)
		}
		want("e", 2, false, time.Second)
		want("f", 1, false, time.Second)
		want("g", 1, false, time.Second)
		want("h", 1, false, 2*time.Second)
		limit.Store(2)
		if n, err := l.Replan(ctx, "k"); err != nil || n != 3 {
			t.Fatalf("Replan: %d, %v; want f, g and h moved (3 units)", n, err)
		}
		want("e", 2, false, time.Second)
		want("f", 1, false, 2*time.Second)
		want("g", 1, false, 2500*time.Millisecond)
		want("h", 1, false, 3*time.Second)
		want("a", 1, true, 0) // still admitted
		if n, err := l.Replan(ctx, "k"); err != nil || n != 0 {
			t.Fatalf("Replan again: %d, %v; want nothing more to move", n, err)
		}
		if n, err := l.Replan(ctx, "unknown"); err != nil || n != 0 {
			t.Fatalf("Replan(unknown): %d, %v", n, err)
		}
		limit.Store(1)
		if n, err := l.Replan(ctx, "k"); err != nil || n != 4 {
			t.Fatalf("Replan at 1: %d, %v; want e's 2 units gone, g and h moved (4 units)", n, err)
		}
		want("f", 1, false, 2*time.Second)
		want("g", 1, false, 3*time.Second)
		want("h", 1, false, 4*time.Second)
		want("i", 1, false, time.Second) // a new request: in the gap e left
	})
}

// TestReplanSpreads: reservations planned in a bunch (four at T0+1s, four
// at T0+2s, at a limit of 4 per second) are spread at the new limit's
// pace (2 per second: 500 ms a unit), in their order, and a full window
// no longer repeats the bunch.
func TestReplanSpreads(t *testing.T) {
	testReplan(t, func(t *testing.T, l replanner, limit *atomic.Int64, want func(id string, n int, allowed bool, retry time.Duration)) {
		for _, id := range []string{"a", "b", "c", "d"} {
			want(id, 1, true, 0)
		}
		for i, id := range []string{"r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"} {
			want(id, 1, false, time.Duration(1+i/4)*time.Second)
		}
		limit.Store(2)
		if n, err := l.Replan(context.Background(), "k"); err != nil || n != 7 {
			t.Fatalf("Replan: %d, %v; want all but r1 moved (7 units)", n, err)
		}
		for i, id := range []string{"r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8"} {
			want(id, 1, false, time.Second+time.Duration(i)*500*time.Millisecond)
		}
	})
}

// TestReplanFits: a Replan at a limit every reservation still fits
// (raised, or the same) moves nothing; reservations of one slot move in
// the order of their ids in Memory as in Redis; admissions of one instant
// (one entry of two units in Memory, two members in Redis) do not push the
// reservations after them.
func TestReplanFits(t *testing.T) {
	testReplan(t, func(t *testing.T, l replanner, limit *atomic.Int64, want func(id string, n int, allowed bool, retry time.Duration)) {
		ctx := context.Background()
		for _, id := range []string{"a", "b", "c", "d"} {
			want(id, 1, true, 0)
		}
		for _, id := range []string{"zz", "aa", "mm"} {
			want(id, 1, false, time.Second)
		}
		for _, n := range []int64{8, 4} {
			limit.Store(n)
			if moved, err := l.Replan(ctx, "k"); err != nil || moved != 0 {
				t.Fatalf("Replan at %d: %d, %v; want nothing moved (every reservation fits)", n, moved, err)
			}
		}
		want("zz", 1, false, time.Second)
		limit.Store(2)
		if moved, err := l.Replan(ctx, "k"); err != nil || moved != 2 {
			t.Fatalf("Replan at 2: %d, %v; want 2 moved", moved, err)
		}
		want("aa", 1, false, time.Second) // ids in order: aa, mm, zz
		want("mm", 1, false, 1500*time.Millisecond)
		want("zz", 1, false, 2*time.Second)
	})
	testReplan(t, func(t *testing.T, l replanner, limit *atomic.Int64, want func(id string, n int, allowed bool, retry time.Duration)) {
		ctx := context.Background()
		for range 4 {
			if d, err := l.AllowN(ctx, "k", 1); err != nil || !d.Allowed {
				t.Fatalf("AllowN: %+v, %v", d, err)
			}
		}
		want("r", 2, false, time.Second)
		want("s", 1, false, time.Second)
		limit.Store(2)
		if moved, err := l.Replan(ctx, "k"); err != nil || moved != 1 {
			t.Fatalf("Replan at 2: %d, %v; want s moved", moved, err)
		}
		want("r", 2, false, time.Second)
		want("s", 1, false, 2*time.Second) // after r's two units' share, a second
	})
}

// testReplan runs body on Memory and on Redis, on a fake clock at T0,
// with a limit per second that body sets (4 at the start) and want, which
// checks an AllowID of key "k" with a minute's horizon.
func testReplan(t *testing.T, body func(t *testing.T, l replanner, limit *atomic.Int64, want func(id string, n int, allowed bool, retry time.Duration))) {
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
			limit.Store(4)
			l := build(throttletest.NewClock(throttletest.T0))
			body(t, l, &limit, func(id string, n int, allowed bool, retry time.Duration) {
				t.Helper()
				d, err := l.AllowID(context.Background(), "k", n, id, time.Minute)
				if err != nil || d.Allowed != allowed || (!allowed && (!d.Reserved || d.RetryAfter != retry)) {
					t.Fatalf("%s: %+v, %v; want allowed %v, reserved at %v", id, d, err, allowed, retry)
				}
			})
		})
	}
}
