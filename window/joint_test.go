package window

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// jointSchedule gives window w (2 per 1 s) for key k two admissions at T0
// and reservations r1..r6 at 1 s, 2 s and 3 s, then cancels those of
// cancel.
func jointSchedule(t *testing.T, w *Redis, k string, cancel ...string) {
	t.Helper()
	ctx := context.Background()
	if d, err := w.AllowN(ctx, k, 2); err != nil || !d.Allowed {
		t.Fatalf("AllowN: %+v, %v", d, err)
	}
	for _, id := range []string{"r1", "r2", "r3", "r4", "r5", "r6"} {
		if d, err := w.AllowID(ctx, k, 1, id, time.Minute); err != nil || !d.Reserved {
			t.Fatalf("AllowID(%s): %+v, %v", id, d, err)
		}
	}
	for _, id := range cancel {
		if held, err := w.Refund(ctx, k, 1, id); err != nil || !held {
			t.Fatalf("Refund(%s): %v, %v", id, held, err)
		}
	}
}

func TestRedisAllowJoint(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	rate := throttle.Rate{Count: 2, Per: time.Second}

	t.Run("all or none", func(t *testing.T) {
		a, clock := newClockedRedis(t, client, rate)
		b := newTestRedis(t, client, throttle.Rate{Count: 3, Per: time.Second}, WithClock(clock))
		parts := []throttle.Limiter{a, b}
		for i, want := range []bool{true, true, false} {
			ds, ok, err := a.AllowJoint(ctx, parts, []string{"k", "k"}, 1)
			if err != nil || !ok || len(ds) != 2 {
				t.Fatalf("call %d: %v, ok %v, %v", i, ds, ok, err)
			}
			if got := ds[0].Allowed && ds[1].Allowed; got != want {
				t.Fatalf("call %d: %+v; want admitted %v", i, ds, want)
			}
		}
		// The third call fit b but not a: b charged nothing for it.
		if d, err := b.Peek(ctx, "k", 1); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("b after a rejection: %+v, %v; want room for exactly one", d, err)
		}
		ds, _, _ := a.AllowJoint(ctx, parts, []string{"k", "k"}, 1)
		if ds[0].Allowed || ds[0].RetryAfter != time.Second || ds[0].Limit != 2 || !ds[1].Allowed || ds[1].Remaining != 0 {
			t.Fatalf("decisions %+v; want a rejecting for 1s, b fitting with Remaining 0", ds)
		}
	})
	t.Run("a gap at now, before reservations", func(t *testing.T) {
		a, clock := newClockedRedis(t, client, rate)
		b := newTestRedis(t, client, rate, WithClock(clock))
		jointSchedule(t, a, "k", "r1", "r2") // [1s, 2s) is free: room for 2 at 1s
		clock.Set(throttletest.T0.Add(time.Second))
		ds, ok, err := a.AllowJoint(ctx, []throttle.Limiter{a, b}, []string{"k", "k"}, 1)
		if err != nil || !ok || !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("AllowJoint at 1s: %+v, ok %v, %v; want admitted in the gap", ds, ok, err)
		}
		for i, want := range []bool{true, false} {
			if d, err := a.AllowN(ctx, "k", 1); err != nil || d.Allowed != want {
				t.Fatalf("AllowN %d after: %+v, %v; want Allowed %v (the joint unit in the gap)", i, d, err, want)
			}
		}
	})
	t.Run("a gap before the tail", func(t *testing.T) {
		a, clock := newClockedRedis(t, client, rate)
		b := newTestRedis(t, client, rate, WithClock(clock))
		jointSchedule(t, a, "k", "r3", "r4") // [2s, 3s) is free
		clock.Set(throttletest.T0.Add(500 * time.Millisecond))
		ds, ok, err := a.AllowJoint(ctx, []throttle.Limiter{a, b}, []string{"k", "k"}, 1)
		if err != nil || !ok || ds[0].Allowed || ds[0].RetryAfter != 1500*time.Millisecond {
			t.Fatalf("AllowJoint at 0.5s: %+v, ok %v, %v; want a rejection until the gap at 2s", ds, ok, err)
		}
	})
	t.Run("when it does not apply", func(t *testing.T) {
		a, clock := newClockedRedis(t, client, rate)
		other := newTestRedis(t, redistest.Shared(t).Client(t), rate, WithClock(clock))
		serverTime := newTestRedis(t, client, rate)
		funcClock := newTestRedis(t, client, rate, WithClock(throttle.ClockFunc(clock.Now)))
		mem, err := NewMemory(rate, WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		for name, parts := range map[string][]throttle.Limiter{
			"a Memory":              {a, mem},
			"another client":        {a, other},
			"another clock":         {a, serverTime},
			"an incomparable clock": {a, funcClock},
		} {
			if _, ok, err := a.AllowJoint(ctx, parts, []string{"k", "k"}, 1); ok || err != nil {
				t.Errorf("%s: ok %v, %v; want not ok", name, ok, err)
			}
		}
		if _, ok, err := a.AllowJoint(ctx, []throttle.Limiter{a, a}, []string{"k", "k"}, 3); ok || err != nil {
			t.Errorf("n above a limit: ok %v, %v; want not ok (the caller's path gives the error)", ok, err)
		}
	})
}

