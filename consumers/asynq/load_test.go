package asynqthrottle

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// 100 tasks through a limit of 10 per second: every task is processed
// exactly once, none is archived or counted as failed, and the handler
// never starts more than 10 times in any second. Half the tasks have
// MaxRetry(0), so they take the re-enqueue path.
func TestHundredTasksThroughTenPerSecond(t *testing.T) {
	if testing.Short() {
		t.Skip("takes about 10-15 s")
	}
	e := newEnv(t)
	const n, limit = 100, 10
	lim, err := window.NewMemory(throttle.PerSecond(limit))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(nil)
	e.serve(t, asynq.Config{Concurrency: 20}, NewHandler(rec, newGate(t, lim), WithClient(e.client)))

	start := time.Now()
	for i := range n {
		opts := []asynq.Option{asynq.MaxRetry(3)}
		if i%2 == 0 {
			opts[0] = asynq.MaxRetry(0)
		}
		e.enqueue(t, asynq.NewTask("work", []byte(strconv.Itoa(i))), opts...)
	}
	rec.waitRuns(t, n, 60*time.Second)
	qi := e.settled(t, "default", 5*time.Second)
	time.Sleep(500 * time.Millisecond) // no late duplicates
	t.Logf("%d tasks in %v", n, time.Since(start).Round(time.Millisecond))

	var starts []time.Time
	for i := range n {
		runs := rec.runsOf(strconv.Itoa(i))
		if len(runs) != 1 {
			t.Errorf("task %d ran %d times, want 1", i, len(runs))
		}
		for _, r := range runs {
			starts = append(starts, r.at)
		}
	}
	if len(starts) != n {
		t.Fatalf("%d handler runs, want %d", len(starts), n)
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	for i := limit; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-limit]); d < time.Second {
			t.Errorf("handler starts %d..%d within %v: more than %d in one second", i-limit+1, i+1, d, limit)
		}
	}
	if qi.Archived != 0 || qi.FailedTotal != 0 {
		t.Errorf("archived %d, failed total %d; want 0, 0", qi.Archived, qi.FailedTotal)
	}
}

// 50 tasks at once through 10 per second with reservations: a task whose
// slot is near waits for it in the handler; one whose slot is further is
// retried once, comes back before its slot and waits for the rest. So no
// task is rejected back to asynq more than once, every task runs exactly
// once, and the handler never starts more than 10 times in any second.
func TestReservedTasksComeBackOnce(t *testing.T) {
	e := newEnv(t)
	const n, limit = 50, 10
	lim, err := window.NewMemory(throttle.PerSecond(limit))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	retries := map[string]int{}
	cfg := asynq.Config{
		Concurrency:              n, // every task in flight at once: slots up to 4 s ahead
		DelayedTaskCheckInterval: time.Second,
		RetryDelayFunc:           RetryDelayFunc(nil),
		ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, task *asynq.Task, err error) {
			var rl *RateLimitError
			if errors.As(err, &rl) {
				mu.Lock()
				retries[string(task.Payload())]++
				mu.Unlock()
			}
		}),
	}
	rec := newRecorder(nil)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	g := newGate(t, lim, throttle.WithReservations(10*time.Second), throttle.WithMeterProvider(mp))
	e.serve(t, cfg, NewHandler(rec, g, WithClient(e.client), WithServerConfig(cfg)))

	start := time.Now()
	for i := range n {
		e.enqueue(t, asynq.NewTask("work", []byte(strconv.Itoa(i))), asynq.MaxRetry(3))
	}
	rec.waitRuns(t, n, 30*time.Second)
	elapsed := time.Since(start)
	qi := e.settled(t, "default", 5*time.Second)
	time.Sleep(300 * time.Millisecond) // no late duplicates
	t.Logf("%d tasks at %d/s in %v (the limit's own time: %v)", n, limit, elapsed.Round(time.Millisecond), time.Duration(n/limit-1)*time.Second)

	var starts []time.Time
	for i := range n {
		runs := rec.runsOf(strconv.Itoa(i))
		if len(runs) != 1 {
			t.Errorf("task %d ran %d times, want 1", i, len(runs))
		}
		for _, r := range runs {
			starts = append(starts, r.at)
		}
	}
	// The window is exact at its admissions; a handler starts a few
	// microseconds after its admission (more under -race), and a task
	// admitted on its slot after waiting starts sooner after it than one
	// admitted on arrival: allow 20 ms for that, as TestRateOverStream
	// does.
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	const latency = 20 * time.Millisecond
	for i := limit; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-limit]); d < time.Second-latency {
			t.Errorf("handler starts %d..%d within %v: more than %d in one second", i-limit+1, i+1, d, limit)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for p, r := range retries {
		total += r
		if r > 1 {
			t.Errorf("task %s rejected back to asynq %d times, want at most once", p, r)
		}
	}
	if total == 0 {
		t.Errorf("no task was retried: the test does not exercise far slots")
	}
	// Every task sent back to asynq is one disposition, retry or
	// deferred; one that waited in the handler, one wait.
	counts := throttletest.Sums(t, reader, throttle.DispositionsMetric, throttle.DispositionAttr)
	if back := counts[DispositionRetry] + counts[DispositionDeferred]; back != int64(total) || counts[DispositionWait] > n {
		t.Errorf("dispositions %v: want retry + deferred = the %d rejections asynq saw, and at most %d waits", counts, total, n)
	}
	if qi.Archived != 0 || qi.FailedTotal != 0 {
		t.Errorf("archived %d, failed total %d; want 0, 0", qi.Archived, qi.FailedTotal)
	}
}
