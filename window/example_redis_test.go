package window_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// A window of 2 admissions per second per tenant, shared by every worker
// that uses the same Redis. The example starts a redis-server of its own
// (from PATH); use your Redis's address instead.
func ExampleNewRedis() {
	addr, stop := redistest.ForExample()
	defer stop()

	client := redis.NewClient(&redis.Options{
		Addr:                  addr, // e.g. "localhost:6379"
		ContextTimeoutEnabled: true, // let ctx deadlines bound each decision
	})
	defer client.Close()

	limiter, err := window.NewRedis(client, throttle.PerSecond(2), window.WithPrefix("jobs:window:"))
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		d, err := limiter.Allow(context.Background(), "tenant-42")
		switch {
		case err != nil:
			log.Printf("could not decide: %v", err) // the Gate's failure policy applies
		case d.Allowed:
			fmt.Println("run the job;", d.Remaining, "more this second")
		default:
			fmt.Println("redeliver in at most", d.RetryAfter.Round(time.Second))
		}
	}
	// Output:
	// run the job; 1 more this second
	// run the job; 0 more this second
	// redeliver in at most 1s
}

// A consumer that holds many tenants' messages at once (a JetStream
// Fetch) decides them in one call: as AllowN one after another, in one
// script call.
func ExampleRedis_AllowBatch() {
	addr, stop := redistest.ForExample()
	defer stop()

	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer client.Close()

	limiter, err := window.NewRedis(client, throttle.PerSecond(2), window.WithPrefix("jobs:window:"))
	if err != nil {
		log.Fatal(err)
	}
	reqs := []throttle.Request{
		{Key: "acme", N: 1}, {Key: "initech", N: 1}, {Key: "acme", N: 1}, {Key: "acme", N: 1},
	}
	ds, err := limiter.AllowBatch(context.Background(), reqs)
	if err != nil {
		// A *throttle.BatchError: its Errs say which requests were not decided.
		log.Printf("could not decide every request: %v", err)
	}
	for i, d := range ds {
		fmt.Println(reqs[i].Key, d.Allowed, d.Remaining)
	}
	// Output:
	// acme true 1
	// initech true 1
	// acme true 0
	// acme false 0
}
