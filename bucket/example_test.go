package bucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// A bucket of 3 refilling 10 per second: three admissions at once, then a
// wait of one token (100ms).
func ExampleLocal() {
	clock := throttletest.NewClock(throttletest.T0)
	l, err := bucket.NewLocal(throttle.PerSecond(10), 3, bucket.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		d, _ := l.Allow(ctx, "tenant-1")
		fmt.Printf("allowed=%v remaining=%d retry=%v reset=%v\n", d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter)
	}
	clock.Advance(250 * time.Millisecond)
	d, _ := l.AllowN(ctx, "tenant-1", 2)
	fmt.Printf("after 250ms, cost 2: allowed=%v remaining=%d\n", d.Allowed, d.Remaining)
	// Output:
	// allowed=true remaining=2 retry=0s reset=100ms
	// allowed=true remaining=1 retry=0s reset=200ms
	// allowed=true remaining=0 retry=0s reset=300ms
	// allowed=false remaining=0 retry=100ms reset=300ms
	// after 250ms, cost 2: allowed=true remaining=0
}

// Fractional waits are kept: 5 per 2s is one token every 400ms.
func ExampleLocal_fractionalWait() {
	clock := throttletest.NewClock(throttletest.T0)
	l, _ := bucket.NewLocal(throttle.Rate{Count: 5, Per: 2 * time.Second}, 1, bucket.WithClock(clock))
	ctx := context.Background()
	_, _ = l.Allow(ctx, "k")
	d, _ := l.Allow(ctx, "k")
	fmt.Println(d.Allowed, d.RetryAfter)
	clock.Advance(150 * time.Millisecond)
	d, _ = l.Allow(ctx, "k")
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// false 400ms
	// false 250ms
}

// A bucket shared by every worker through Redis. The client must enable
// ContextTimeoutEnabled for WithTimeout to bound each call. The example
// starts a redis-server of its own (from PATH); use your Redis's address
// instead.
func ExampleNewRedis() {
	addr, stop := redistest.ForExample()
	defer stop()
	client := redis.NewClient(&redis.Options{
		Addr:                  addr, // e.g. "localhost:6379"
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	l, err := bucket.NewRedis(client, throttle.PerSecond(1), 20,
		bucket.WithPrefix("myapp:bucket:"),
		bucket.WithTimeout(250*time.Millisecond))
	if err != nil {
		panic(err)
	}
	d, err := l.AllowN(context.Background(), "tenant-1", 20) // the whole burst
	if err != nil {
		fmt.Println("cannot decide:", err) // the Gate's failure policy applies
		return
	}
	fmt.Println("allowed:", d.Allowed)
	d, err = l.AllowN(context.Background(), "tenant-1", 5)
	if err != nil {
		fmt.Println("cannot decide:", err)
		return
	}
	fmt.Println("allowed:", d.Allowed, "retry in about", d.RetryAfter.Round(time.Second)) // 5 s less the time since the first call
	// Output:
	// allowed: true
	// allowed: false retry in about 5s
}

// Reservations: with 2 per second and a burst of 2, messages c and d,
// rejected, reserve the next tokens; each is admitted on its reservation
// when presented again at its slot, and a redelivered id is not charged
// twice.
func ExampleLocal_AllowID() {
	clock := throttletest.NewClock(throttletest.T0)
	l, err := bucket.NewLocal(throttle.PerSecond(2), 2, bucket.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c", "d", "a"} {
		d, _ := l.AllowID(ctx, "stream", 1, id, 5*time.Second)
		fmt.Printf("%s: allowed=%v reserved=%v retry=%v\n", id, d.Allowed, d.Reserved, d.RetryAfter)
	}
	d, _ := l.AllowN(ctx, "stream", 1)
	fmt.Printf("AllowN: allowed=%v retry=%v\n", d.Allowed, d.RetryAfter)
	clock.Advance(500 * time.Millisecond)
	d, _ = l.AllowID(ctx, "stream", 1, "c", 5*time.Second)
	fmt.Printf("c at 500ms: allowed=%v\n", d.Allowed)
	// Output:
	// a: allowed=true reserved=false retry=0s
	// b: allowed=true reserved=false retry=0s
	// c: allowed=false reserved=true retry=500ms
	// d: allowed=false reserved=true retry=1s
	// a: allowed=true reserved=false retry=0s
	// AllowN: allowed=false retry=1.5s
	// c at 500ms: allowed=true
}
