package window

import (
	"context"
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
	load := redistest.Hammer(l, "k", 16, 3*time.Second, 0)
	applied := srv.Client(t).ZCard(context.Background(), l.key("k")).Val()
	dialed := client.PoolStats().Misses
	t.Logf("%+v, applied %d, connections dialed %d", load, applied, dialed)
	if diff := applied - load.Admitted; diff < 0 || float64(diff) > 0.01*float64(load.Admitted) {
		t.Errorf("Redis applied %d admissions, the callers saw %d: more than 1 %% apart", applied, load.Admitted)
	}
	if load.Admitted < load.Calls*9/10 {
		t.Errorf("%d of %d calls succeeded at a timeout of twice the round trip", load.Admitted, load.Calls)
	}
	if dialed > 8 {
		t.Errorf("%d connections dialed for 16 goroutines: timed-out calls cost their connections", dialed)
	}
}
