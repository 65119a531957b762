package quota_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/quota"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Per-tenant quotas kept in a Redis hash: every worker process reads them
// every 250 ms, so `redis-cli HSET throttle:quotas acme "50/1s burst 100"`
// reaches all of them within a second, and each decision reads the quota
// from memory. The example starts a redis-server of its own (from PATH).
func ExampleNewRedisHash() {
	addr, stop := redistest.ForExample()
	defer stop()
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer client.Close()
	ctx := context.Background()

	quotas, err := quota.NewRedisHash(ctx, client, "throttle:quotas", quota.WithLogger(slog.Default()))
	if err != nil {
		panic(err)
	}
	defer quotas.Close()
	// One call, or redis-cli HSET, from any process.
	if err := quotas.Set(ctx, "acme", throttle.Quota{Rate: throttle.PerSecond(50), Burst: 100}); err != nil {
		panic(err)
	}

	// Tenants without a field get the limiter's own 10/s.
	limiter, err := bucket.NewRedis(client, throttle.PerSecond(10), 10, bucket.WithQuotas(quotas.Func()))
	if err != nil {
		panic(err)
	}
	for _, tenant := range []string{"acme", "small-co"} {
		d, err := limiter.AllowN(ctx, tenant, 1)
		if err != nil {
			panic(err)
		}
		fmt.Println(tenant, d.Allowed, d.Limit, d.Remaining)
	}
	fmt.Println(client.HGet(ctx, "throttle:quotas", "acme").Val())
	// Output:
	// acme true 50 99
	// small-co true 10 9
	// 50/1s burst 100
}
