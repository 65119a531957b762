package asynqthrottle

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/queuethrottle/queuethrottle/throttle"
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
