package asynqthrottle_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os/exec"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	asynqthrottle "github.com/queuethrottle/queuethrottle/consumers/asynq"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// The README's asynq quick start, on a redis-server of its own (from
// PATH) and with a limit of 2 per second, so the third task waits for its
// reserved slot. The README runs the server until interrupted; here the
// example enqueues three tasks and shuts down once they are handled.
func Example_quickStart() {
	addr, stop := startRedis()
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

// startRedis starts a redis-server from PATH on a free loopback port,
// without persistence, and returns its address and a function that stops
// it. It exits the example if there is no redis-server.
func startRedis() (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		log.Fatalf("this example needs redis-server on PATH: %v", err)
	}
	stop = func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return addr, stop
		}
		if time.Now().After(deadline) {
			stop()
			log.Fatalf("redis-server on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
