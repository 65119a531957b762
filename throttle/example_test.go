package throttle_test

import (
	"context"
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

func ExampleParseRate() {
	r, err := throttle.ParseRate("5/250ms")
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Count, r.Per)
	_, err = throttle.ParseRate("0/s")
	fmt.Println(err)
	// Output:
	// 5 250ms
	// throttle: invalid option Rate.Count: must be >= 1, got 0
}

func ExampleGate() {
	clock := throttletest.NewClock(throttletest.T0)
	lim, _ := window.NewMemory(throttle.Rate{Count: 2, Per: time.Second}, window.WithClock(clock))
	g, _ := throttle.NewGate(lim, throttle.WithFailurePolicy(throttle.FailClosed))
	for _, at := range []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, time.Second} {
		clock.Set(throttletest.T0.Add(at))
		d, _ := g.Admit(context.Background(), "tenant-a", 1)
		fmt.Printf("t=%v allowed=%v remaining=%d retry-after=%v\n", at, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// t=0s allowed=true remaining=1 retry-after=0s
	// t=100ms allowed=true remaining=0 retry-after=0s
	// t=300ms allowed=false remaining=0 retry-after=700ms
	// t=1s allowed=true remaining=0 retry-after=0s
}

// A burst of five messages at 2 per second with reservations: the three
// that cannot start reserve their own slots, and each is admitted on its
// slot when it comes back; a redelivery of an admitted message is not
// charged again.
func ExampleGate_AdmitID() {
	clock := throttletest.NewClock(throttletest.T0)
	lim, _ := window.NewMemory(throttle.Rate{Count: 2, Per: time.Second}, window.WithClock(clock))
	g, _ := throttle.NewGate(lim, throttle.WithReservations(time.Minute))
	ctx := context.Background()
	slots := map[string]time.Duration{}
	for _, id := range []string{"m1", "m2", "m3", "m4", "m5"} {
		d, _ := g.AdmitID(ctx, "tenant-a", 1, id)
		if d.Reserved {
			slots[id] = d.RetryAfter
		}
		fmt.Printf("t=0s %s allowed=%v reserved=%v retry-after=%v\n", id, d.Allowed, d.Reserved, d.RetryAfter)
	}
	d, _ := g.AdmitID(ctx, "tenant-a", 1, "m1")
	fmt.Printf("t=0s m1 again allowed=%v\n", d.Allowed)
	for _, id := range []string{"m3", "m4", "m5"} {
		clock.Set(throttletest.T0.Add(slots[id]))
		d, _ := g.AdmitID(ctx, "tenant-a", 1, id)
		fmt.Printf("t=%v %s allowed=%v\n", slots[id], id, d.Allowed)
	}
	// Output:
	// t=0s m1 allowed=true reserved=false retry-after=0s
	// t=0s m2 allowed=true reserved=false retry-after=0s
	// t=0s m3 allowed=false reserved=true retry-after=1s
	// t=0s m4 allowed=false reserved=true retry-after=1s
	// t=0s m5 allowed=false reserved=true retry-after=2s
	// t=0s m1 again allowed=true
	// t=1s m3 allowed=true
	// t=1s m4 allowed=true
	// t=2s m5 allowed=true
}

// A partner answered 429 with Retry-After: 30: pause the tenant's key.
func ExampleGate_Pause() {
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	lim, _ := window.NewMemory(throttle.PerSecond(100), window.WithClock(clock))
	gate, _ := throttle.NewGate(lim)

	if err := gate.Pause(ctx, "tenant-a", 30*time.Second); err != nil {
		panic(err)
	}
	clock.Advance(10 * time.Second)
	d, _ := gate.Admit(ctx, "tenant-a", 1)
	fmt.Println(d.Allowed, d.RetryAfter)
	d, _ = gate.Admit(ctx, "tenant-b", 1)
	fmt.Println(d.Allowed)
	// Output:
	// false 20s
	// true
}