func TestOneSlot(t *testing.T) {
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}) // never dialled
	t.Cleanup(func() { _ = cluster.Close() })
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = single.Close() })
	same := []string{"a:{tenant}", "b:{tenant}", "b:{tenant}:floor"}
	apart := []string{"a:{tenant}", "b:{partner}"}
	switch {
	case !oneSlot(cluster, same):
		t.Error("cluster, one hash tag: want one slot")
	case oneSlot(cluster, apart):
		t.Error("cluster, two hash tags: want not one slot")
	case !oneSlot(single, apart):
		t.Error("one server: any keys")
	}
}

// TestRedisAllowJointStalled: a joint decision whose caller gave up
// before a stalled Redis ran it applies nothing when Redis resumes, as
// AllowN's (see TestStalledRedisAppliesNothingLate).
func TestRedisAllowJointStalled(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	rate := throttle.Rate{Count: 2, Per: time.Minute}
	a := newTestRedis(t, client, rate, WithTimeout(100*time.Millisecond))
	b := newTestRedis(t, client, rate, WithTimeout(100*time.Millisecond))
	parts, keys := []throttle.Limiter{a, b}, []string{"k", "k"}
	pa, pb := patient(t, client, a), patient(t, client, b)
	if _, ok, err := pa.AllowJoint(ctx, []throttle.Limiter{pa, pb}, keys, 1); err != nil || !ok { // connect, load the script
		t.Fatalf("AllowJoint: ok %v, %v", ok, err)
	}
	direct := srv.Client(t)
	scripts := redistest.ScriptCalls(t, direct)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	_, _, err := a.AllowJoint(ctx, parts, keys, 1)
	time.Sleep(300 * time.Millisecond) // the deadline passes while Redis is stopped
	if rerr := srv.Resume(); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		t.Fatal("AllowJoint while Redis is stopped succeeded, want a timeout")
	}
	for deadline := time.Now().Add(5 * time.Second); redistest.ScriptCalls(t, direct) < scripts+1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stalled call never ran")
		}
	}
	for _, w := range []*Redis{a, b} {
		if d, err := w.Peek(ctx, "k", 1); err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("after the stalled call: %+v, %v; want 1 unit held (the first call's), room for 1", d, err)
		}
	}
}

// TestRedisAllowJointPaused: a paused window rejects the joint request for
// the time left of its pause, and the other windows are charged nothing.
func TestRedisAllowJointPaused(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	a, clock := newClockedRedis(t, client, throttle.Rate{Count: 2, Per: time.Second})
	b := newTestRedis(t, client, throttle.Rate{Count: 3, Per: time.Second}, WithClock(clock))
	if err := b.Pause(ctx, "k", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ds, ok, err := a.AllowJoint(ctx, []throttle.Limiter{a, b}, []string{"k", "k"}, 1)
	if err != nil || !ok || len(ds) != 2 {
		t.Fatalf("AllowJoint: %v, ok %v, %v", ds, ok, err)
	}
	if ds[1].Allowed || ds[1].RetryAfter < 5*time.Second {
		t.Fatalf("paused window: %+v; want rejected for the 5s of its pause", ds[1])
	}
	if d, err := a.Peek(ctx, "k", 2); err != nil || !d.Allowed {
		t.Fatalf("a after the paused rejection: %+v, %v; want its 2 units free", d, err)
	}
}
