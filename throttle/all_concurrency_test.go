package throttle_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestAllConcurrent races many goroutines through three stacked limits,
// asked in this order: a window per tenant (30 each, 5 tenants), a global
// bucket (100) and a window per endpoint (40) that two groups of tenants
// share, with periods far longer than the test, so nothing leaves or
// refills. Most rejections come from the endpoints, after two charges to
// give back. Then it checks that no part admitted over its limit and that
// every part holds exactly what the composite admitted (the rejected
// requests, and the charges that lost a race, were all given back); and,
// by draining every tenant one request at a time, that the room left was
// exactly the endpoints': 80 units in all, not one fewer, with the global
// bucket holding exactly the 20 tokens left. It runs with AllowN, and with
// AllowID (unique ids, a horizon no slot lies within: every rejection is
// given back in every part).
func TestAllConcurrent(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	for _, f := range []allFamily{
		{name: "Memory+Local", window: memoryWindow, bucket: localBucket},
		{name: "Redis+Redis", window: redisWindow(client), bucket: redisBucket(client)},
		// Every part a Redis window on one client: one script a decision
		// (window.Redis.AllowJoint), nothing to give back.
		{name: "Redis windows", window: redisWindow(client), bucket: func(t *testing.T, r throttle.Rate, _ int, c throttle.Clock) throttle.Limiter {
			return redisWindow(client)(t, r, c)
		}},
	} {
		t.Run(f.name, func(t *testing.T) {
			var clock throttle.Clock // the Redis server's TIME
			if f.name == "Memory+Local" {
				clock = throttletest.NewClock(throttletest.T0) // frozen
			}
			t.Run("AllowN", func(t *testing.T) { runAllConcurrent(t, f, clock, false) })
			t.Run("AllowID", func(t *testing.T) { runAllConcurrent(t, f, clock, true) })
		})
	}
}

func runAllConcurrent(t *testing.T, f allFamily, clock throttle.Clock, withIDs bool) {
	ctx := context.Background()
	const (
		tenantLimit = 30
		globalLimit = 100
		goroutines  = 8
		requests    = 60 // per goroutine
	)
	tenants := []string{"t0", "t1", "t2", "t3", "t4"}
	const endpointLimit = 40
	endpoint := func(tenant string) string {
		if tenant == "t0" || tenant == "t1" {
			return "ep:x"
		}
		return "ep:y"
	}
	tenantWin := f.window(t, throttle.Rate{Count: tenantLimit, Per: time.Hour}, clock)
	globalBucket := f.bucket(t, throttle.Rate{Count: globalLimit, Per: 24 * time.Hour}, globalLimit, clock)
	epWin := f.window(t, throttle.Rate{Count: endpointLimit, Per: time.Hour}, clock)
	lim, err := throttle.All(
		throttle.Part{Limiter: tenantWin},
		throttle.Part{Limiter: globalBucket, Key: global},
		throttle.Part{Limiter: epWin, Key: endpoint},
	)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	admitted := map[string]int{} // units, by tenant
	rejected := 0
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range requests {
				tenant := tenants[(g+i)%len(tenants)]
				n := 1 + i%2
				var d throttle.Decision
				var err error
				if withIDs {
					d, err = lim.(throttle.IDLimiter).AllowID(ctx, tenant, n, "g"+strconv.Itoa(g)+"-"+strconv.Itoa(i), time.Second)
				} else {
					d, err = lim.AllowN(ctx, tenant, n)
				}
				if err != nil {
					t.Errorf("AllowN(%s, %d): %v", tenant, n, err)
					return
				}
				mu.Lock()
				if d.Allowed {
					admitted[tenant] += n
				} else {
					rejected++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	stormTotal := 0
	for _, n := range admitted {
		stormTotal += n
	}
	t.Logf("storm: %d requests, %d units admitted, %d rejected", goroutines*requests, stormTotal, rejected)

	check := func(when string) int {
		t.Helper()
		total := 0
		byEndpoint := map[string]int{}
		for _, tenant := range tenants {
			total += admitted[tenant]
			byEndpoint[endpoint(tenant)] += admitted[tenant]
			if admitted[tenant] > tenantLimit {
				t.Fatalf("%s: tenant %s admitted %d units, over its limit %d", when, tenant, admitted[tenant], tenantLimit)
			}
			peekRemaining(t, when, tenantWin, tenant, tenantLimit-admitted[tenant])
		}
		if total > globalLimit {
			t.Fatalf("%s: %d units admitted, over the global limit %d", when, total, globalLimit)
		}
		for ep, n := range byEndpoint {
			if n > endpointLimit {
				t.Fatalf("%s: endpoint %s admitted %d units, over its limit %d", when, ep, n, endpointLimit)
			}
			peekRemaining(t, when, epWin, ep, endpointLimit-n)
		}
		return total
	}
	check("after the storm")

	// Drain: every tenant, one unit at a time, until rejected.
	for _, tenant := range tenants {
		for {
			d, err := lim.AllowN(ctx, tenant, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
			admitted[tenant]++
		}
	}
	if total := check("after the drain"); total != 2*endpointLimit {
		t.Fatalf("after the drain: %d units admitted in all, want exactly the endpoints' %d (room was lost: %v)", total, 2*endpointLimit, admitted)
	}
	left := globalLimit - 2*endpointLimit
	if d, err := globalBucket.AllowN(ctx, "global", left); err != nil || !d.Allowed {
		t.Fatalf("global bucket: AllowN(%d) = %+v, %v; want the %d tokens left", left, d, err, left)
	}
	if d, err := globalBucket.AllowN(ctx, "global", 1); err != nil || d.Allowed {
		t.Fatalf("global bucket: AllowN(1) = %+v, %v; want empty (a token was given back twice)", d, err)
	}
}

// peekRemaining checks that window w has exactly want units of room for
// key (Peek's Remaining counts the peeked unit as taken when it fits).
func peekRemaining(t *testing.T, when string, w throttle.Limiter, key string, want int) {
	t.Helper()
	d, err := w.(peeker).Peek(context.Background(), key, 1)
	if err != nil {
		t.Fatal(err)
	}
	room := d.Remaining
	if d.Allowed {
		room++
	}
	if room != want {
		t.Fatalf("%s: %s has room for %d units, want %d: %+v", when, key, room, want, d)
	}
}
