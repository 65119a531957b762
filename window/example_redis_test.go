package window_test

import (
	"context"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// A window of 100 admissions per second per tenant, shared by every worker
// that uses the same Redis. Not run: it needs a Redis on localhost:6379.
func ExampleNewRedis() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "localhost:6379",
		ContextTimeoutEnabled: true, // let ctx deadlines bound each decision
	})
	defer client.Close()

	limiter, err := window.NewRedis(client, throttle.PerSecond(100), window.WithPrefix("jobs:window:"))
	if err != nil {
		log.Fatal(err)
	}
	d, err := limiter.Allow(context.Background(), "tenant-42")
	switch {
	case err != nil:
		log.Printf("could not decide: %v", err) // the Gate's failure policy applies
	case d.Allowed:
		fmt.Println("run the job;", d.Remaining, "more this second")
	default:
		fmt.Println("redeliver in", d.RetryAfter)
	}
}
