package concurrency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// clusterKeys returns n keys: throttletest.OddKeys and generated ones with
// braces, colons and non-ASCII text.
func clusterKeys(n int) []string {
	keys := throttletest.OddKeys()
	patterns := []string{"tenant:%d", "{tenant}:%d", "a}{%d", "{%d}", "Zürich/%d", "東京:{%d}", "\xff\x00%d", "%%7B%d%%7D", "job:%d:}"}
	for i := 0; len(keys) < n; i++ {
		keys = append(keys, fmt.Sprintf(patterns[i%len(patterns)], i))
	}
	return keys[:n]
}

// TestCluster runs keys of every spelling, spread over the three masters
// of a Redis Cluster, through Acquire, Renew and Release, on the server
// clock and on a client clock (two Redis keys per call, in one slot): no
// CROSSSLOT or other error, and each key limited as on a single server.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	keys := clusterKeys(300)
	masters := map[int]int{}
	for _, k := range keys {
		rk := rediskey.Key(defaultPrefix, k)
		masters[c.MasterFor(rk)]++
		if rediskey.Slot(rk) != rediskey.Slot(rk+clockSuffix) {
			t.Fatalf("key %.40q: the clock floor is not in the key's slot", k)
		}
	}
	if len(masters) != len(c.Addrs()) {
		t.Fatalf("keys on %d masters only: %v", len(masters), masters)
	}
	t.Logf("%d keys, per master %v", len(keys), masters)
	client := c.Client(t)
	for _, clocked := range []bool{false, true} {
		t.Run(fmt.Sprintf("client clock %v", clocked), func(t *testing.T) {
			var opts []Option
			if clocked {
				opts = append(opts, WithClock(throttletest.NewClock(throttletest.T0)))
			}
			l := newTestRedis(t, client, 2, opts...)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 16)
			for _, k := range keys {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					if err := clusterRound(l, k); err != nil {
						t.Errorf("key %.40q: %v", k, err)
					}
				}()
			}
			wg.Wait()
		})
	}
}

// clusterRound fills the two slots of key, is rejected, renews, releases
// and is admitted again.
func clusterRound(l *Redis, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, id := range []string{"a", "b", "c"} {
		d, err := l.Acquire(ctx, key, id, time.Minute)
		if err != nil {
			return err
		}
		if d.Allowed != (i < 2) || d.Remaining != max(1-i, 0) {
			return fmt.Errorf("Acquire(%q) = %+v", id, d)
		}
	}
	if err := l.Renew(ctx, key, "a", time.Minute); err != nil {
		return fmt.Errorf("Renew(a): %w", err)
	}
	if err := l.Renew(ctx, key, "c", time.Minute); !errors.Is(err, ErrNotHeld) {
		return fmt.Errorf("Renew(c) = %v, want ErrNotHeld", err)
	}
	if err := l.Release(ctx, key, "b"); err != nil {
		return err
	}
	if d, err := l.Acquire(ctx, key, "c", time.Minute); err != nil || !d.Allowed || d.Remaining != 0 {
		return fmt.Errorf("Acquire(c) after Release(b) = %+v, %v", d, err)
	}
	return nil
}
