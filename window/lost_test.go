package window

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestRedisLostSetNeverOverAdmits: 3 processes x 8 goroutines on one key
// at 100/1s; Redis is killed and restarted empty 150 ms later, and then
// flushed (FLUSHALL) while running. The first script call to find the key
// gone while it should hold units pauses it for a window, for every
// process, so that no 1 s window ever holds more than 100 admissions
// (without the check: about 200 after each loss).
func TestRedisLostSetNeverOverAdmits(t *testing.T) {
	srv := redistest.Start(t)
	prefix := freshPrefix()
	var limiters []*Redis
	for range 3 {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		l, err := NewRedis(c, throttle.PerSecond(100), WithPrefix(prefix), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		limiters = append(limiters, l)
	}
	var mu sync.Mutex
	var admitted []time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					d, err := l.Allow(context.Background(), "k")
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
	// Callers see an admission a round trip after Redis made it: allow
	// them 100 ms of that in the 1 s.
	const slop = 100 * time.Millisecond
	most := 0
	for i := range admitted {
		j, _ := slices.BinarySearchFunc(admitted[i:], admitted[i].Add(time.Second-slop), func(a, b time.Time) int { return a.Compare(b) })
		most = max(most, j)
	}
	t.Logf("%d admitted in 4.35 s; at most %d within any %v", len(admitted), most, time.Second-slop)
	if most > 100 {
		t.Fatalf("%d admitted within %v, want at most the limit of 100: a lost set was not seen", most, time.Second-slop)
	}
	if len(admitted) < 200 {
		t.Fatalf("only %d admitted in 4.35 s: recovery should cost about a window per loss, not the run", len(admitted))
	}
}
