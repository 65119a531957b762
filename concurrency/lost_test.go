package concurrency

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

// TestRedisLostSlotsNeverOverAdmit: 3 processes x 8 goroutines on one key
// with 5 slots (leases of 1 s, held about 50 ms); Redis is killed and
// restarted empty 150 ms later, and then flushed, while slots are held.
// The first call to find the set gone while one of its leases is live
// takes every slot until a lease has passed, so that no more than 5 are
// ever held at once (without the check, up to 10: the holders of the lost
// set and as many new ones).
func TestRedisLostSlotsNeverOverAdmit(t *testing.T) {
	srv := redistest.Start(t)
	prefix := redistest.Prefix("concurrency")
	var limiters []*Redis
	for range 3 {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		l, err := NewRedis(c, 5, WithPrefix(prefix), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		limiters = append(limiters, l)
	}
	var holders, most, admitted atomic.Int64
	var seq atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				for {
					select {
					case <-stop:
						return
					default:
					}
					id := strconv.FormatInt(seq.Add(1), 10)
					d, err := l.Acquire(ctx, "k", id, time.Second)
					if err != nil || !d.Allowed {
						time.Sleep(5 * time.Millisecond)
						continue
					}
					admitted.Add(1)
					n := holders.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(50 * time.Millisecond)
					holders.Add(-1)
					_ = l.Release(ctx, "k", id) // may fail while Redis is down: the lease ends
				}
			}()
		}
	}
	time.Sleep(700 * time.Millisecond)
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
	t.Logf("%d slots given; at most %d held at once", admitted.Load(), most.Load())
	if most.Load() > 5 {
		t.Fatalf("%d slots held at once, limit 5: a lost set gave new slots beside the live ones", most.Load())
	}
	if admitted.Load() < 100 {
		t.Fatalf("only %d slots given in 3.85 s: a loss should cost about a lease, not the run", admitted.Load())
	}
}

// TestRedisMarkerIDs: ids that look like slots.lua's own members are ids
// like any other: they take a slot, and releasing them frees only theirs.
func TestRedisMarkerIDs(t *testing.T) {
	l := newTestRedis(t, redistest.Shared(t).Client(t), 1)
	ctx := context.Background()
	if d, err := l.Acquire(ctx, "k", "a", 10*time.Second); err != nil || !d.Allowed {
		t.Fatalf("Acquire(a) = %+v, %v", d, err)
	}
	for _, id := range []string{"\x00alive", "\x00lost:1", "\x00"} {
		if d, err := l.Acquire(ctx, "k", id, 10*time.Second); err != nil || d.Allowed {
			t.Errorf("Acquire(%q) beside the only slot's holder = %+v, %v; want rejected", id, d, err)
		}
		if err := l.Release(ctx, "k", id); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := l.Acquire(ctx, "k", "b", 10*time.Second); err != nil || d.Allowed {
		t.Errorf("Acquire(b) while a holds the slot = %+v, %v; want rejected", d, err)
	}
	if err := l.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Acquire(ctx, "k", "\x00alive", 10*time.Second); err != nil || !d.Allowed {
		t.Errorf("Acquire(\\x00alive) of a free slot = %+v, %v; want admitted", d, err)
	}
}
