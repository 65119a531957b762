package window

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// admitLone fails t unless a lone Allow of key on l is admitted.
func admitLone(ctx context.Context, t *testing.T, l *Redis, key string) {
	t.Helper()
	if d, err := l.Allow(ctx, key); err != nil || !d.Allowed {
		t.Fatalf("Allow(%q) = %+v, %v, want admitted", key, d, err)
	}
}

// TestLoneCallSeesPauseAtOnce: a lone AllowN reads the key's pause only
// when its set's expiry marker is missing (window_head.lua), so Pause
// drops the markers: the first lone call after it, on a key whose marker
// would hold for the rest of the test, is rejected for the pause, and the
// unit it added before it looked is taken back (the set holds what it
// held). Once the pause ends, lone calls admit again and the marker is
// back.
func TestLoneCallSeesPauseAtOnce(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	rate := throttle.Rate{Count: 100, Per: time.Minute}
	l := newTestRedis(t, client, rate)
	key := l.key("k")
	for range 3 {
		admitLone(ctx, t, l, "k")
	}
	if _, ok := markerOf(ctx, t, client, key, rate); !ok {
		t.Fatal("no expiry marker after three lone admissions")
	}
	const paused = 300 * time.Millisecond
	if err := l.Pause(ctx, "k", paused); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		d, err := l.Allow(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > paused {
			t.Fatalf("Allow = %+v during a pause of %v, want a rejection until it ends", d, paused)
		}
		if n := len(unitsOf(ctx, client, key)); n != 3 {
			t.Fatalf("the set holds %d units after a rejection in the pause, want the 3 admitted", n)
		}
		if _, ok := markerOf(ctx, t, client, key, rate); ok {
			t.Fatal("an expiry marker beside a pause")
		}
	}
	time.Sleep(paused + 20*time.Millisecond)
	if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed || d.Remaining != rate.Count-4 {
		t.Fatalf("Allow = %+v, %v after the pause, want admitted with %d remaining", d, err, rate.Count-4)
	}
	if _, ok := markerOf(ctx, t, client, key, rate); !ok {
		t.Fatal("no expiry marker after the pause")
	}
}

// TestLoneCallSeesEarlierVersionsPause: during a rolling upgrade, a pause
// recorded by an earlier version (its pause.lua wrote the pause key alone,
// leaving the set's marker: pause.Redis without window) is seen by
// today's lone calls once the marker moves, within half a window of the
// pause (and a ms, E's rounding), and from then on every call is
// rejected. A lone call started later than that would have been admitted
// at a later instant on the server, so the bound holds however the
// machine is loaded.
func TestLoneCallSeesEarlierVersionsPause(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	rate := throttle.Rate{Count: 10000, Per: 400 * time.Millisecond}
	l := newTestRedis(t, client, rate)
	admitLone(ctx, t, l, "k")
	if _, err := pause.Redis(ctx, client, l.key("k"), false, time.Minute, -1); err != nil {
		t.Fatal(err)
	}
	recorded := time.Now() // the pause began before this, on the server's clock
	bound := recorded.Add(rate.Per/2 + time.Millisecond)
	var lastAdmitted time.Time
	rejected := 0
	for time.Since(recorded) < rate.Per {
		start := time.Now()
		d, err := l.Allow(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			lastAdmitted = start
			if rejected > 0 {
				t.Fatalf("admitted after %d rejections in the pause", rejected)
			}
			continue
		}
		rejected++
		if d.RetryAfter < time.Minute-rate.Per-time.Second {
			t.Fatalf("Allow = %+v, want a rejection for the minute's pause", d)
		}
	}
	if lastAdmitted.After(bound) {
		t.Fatalf("a lone call started %v after the pause was recorded was admitted, want none after half the window (%v)", lastAdmitted.Sub(recorded), rate.Per/2)
	}
	if rejected == 0 {
		t.Fatal("no call rejected in the window after the pause")
	}
}

// TestLoneCallSeesReservation: a reservation drops the set's expiry
// markers (window.lua's decisions drop from -inf), so a lone AllowN that
// fits beside a reservation ahead looks at the key's schedule, takes its
// unit back and leaves the decision to window.lua, which reports the reset
// after the reservation (a lone admission would report the window), and
// the set holds each unit once.
func TestLoneCallSeesReservation(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	rate := throttle.Rate{Count: 4, Per: time.Minute}
	l := newTestRedis(t, client, rate)
	key := l.key("k")
	admitLone(ctx, t, l, "k")
	if _, ok := markerOf(ctx, t, client, key, rate); !ok {
		t.Fatal("no expiry marker after a lone admission")
	}
	const ahead = 30 * time.Second
	if d, err := l.AllowIDAfter(ctx, "k", 1, "x", time.Minute, ahead); err != nil || d.Allowed || !d.Reserved {
		t.Fatalf("AllowIDAfter = %+v, %v, want a reservation %v ahead", d, err, ahead)
	}
	if _, ok := markerOf(ctx, t, client, key, rate); ok {
		t.Fatal("an expiry marker beside a reservation")
	}
	d, err := l.Allow(ctx, "k")
	if err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("Allow = %+v, %v beside the reservation, want admitted with 1 remaining", d, err)
	}
	if min := ahead + rate.Per - time.Second; d.ResetAfter < min {
		t.Fatalf("Allow's ResetAfter = %v beside a reservation %v ahead, want at least %v", d.ResetAfter, ahead, min)
	}
	if n := len(unitsOf(ctx, client, key)); n != 3 {
		t.Fatalf("the set holds %d units, want 3 (two admitted, one reserved)", n)
	}
}

// TestReplanDropsMarkers: a schedule lost alone (evicted) leaves its
// reservations in the set, and a lone call then writes the marker back
// beside them; Replan, writing the schedule again after a quota cut,
// drops the marker, so the next lone admission looks at the schedule and
// reports the reset after the reservation, as window.Memory does.
func TestReplanDropsMarkers(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	var limit atomic.Int64
	limit.Store(4)
	rate := throttle.Rate{Count: 4, Per: time.Minute}
	l := newTestRedis(t, client, rate, WithQuotas(func(string) throttle.Quota {
		return throttle.Quota{Rate: throttle.Rate{Count: int(limit.Load()), Per: time.Minute}}
	}))
	key := l.key("k")
	admitLone(ctx, t, l, "k")
	const ahead = 30 * time.Second
	if d, err := l.AllowIDAfter(ctx, "k", 1, "x", time.Minute, ahead); err != nil || !d.Reserved {
		t.Fatalf("AllowIDAfter = %+v, %v, want a reservation %v ahead", d, err, ahead)
	}
	client.Del(ctx, key+hintSuffix) // the schedule evicted
	admitLone(ctx, t, l, "k")
	limit.Store(2)
	if n, err := l.Replan(ctx, "k"); err != nil || n == 0 {
		t.Fatalf("Replan = %d, %v after a cut to 2 with 3 units, want the reservation moved", n, err)
	}
	if _, ok := markerOf(ctx, t, client, key, rate); ok {
		t.Fatal("an expiry marker beside the schedule Replan wrote")
	}
	limit.Store(5)
	d, err := l.Allow(ctx, "k")
	if err != nil || !d.Allowed {
		t.Fatalf("Allow = %+v, %v, want admitted", d, err)
	}
	if min := rate.Per + ahead; d.ResetAfter < min {
		t.Fatalf("Allow's ResetAfter = %v beside a reservation at least %v ahead, want at least %v", d.ResetAfter, ahead, min)
	}
}
