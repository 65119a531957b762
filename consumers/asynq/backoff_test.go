package asynqthrottle

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// TestBackoff: a handler that returns Backoff on its first run pauses the
// task's key, and the task runs again after at least d, once, with no
// retry charged, no failure counted and nothing archived, and one
// admission charged in all: through asynq's retry, waiting in the handler
// on its last attempt, or as a re-enqueued copy on its last attempt.
func TestBackoff(t *testing.T) {
	tests := []struct {
		name       string
		maxRetry   int
		withClient bool
	}{
		{"retry", 3, false},
		{"last attempt, wait", 0, false},
		{"last attempt, requeue", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const d = time.Second
			e := newEnv(t)
			lim, err := window.NewMemory(throttle.Rate{Count: 100, Per: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder(func(_ string, n int) error {
				if n == 1 {
					return Backoff(d)
				}
				return nil
			})
			opts := []Option{WithKeyFunc(payloadKey)}
			if tt.withClient {
				opts = append(opts, WithClient(e.client))
			}
			var mu sync.Mutex
			var reported []error
			opts = append(opts, WithErrorHandler(func(_ context.Context, _ *asynq.Task, err error) {
				mu.Lock()
				reported = append(reported, err)
				mu.Unlock()
			}))
			e.serve(t, asynq.Config{Queues: map[string]int{"default": 1}}, NewHandler(rec, newGate(t, lim), opts...))
			e.enqueue(t, asynq.NewTask("job:partner", []byte("tenant-a")), asynq.MaxRetry(tt.maxRetry))

			rec.waitRuns(t, 1, 10*time.Second)
			var paused throttle.Decision
			deadline := time.Now().Add(2 * time.Second)
			for {
				paused, _ = lim.Peek(context.Background(), "tenant-a", 1)
				if !paused.Allowed || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if paused.Allowed || paused.RetryAfter < d/2 {
				t.Errorf("key after the Backoff: %+v; want paused for about %v", paused, d)
			}
			rec.waitRuns(t, 2, 10*time.Second)
			qi := e.settled(t, "default", 5*time.Second)
			time.Sleep(300 * time.Millisecond) // no third run
			runs := rec.runsOf("tenant-a")
			if len(runs) != 2 {
				t.Fatalf("%d runs, want 2", len(runs))
			}
			if gap := runs[1].at.Sub(runs[0].at); gap < d {
				t.Errorf("second run %v after the first, want >= %v", gap, d)
			}
			if runs[1].retried != 0 {
				t.Errorf("second run with retry count %d, want 0 (no retry charged)", runs[1].retried)
			}
			if tt.withClient && runs[1].id != CopyTaskID(runs[0].id) {
				t.Errorf("second run as %s, want the copy %s", runs[1].id, CopyTaskID(runs[0].id))
			}
			if qi.Archived != 0 || qi.FailedTotal != 0 {
				t.Errorf("archived %d, failed %d; want 0 and 0", qi.Archived, qi.FailedTotal)
			}
			if p, _ := lim.Peek(context.Background(), "tenant-a", 1); p.Remaining != 98 {
				t.Errorf("Peek after: Remaining %d, want 98 (one admission charged)", p.Remaining)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reported) != 0 {
				t.Errorf("error handler got %v", reported)
			}
		})
	}
}

func TestBackoffError(t *testing.T) {
	var oe *throttle.OptionError
	if err := Backoff(0); !errors.As(err, &oe) || oe.Field != "d" || !IsFailure(err) {
		t.Fatalf("Backoff(0) = %v; want an OptionError naming d, a failure", err)
	}
	err := Backoff(2 * time.Second)
	if IsFailure(err) || !errors.Is(err, throttle.ErrLimited) {
		t.Fatalf("Backoff(2s): IsFailure %v, ErrLimited %v; want throttling", IsFailure(err), errors.Is(err, throttle.ErrLimited))
	}
	if d, ok := retryDelay(time.Now(), err); !ok || d != 3*time.Second {
		t.Fatalf("retry delay of a bare Backoff(2s) = %v, %v; want 3s", d, ok)
	}
}
