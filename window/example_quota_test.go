package window_test

import (
	"context"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// Per-key quotas, Peek and Reset (docs/limits-and-quotas.md), with 2 per minute (so the
// run fits in one window) and 3 for the big customer. The example starts
// a redis-server of its own (from PATH).
func ExampleWithQuotas() {
	addr, stop := redistest.ForExample()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()

	quotas := func(tenant string) throttle.Quota { // called on every decision
		if tenant == "big-customer" {
			return throttle.Quota{Rate: throttle.PerMinute(3)}
		}
		return throttle.Quota{} // the limiter's own Rate
	}
	lim, err := window.NewRedis(rdb, throttle.PerMinute(2), window.WithQuotas(quotas))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, tenant := range []string{"tenant-a", "big-customer"} {
		for range 3 {
			d, err := lim.Allow(ctx, tenant)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println(tenant, "allowed:", d.Allowed, "limit:", d.Limit)
		}
	}
	d, err := lim.Peek(ctx, "tenant-a", 1) // what AllowN would say; charges nothing
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("peek tenant-a: would admit:", d.Allowed)
	if err := lim.Reset(ctx, "tenant-a"); err != nil { // the key back to its initial state
		log.Fatal(err)
	}
	d, err = lim.Peek(ctx, "tenant-a", 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after Reset: would admit:", d.Allowed, "remaining:", d.Remaining)
	// Output:
	// tenant-a allowed: true limit: 2
	// tenant-a allowed: true limit: 2
	// tenant-a allowed: false limit: 2
	// big-customer allowed: true limit: 3
	// big-customer allowed: true limit: 3
	// big-customer allowed: true limit: 3
	// peek tenant-a: would admit: false
	// after Reset: would admit: true remaining: 1
}
