package window

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestRedisPauseServerTime pauses on the Redis server's TIME: the pause
// holds for its time, then the key is admitted again, and the pause key
// is gone once it ended.
func TestRedisPauseServerTime(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	l := newTestRedis(t, client, throttle.Rate{Count: 5, Per: time.Second})
	ctx := context.Background()
	const d = 300 * time.Millisecond
	start := time.Now()
	if err := l.Pause(ctx, "k", d); err != nil {
		t.Fatal(err)
	}
	dec, err := l.Allow(ctx, "k")
	if err != nil || dec.Allowed || dec.RetryAfter <= 0 || dec.RetryAfter > d+time.Millisecond {
		t.Fatalf("while paused: %+v, %v; want a rejection with RetryAfter in (0, %v]", dec, err, d)
	}
	if p, err := l.Peek(ctx, "k", 1); err != nil || p.Allowed || p.RetryAfter <= 0 {
		t.Fatalf("Peek while paused: %+v, %v", p, err)
	}
	if left := d - time.Since(start); dec.RetryAfter < left {
		t.Fatalf("RetryAfter %v < the %v left of the pause", dec.RetryAfter, left)
	}
	time.Sleep(dec.RetryAfter)
	if dec, err = l.Allow(ctx, "k"); err != nil || !dec.Allowed {
		t.Fatalf("after the pause: %+v, %v; want admitted", dec, err)
	}
	time.Sleep(5 * time.Millisecond) // past the key's expiry (1 ms after the pause)
	if n, err := client.Exists(ctx, l.key("k")+":pause").Result(); err != nil || n != 0 {
		t.Fatalf("pause key exists = %d, %v after the pause; want it expired", n, err)
	}
}
