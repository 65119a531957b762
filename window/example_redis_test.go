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
