package throttle_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// TestAllJointMatchesGiveBack: stacked Redis windows on one client are
// decided in one script (window.Redis.AllowJoint), and make the decisions
// that the same windows in memory make by charging and giving back, on a
// random schedule at fixed instants with reservations of other requests
// made and cancelled directly on the parts (so that gaps lie ahead).
func TestAllJointMatchesGiveBack(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			runJointMatchesGiveBack(t, client, seed, time.Duration(100+100*seed)*time.Millisecond)
		})
	}
}

// runJointMatchesGiveBack steps by up to gap at a time.
func runJointMatchesGiveBack(t *testing.T, client redis.Scripter, seed uint64, gap time.Duration) {
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	rates := []throttle.Rate{{Count: 3, Per: time.Second}, {Count: 5, Per: 2 * time.Second}, {Count: 4, Per: 500 * time.Millisecond}}
	keyFuncs := []func(string) string{
		nil,
		global,
		func(k string) string { return "ep" + k[len(k)-1:] },
	}
	var mems, reds []throttle.IDLimiter
	var memParts, redParts []throttle.Part
	for i, r := range rates {
		m, err := window.NewMemory(r, window.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		w, err := window.NewRedis(client, r, window.WithClock(clock), window.WithPrefix(redistest.Prefix("joint")), window.WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		mems, reds = append(mems, m), append(reds, w)
		memParts = append(memParts, throttle.Part{Limiter: m, Key: keyFuncs[i]})
		redParts = append(redParts, throttle.Part{Limiter: w, Key: keyFuncs[i]})
	}
	memAll, err := throttle.All(memParts...)
	if err != nil {
		t.Fatal(err)
	}
	redAll, err := throttle.All(redParts...)
	if err != nil {
		t.Fatal(err)
	}
	// The Redis windows agree to one script, the path under test: the
	// keys are redAll's for "t1", and memAll decides the same.
	keys := []string{"t1", "global", "ep1"}
	if _, ok, err := reds[0].(throttle.JointLimiter).AllowJoint(ctx, []throttle.Limiter{reds[0], reds[1], reds[2]}, keys, 1); err != nil || !ok {
		t.Fatalf("AllowJoint: ok %v, %v; want the one-script path", ok, err)
	}
	if _, err := memAll.AllowN(ctx, "t1", 1); err != nil {
		t.Fatal(err)
	}
	partKey := func(i int, key string) string {
		if keyFuncs[i] == nil {
			return key
		}
		return keyFuncs[i](key)
	}
	rng := rand.New(rand.NewPCG(seed, 10))
	at := time.Duration(0)
	admitted, rejected := 0, 0
	for step := range 600 {
		at += time.Duration(rng.Int64N(int64(gap/time.Microsecond))) * time.Microsecond
		clock.Set(throttletest.T0.Add(at))
		key := fmt.Sprint("t", rng.IntN(3))
		n := 1 + rng.IntN(2)
		switch op := rng.IntN(10); {
		case op < 2:
			// Another request's reservation, directly on one part.
			i := rng.IntN(len(rates))
			id := fmt.Sprint("r", rng.IntN(30))
			dm, err1 := mems[i].AllowID(ctx, partKey(i, key), 1, id, 3*time.Second)
			dr, err2 := reds[i].AllowID(ctx, partKey(i, key), 1, id, 3*time.Second)
			if err1 != nil || err2 != nil {
				t.Fatalf("step %d: AllowID errors %v, %v", step, err1, err2)
			}
			dm.Source, dr.Source = 0, 0
			if dm != dr {
				t.Fatalf("step %d: part %d AllowID: memory %+v, redis %+v", step, i, dm, dr)
			}
		case op < 3:
			// Another request's reservation cancelled: gaps ahead.
			i := rng.IntN(len(rates))
			id := fmt.Sprint("r", rng.IntN(30))
			// (What each reports may differ for units that already left
			// the window: the twins drop those at different times.)
			_, err1 := mems[i].(throttle.Refunder).Refund(ctx, partKey(i, key), 1, id)
			_, err2 := reds[i].(throttle.Refunder).Refund(ctx, partKey(i, key), 1, id)
			if err1 != nil || err2 != nil {
				t.Fatalf("step %d: part %d Refund: %v, %v", step, i, err1, err2)
			}
		case op < 4:
			pm, err1 := memAll.(peeker).Peek(ctx, key, n)
			pr, err2 := redAll.(peeker).Peek(ctx, key, n)
			if err1 != nil || err2 != nil {
				t.Fatalf("step %d: Peek errors %v, %v", step, err1, err2)
			}
			pm.Source, pr.Source = 0, 0
			if pm != pr {
				t.Fatalf("step %d at %v: Peek(%s, %d): give-back %+v, one script %+v", step, at, key, n, pm, pr)
			}
		default:
			dm, err1 := memAll.AllowN(ctx, key, n)
			dr, err2 := redAll.AllowN(ctx, key, n)
			if err1 != nil || err2 != nil {
				t.Fatalf("step %d: AllowN errors %v, %v", step, err1, err2)
			}
			if dr.Source != throttle.SourceRedis {
				t.Fatalf("step %d: Source %v", step, dr.Source)
			}
			dm.Source, dr.Source = 0, 0
			if dm != dr {
				t.Fatalf("step %d at %v: AllowN(%s, %d): give-back %+v, one script %+v", step, at, key, n, dm, dr)
			}
			if dm.Allowed {
				admitted++
			} else {
				rejected++
			}
		}
	}
	t.Logf("%d admitted, %d rejected", admitted, rejected)
}
