package asynqthrottle_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/hibiken/asynq"

	asynqthrottle "github.com/queuethrottle/queuethrottle/consumers/asynq"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// The Config wiring: IsFailure and RetryDelayFunc keep throttled tasks from
// using up retries, and the middleware, given a client, re-enqueues tasks
// rejected on their last attempt instead of letting asynq archive them.
// Not run: it needs a Redis on localhost:6379 and runs until interrupted;
// Example_quickStart runs on a redis-server of its own.
func Example() {
	redisOpt := asynq.RedisClientOpt{Addr: "localhost:6379"}

	// 10 tasks per second for each task type. With several workers, use
	// window.NewRedis on the same Redis so they share one limit.
	lim, err := window.NewMemory(throttle.PerSecond(10))
	if err != nil {
		log.Fatal(err)
	}
	gate, err := throttle.NewGate(lim)
	if err != nil {
		log.Fatal(err)
	}

	client := asynq.NewClient(redisOpt)
	defer client.Close()

	srv := asynq.NewServer(redisOpt, asynq.Config{
		Concurrency: 10,
		// Throttling is not a failure: the retry count stays, and asynq's
		// failure statistics do not count it.
		IsFailure: asynqthrottle.IsFailure,
		// Throttled tasks come back after their retry-after (rounded up for
		// asynq's whole-second retry times); other errors get asynq's
		// default backoff.
		RetryDelayFunc: asynqthrottle.RetryDelayFunc(nil),
		// How often due retries are moved to pending (default 5s): the
		// largest extra wait a throttled task sees.
		DelayedTaskCheckInterval: time.Second,
		// The error handler sees rejections too; skip them here.
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, task *asynq.Task, err error) {
			if errors.Is(err, throttle.ErrLimited) {
				return
			}
			log.Printf("task %s failed: %v", task.Type(), err)
		}),
	})

	mux := asynq.NewServeMux()
	mux.Use(asynqthrottle.Middleware(gate, asynqthrottle.WithClient(client)))
	mux.HandleFunc("email:send", func(ctx context.Context, t *asynq.Task) error {
		// Runs only when admitted; ctx carries the process span.
		return nil
	})
	if err := srv.Run(mux); err != nil {
		log.Fatal(err)
	}
}

// A producer passes its trace context in the task headers, so the
// consumer's process span is a child of the producer's span. The example
// starts a redis-server of its own (from PATH).
func ExampleInjectTraceContext() {
	addr, stop := redistest.ForExample()
	defer stop()
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: addr}) // e.g. "localhost:6379"
	defer client.Close()

	ctx := context.Background() // in practice, a context carrying the producer's span
	headers := asynqthrottle.InjectTraceContext(ctx, map[string]string{"tenant": "acme"})
	task := asynq.NewTaskWithHeaders("email:send", []byte(`{"to":"a@example.com"}`), headers)
	info, err := client.EnqueueContext(ctx, task, asynq.MaxRetry(5))
	if err != nil {
		log.Print(err)
		return
	}
	fmt.Println("enqueued", info.Type, "with headers", info.Headers["tenant"])
	// Output:
	// enqueued email:send with headers acme
}
