package throttle_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// Three stacked limits on requests keyed "tenant endpoint": 2 per second
// per tenant, AND the partner API's global quota of 3 per second (a token
// bucket), AND 100 per minute per endpoint. The third request of acme is
// rejected by its tenant's window; what the other parts would have
// charged for it stays free, so globex still finds the partner's last
// token.
func ExampleAll() {
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	tenant, _ := window.NewMemory(throttle.Rate{Count: 2, Per: time.Second}, window.WithClock(clock))
	partner, _ := bucket.NewLocal(throttle.Rate{Count: 3, Per: time.Second}, 3, bucket.WithClock(clock))
	endpoint, _ := window.NewMemory(throttle.Rate{Count: 100, Per: time.Minute}, window.WithClock(clock))
	lim, err := throttle.All(
		throttle.Part{Limiter: tenant, Key: func(k string) string { t, _, _ := strings.Cut(k, " "); return t }},
		throttle.Part{Limiter: partner, Key: func(string) string { return "partner-api" }},
		throttle.Part{Limiter: endpoint, Key: func(k string) string { _, e, _ := strings.Cut(k, " "); return e }},
	)
	if err != nil {
		panic(err)
	}
	for _, key := range []string{"acme /search", "acme /search", "acme /search", "globex /search", "initech /export"} {
		d, err := lim.AllowN(ctx, key, 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%-15s allowed=%-5v retry=%-5v limit=%d remaining=%d\n", key, d.Allowed, d.RetryAfter, d.Limit, d.Remaining)
	}
	// Output:
	// acme /search    allowed=true  retry=0s    limit=2 remaining=1
	// acme /search    allowed=true  retry=0s    limit=2 remaining=0
	// acme /search    allowed=false retry=1s    limit=2 remaining=0
	// globex /search  allowed=true  retry=0s    limit=3 remaining=0
	// initech /export allowed=false retry=334ms limit=3 remaining=0
}
