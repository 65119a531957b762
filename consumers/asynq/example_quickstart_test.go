package asynqthrottle_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	asynqthrottle "github.com/queuethrottle/queuethrottle/consumers/asynq"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// An asynq quick start like the README's (there keyed by a tenant header
// with WithKeyFunc, here by task type), on a redis-server of its own (from
// PATH) and with a limit of 2 per second, so the third task waits for its
// reserved slot. The README runs the server until interrupted; here the
// example enqueues three tasks and shuts down once they are handled.
func Example_quickStart() {
	addr, stop := redistest.ForExample()
	defer stop()

	// From here on, the quick start (but the address, the limit and the
	// end).
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	const rate = 2
	lim, err := window.NewRedis(rdb, throttle.PerSecond(rate), window.WithPrefix("myapp:throttle:"))
	if err != nil {
		log.Fatal(err)
	}
	gate, err := throttle.NewGate(lim, throttle.WithReservations(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	cfg := asynq.Config{
		Concurrency:              2*rate + 10, // about rate × (DelayedTaskCheckInterval + 1 s), plus your own
		DelayedTaskCheckInterval: time.Second,
		IsFailure:                asynqthrottle.IsFailure,
		RetryDelayFunc:           asynqthrottle.RetryDelayFunc(nil),
		LogLevel:                 asynq.ErrorLevel,
	}
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	mux := asynq.NewServeMux()
	mux.Use(asynqthrottle.Middleware(gate,
		asynqthrottle.WithClient(client),
		asynqthrottle.WithServerConfig(cfg),
	))
	var handled sync.WaitGroup
	handled.Add(3)
	mux.HandleFunc("email:send", func(ctx context.Context, t *asynq.Task) error {
		fmt.Printf("sending %s\n", t.Payload()) // runs only for admitted tasks
		handled.Done()
		return nil
	})

	ctx := context.Background()
	start := time.Now()
	for i := 1; i <= 3; i++ {
		task := asynq.NewTaskWithHeaders("email:send", fmt.Appendf(nil, `{"to":"user%d@example.com"}`, i), asynqthrottle.InjectTraceContext(ctx, nil))
		if _, err := client.EnqueueContext(ctx, task); err != nil {
			log.Fatal(err)
		}
	}
	if err := srv.Start(mux); err != nil {
		log.Fatal(err)
	}
	handled.Wait()
	fmt.Println("the third waited for its slot:", time.Since(start) >= 900*time.Millisecond)
	srv.Shutdown()
	// Unordered output:
	// sending {"to":"user1@example.com"}
	// sending {"to":"user2@example.com"}
	// sending {"to":"user3@example.com"}
	// the third waited for its slot: true
}
