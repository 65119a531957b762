package concurrency

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

// TestNeverMoreThanLimitHolders runs goroutines that acquire slots of one
// key and release them, counting the holders between each admission and
// its release: never more than limit at once. Leases are long, so only
// releases free slots; each limiter runs on its default clock.
func TestNeverMoreThanLimitHolders(t *testing.T) {
	const (
		limit      = 3
		goroutines = 12
		rounds     = 60
	)
	limiters := []struct {
		name string
		l    limiter
	}{
		{"memory", func() limiter {
			m, err := NewMemory(limit)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}()},
		{"redis", newTestRedis(t, redistest.Shared(t).Client(t), limit)},
	}
	for _, tt := range limiters {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			var (
				holders, most  atomic.Int64
				admitted, rejd atomic.Int64
				wg             sync.WaitGroup
			)
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range rounds {
						id := strconv.Itoa(g) + "/" + strconv.Itoa(r)
						d, err := tt.l.Acquire(ctx, "shared", id, time.Minute)
						if err != nil {
							t.Error(err)
							return
						}
						if !d.Allowed {
							rejd.Add(1)
							if d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
								t.Errorf("rejected with RetryAfter %v", d.RetryAfter)
							}
							continue
						}
						admitted.Add(1)
						n := holders.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						if r%4 == 0 {
							time.Sleep(50 * time.Microsecond)
						}
						// Acquiring again is idempotent, never a second slot.
						if d, err := tt.l.Acquire(ctx, "shared", id, time.Minute); err != nil || !d.Allowed {
							t.Errorf("Acquire by a holder = %+v, %v", d, err)
						}
						holders.Add(-1)
						if err := tt.l.Release(ctx, "shared", id); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("%d admitted, %d rejected, at most %d holders at once", admitted.Load(), rejd.Load(), most.Load())
			if most.Load() > limit {
				t.Fatalf("%d holders at once, limit %d", most.Load(), limit)
			}
			if admitted.Load() == 0 {
				t.Fatal("nothing admitted")
			}
			// Every slot was released: all of them are free again.
			d, err := tt.l.Acquire(ctx, "shared", "after", time.Minute)
			if err != nil || !d.Allowed || d.Remaining != limit-1 {
				t.Fatalf("Acquire after all released = %+v, %v", d, err)
			}
		})
	}
}
