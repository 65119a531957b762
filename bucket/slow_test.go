package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestSlowRedisKeepsDeciding puts Redis 80 ms away each way (a 160 ms
// round trip) with a timeout of 300 ms, about twice it, and 16
// goroutines on one key at 100/1s for 3 s, through bucket.Redis and the
// Hybrid. Calls keep their connections (a reply on its way at the
// timeout is read within one more round trip), so the work gets most of
// its limit (here the round trip bounds bucket.Redis's 16 callers to
// about 90/s); with a timed-out call dropping its connection, no call
// succeeded (each new connection needs more round trips than the timeout
// allows) and the Hybrid's breaker shut out all work.
func TestSlowRedisKeepsDeciding(t *testing.T) {
	const each, timeout = 80 * time.Millisecond, 300 * time.Millisecond
	srv := redistest.Start(t)
	proxy := redistest.NewLatencyProxy(t, srv, each)
	rate := throttle.Rate{Count: 100, Per: time.Second}
	for _, name := range []string{"redis", "hybrid"} {
		t.Run(name, func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = client.Close() })
			var l throttle.Limiter
			var err error
			if name == "redis" {
				l, err = NewRedis(client, rate, 100, WithPrefix(freshPrefix()), WithTimeout(timeout))
			} else {
				var h *Hybrid
				h, err = NewHybrid(client, rate, 100, WithPrefix(freshPrefix()), WithTimeout(timeout))
				if err == nil {
					t.Cleanup(func() { _ = h.Close(context.Background()) })
				}
				l = h
			}
			if err != nil {
				t.Fatal(err)
			}
			load := redistest.Hammer(l, "k", 16, 3*time.Second, time.Second)
			dialed := client.PoolStats().Misses
			t.Logf("%+v (Settled: in the last 2 s), connections dialed %d", load, dialed)
			// Past the first second (the first connections' handshakes take
			// longer than the timeout, and may open the Hybrid's breaker),
			// at least half the rate.
			if load.Settled < int64(rate.Count) {
				t.Errorf("%d admitted in the last 2 s at 100/1s, want at least %d", load.Settled, rate.Count)
			}
			if dialed > 8 {
				t.Errorf("%d connections dialed for 16 goroutines: timed-out calls cost their connections", dialed)
			}
		})
	}
}
