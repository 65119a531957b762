package bucket

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestRedisLostBucketNeverOverAdmits: 3 processes x 8 goroutines on one
// key at 100/1s, burst 100 (AllowN and AllowID); Redis is killed and restarted empty 150 ms
// later, and then flushed (FLUSHALL) while running. The first take to
// find the bucket gone while it should be short of full starts it empty,
// so that the run admits no more than burst + rate x its span (without
// the check, about a burst more per loss).
func TestRedisLostBucketNeverOverAdmits(t *testing.T) {
	srv := redistest.Start(t)
	prefix := freshPrefix()
	var limiters []throttle.Limiter
	for range 3 {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		l, err := NewRedis(c, throttle.PerSecond(100), 100, WithPrefix(prefix), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		limiters = append(limiters, l)
	}
	var mu sync.Mutex
	var admitted []time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seq atomic.Int64
	for _, l := range limiters {
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					var d throttle.Decision
					var err error
					if g%2 == 0 { // bucket.lua
						d, err = l.AllowN(context.Background(), "k", 1)
					} else { // bucket_id.lua
						d, err = l.(throttle.IDLimiter).AllowID(context.Background(), "k", 1, strconv.FormatInt(seq.Add(1), 10), 0)
					}
					if err != nil {
						time.Sleep(5 * time.Millisecond) // Redis is down
						continue
					}
					if d.Allowed {
						mu.Lock()
						admitted = append(admitted, time.Now())
						mu.Unlock()
					}
				}
			}()
		}
	}
	time.Sleep(1200 * time.Millisecond)
	srv.Stop()
	time.Sleep(150 * time.Millisecond)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	srv.FlushAll(t)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	slices.SortFunc(admitted, func(a, b time.Time) int { return a.Compare(b) })
	span := admitted[len(admitted)-1].Sub(admitted[0])
	bound := 100 + int(100*span.Seconds()) + 5 // 5: the callers see each admission a round trip late
	t.Logf("%d admitted over %v; the bound is %d", len(admitted), span.Round(time.Millisecond), bound)
	if len(admitted) > bound {
		t.Fatalf("%d admitted over %v, want at most burst + rate x span = %d: a lost bucket read full", len(admitted), span, bound)
	}
	if len(admitted) < bound-150 {
		t.Fatalf("only %d admitted over %v (bound %d): a loss should cost about a burst, not the run", len(admitted), span, bound)
	}
}
