package natsthrottle

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// TestStoreFailuresReachErrorHandler pauses the Redis of a window.Redis
// limiter: every decision is then the failure policy's, and the error
// handler receives the store failures as *throttle.StoreError, rate
// limited, while no message is handled (fail closed) or lost.
func TestStoreFailuresReachErrorHandler(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	lim, err := window.NewRedis(client, throttle.PerSecond(1000), window.WithTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Warm up with a patient twin on the same client (a connection open,
	// the script loaded): a first call can take longer than 20 ms.
	warm, err := window.NewRedis(client, throttle.PerSecond(1000), window.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	counted := throttle.LimiterFunc(func(ctx context.Context, key string, n int) (throttle.Decision, error) {
		calls.Add(1)
		return lim.AllowN(ctx, key, n)
	})
	g, err := throttle.NewGate(counted, throttle.WithDegradedRetryAfter(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := warm.Allow(testCtx(t), "warm-up"); err != nil {
		t.Fatal(err)
	}
	// A paused Redis: connections open, no replies (a stopped one would
	// leave go-redis redialling in the background past the test).
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}

	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{})
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, g, WithErrorHandler(reported.handle), WithJitter(0, 0))
	const total = 40
	for i := range total {
		e.publish(t, "jobs.a", strconv.Itoa(i), nil)
	}
	start := time.Now()
	consume(t, c, h.Handle)
	waitFor(t, 10*time.Second, "every message decided", func() bool { return calls.Load() >= total })
	time.Sleep(50 * time.Millisecond) // the last report follows its decision
	if n := rec.len(); n != 0 {
		t.Fatalf("%d messages handled with the store down and fail-closed, want 0", n)
	}
	elapsed := time.Since(start)
	got := reported.all()
	// 3 at once, then 2 per second; every failure is counted once, by its
	// own report or by a later one's Suppressed.
	most := 3 + int(2*elapsed.Seconds()) + 1
	if reported.matching(throttle.ErrStore) != len(got) || len(got) < 3 || len(got) > most {
		t.Fatalf("%d errors reported for %d failed decisions in %v (%v), want only store failures, 3 to %d", len(got), total, elapsed, got, most)
	}
	failures := 0
	for _, err := range got {
		var se *throttle.StoreError
		if errors.As(err, &se) {
			failures += 1 + se.Suppressed
		}
	}
	if failures > total {
		t.Fatalf("reports count %d failures, more than the %d decisions", failures, total)
	}
	var se *throttle.StoreError
	if !errors.As(got[0], &se) || se.Key != "jobs.a" || se.Policy != throttle.FailClosed || se.Err == nil {
		t.Fatalf("first error = %v, want a *throttle.StoreError for key jobs.a", got[0])
	}
	t.Logf("%d decisions failed, %d reported; first: %v", total, len(got), got[0])
}
