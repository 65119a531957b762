package window_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os/exec"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// A window of 2 admissions per second per tenant, shared by every worker
// that uses the same Redis. The example starts a redis-server of its own
// (from PATH); use your Redis's address instead.
func ExampleNewRedis() {
	addr, stop := startRedis()
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
