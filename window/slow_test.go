package window

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestSlowRedisAppliesWhatCallersSee puts Redis 80 ms away each way (a
// 160 ms round trip) and decides with a timeout of 300 ms, about twice
// it: 16 goroutines on one key. A call keeps its connection (a reply on
// its way at the timeout is read within one more round trip), and a
// script that runs after its caller's deadline applies nothing, so the
// admissions Redis holds are the ones the callers saw (within 1 %), and
// most calls succeed (0 of 115 did when a timed-out call dropped its
// connection: each new one took longer than the timeout to set up).

func TestSlowRedisAppliesWhatCallersSee(t *testing.T) {
	const each, timeout = 80 * time.Millisecond, 300 * time.Millisecond
	srv := redistest.Start(t)
	proxy := redistest.NewLatencyProxy(t, srv, each)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	l, err := NewRedis(client, throttle.Rate{Count: 1_000_000, Per: time.Hour}, WithPrefix(freshPrefix()), WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var seen, failed, calls atomic.Int64
	var longest atomic.Int64
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				start := time.Now()
				d, err := l.AllowN(ctx, "k", 1)
				took := time.Since(start)
				for {
					old := longest.Load()
					if int64(took) <= old || longest.CompareAndSwap(old, int64(took)) {
						break
					}
				}
				calls.Add(1)
				switch {
				case err != nil:
					failed.Add(1)
				case d.Allowed:
					seen.Add(1)
				}
			}
		})
	}
	wg.Wait()
	applied := srv.Client(t).ZCard(ctx, l.key("k")).Val()
	dialed := client.PoolStats().Misses
	t.Logf("calls %d, seen %d, failed %d, applied %d, longest %v, connections dialed %d", calls.Load(), seen.Load(), failed.Load(), applied, time.Duration(longest.Load()), dialed)
	if dialed > 8 {
		t.Errorf("%d connections dialed for 16 goroutines: timed-out calls cost their connections", dialed)
	}
	if diff := applied - seen.Load(); diff < 0 || float64(diff) > 0.01*float64(seen.Load()) {
		t.Errorf("Redis applied %d admissions, the callers saw %d: more than 1 %% apart", applied, seen.Load())
	}
	if seen.Load() < calls.Load()*9/10 {
		t.Errorf("%d of %d calls succeeded at a timeout of twice the round trip", seen.Load(), calls.Load())
	}
}
