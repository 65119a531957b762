package concurrency_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/concurrency"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// Two exports to one partner may run at once. A third waits for a slot;
// a worker that dies without releasing loses its slot when its lease
// ends.
func ExampleMemory() {
	clock := throttletest.NewClock(throttletest.T0)
	m, _ := concurrency.NewMemory(2, concurrency.WithClock(clock))
	ctx := context.Background()
	show := func(id string) {
		d, _ := m.Acquire(ctx, "partner-a", id, 30*time.Second)
		fmt.Printf("%s: allowed=%v remaining=%d retry-after=%v\n", id, d.Allowed, d.Remaining, d.RetryAfter)
	}
	show("job-1")
	show("job-2")
	show("job-3")
	show("job-1") // a redelivery of job-1: the same slot, renewed

	_ = m.Release(ctx, "partner-a", "job-2")
	show("job-3")

	clock.Advance(30 * time.Second) // job-1's lease (renewed at 0) ends
	err := m.Renew(ctx, "partner-a", "job-1", 30*time.Second)
	fmt.Println("renew job-1:", err, errors.Is(err, concurrency.ErrNotHeld))
	// Output:
	// job-1: allowed=true remaining=1 retry-after=0s
	// job-2: allowed=true remaining=0 retry-after=0s
	// job-3: allowed=false remaining=0 retry-after=30s
	// job-1: allowed=true remaining=0 retry-after=0s
	// job-3: allowed=true remaining=0 retry-after=0s
	// renew job-1: concurrency: slot not held true
}

// A handler that holds a slot while it runs, renewing its lease for long
// jobs and releasing it when done. Not run: it needs a Redis on
// localhost:6379.
func ExampleNewRedis() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "localhost:6379",
		ContextTimeoutEnabled: true, // let ctx deadlines bound each call
	})
	defer client.Close()

	slots, err := concurrency.NewRedis(client, 10, concurrency.WithPrefix("jobs:inflight:"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	const lease = time.Minute // longer than a job, or renewed by it
	d, err := slots.Acquire(ctx, "partner-a", "task-7f3a", lease)
	switch {
	case err != nil:
		log.Printf("could not decide: %v", err)
		return
	case !d.Allowed:
		fmt.Println("redeliver in at most", d.RetryAfter)
		return
	}
	defer func() { _ = slots.Release(ctx, "partner-a", "task-7f3a") }()
	// ... run the job, calling Renew every lease/3 if it may run longer;
	// Renew returning ErrNotHeld means the slot was lost.
	if err := slots.Renew(ctx, "partner-a", "task-7f3a", lease); errors.Is(err, concurrency.ErrNotHeld) {
		log.Print("lease ended: stop the job")
	}
}
