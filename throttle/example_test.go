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
