package asynqthrottle

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestStoreFailuresReachErrorHandler checks that decisions the failure
// policy made because the limiter failed reach WithErrorHandler as
// *throttle.StoreError, with their task, rate limited (3 at once), while
// the tasks go on as the policy decided.
func TestStoreFailuresReachErrorHandler(t *testing.T) {
	down := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	failing := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, down
	})
	for _, policy := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) {
			var mu sync.Mutex
			var got []error
			var tasks []string
			ran := 0
			next := asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran++; return nil })
			h := NewHandler(next, newGate(t, failing, throttle.WithFailurePolicy(policy)), WithKeyFunc(payloadKey),
				WithErrorHandler(func(_ context.Context, task *asynq.Task, err error) {
					mu.Lock()
					defer mu.Unlock()
					got = append(got, err)
					tasks = append(tasks, string(task.Payload()))
				}))
			const total = 50
			for range total {
				err := h.ProcessTask(context.Background(), asynq.NewTask("job", []byte("tenant-a")))
				if policy == throttle.FailClosed && !errors.Is(err, throttle.ErrLimited) {
					t.Fatalf("fail-closed ProcessTask = %v, want a rate-limit rejection", err)
				}
				if policy == throttle.FailOpen && err != nil {
					t.Fatalf("fail-open ProcessTask = %v, want nil", err)
				}
			}
			if policy == throttle.FailOpen && ran != total {
				t.Fatalf("fail-open ran %d tasks, want %d", ran, total)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) < 3 || len(got) > 4 {
				t.Fatalf("%d errors reported for %d failed decisions in a burst, want 3 (4 at most)", len(got), total)
			}
			var se *throttle.StoreError
			if !errors.As(got[0], &se) || !errors.Is(got[0], throttle.ErrStore) || !errors.Is(got[0], down) || se.Key != "tenant-a" || se.Policy != policy || tasks[0] != "tenant-a" {
				t.Fatalf("first report = %v for task %q, want a StoreError for key tenant-a", got[0], tasks[0])
			}
		})
	}
}
