package asynqthrottle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/concurrency"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// Both limiters of package concurrency are in-flight limiters.
var (
	_ throttle.InFlightLimiter = (*concurrency.Redis)(nil)
	_ throttle.InFlightLimiter = (*concurrency.Memory)(nil)
)

// rejections counts, from asynq's ErrorHandler, the in-flight refusals
// and every other error.
type rejections struct {
	slot, other atomic.Int64
	mu          sync.Mutex
	others      []error
}

func (r *rejections) HandleError(_ context.Context, _ *asynq.Task, err error) {
	var rl *RateLimitError
	if errors.As(err, &rl) && rl.slot && rl.Err == nil {
		r.slot.Add(1)
		return
	}
	r.other.Add(1)
	r.mu.Lock()
	r.others = append(r.others, err)
	r.mu.Unlock()
}

// TestInFlightLimitsTasks runs a burst of tasks of one key through an
// asynq server of Concurrency 8 whose middleware allows 2 handlers of a
// key at once: never more than 2 run at once, every task runs exactly
// once, refused tasks are retried (never archived, never failed; half of
// them have MaxRetry 0 and take the re-enqueue path), and every slot is
// free afterwards.
func TestInFlightLimitsTasks(t *testing.T) {
	const (
		limit = 2
		tasks = 8
		work  = 100 * time.Millisecond
	)
	for _, name := range []string{"memory", "redis"} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			var lim throttle.InFlightLimiter
			if name == "memory" {
				m, err := concurrency.NewMemory(limit)
				if err != nil {
					t.Fatal(err)
				}
				lim = m
			} else {
				rc := redis.NewClient(&redis.Options{Addr: e.addr.Addr, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = rc.Close() })
				r, err := concurrency.NewRedis(rc, limit, concurrency.WithPrefix(redistest.Prefix("asynqthrottle")), concurrency.WithTimeout(redistest.CallTimeout))
				if err != nil {
					t.Fatal(err)
				}
				lim = r
			}
			rate, err := window.NewMemory(throttle.PerSecond(1000))
			if err != nil {
				t.Fatal(err)
			}
			var now, most atomic.Int64
			rec := newRecorder(func(string, int) error {
				n := now.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(work)
				now.Add(-1)
				return nil
			})
			var rej rejections
			var limErrs atomic.Int64
			h := NewHandler(rec, newGate(t, rate), WithClient(e.client), WithKeyFunc(func(context.Context, *asynq.Task) (string, error) { return "tenant", nil }),
				WithInFlight(lim, 300*time.Millisecond), WithErrorHandler(func(context.Context, *asynq.Task, error) { limErrs.Add(1) }))
			e.serve(t, asynq.Config{Concurrency: 8, ErrorHandler: &rej}, h)
			for i := range tasks {
				opts := []asynq.Option{asynq.MaxRetry(3)}
				if i%2 == 0 {
					opts[0] = asynq.MaxRetry(0)
				}
				e.enqueue(t, asynq.NewTask("work", []byte(strconv.Itoa(i))), opts...)
			}
			rec.waitRuns(t, tasks, 15*time.Second)
			qi := e.settled(t, "default", 5*time.Second)
			time.Sleep(300 * time.Millisecond) // no late duplicates
			for i := range tasks {
				if n := len(rec.runsOf(strconv.Itoa(i))); n != 1 {
					t.Errorf("task %d ran %d times, want 1", i, n)
				}
			}
			if m := most.Load(); m != limit {
				t.Errorf("%d handlers ran at once, want exactly %d", m, limit)
			}
			if rej.slot.Load() == 0 {
				t.Error("no task was refused a slot")
			}
			if rej.other.Load() != 0 || limErrs.Load() != 0 {
				t.Errorf("other errors: %v; %d in-flight limiter errors", rej.others, limErrs.Load())
			}
			if qi.Archived != 0 || qi.FailedTotal != 0 {
				t.Errorf("archived %d, failed total %d; want 0, 0", qi.Archived, qi.FailedTotal)
			}
			t.Logf("%d in-flight refusals", rej.slot.Load())
			for i := range limit {
				d, err := lim.Acquire(context.Background(), "tenant", fmt.Sprint("probe", i), time.Second)
				if err != nil || !d.Allowed {
					t.Fatalf("Acquire after the run = %+v, %v; want admitted", d, err)
				}
			}
		})
	}
}

// failingInFlight is an in-flight limiter whose store is down.
type failingInFlight struct{}

var errSlotStore = errors.New("slot store: connection refused")

func (failingInFlight) Acquire(context.Context, string, string, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{}, errSlotStore
}

func (failingInFlight) Renew(context.Context, string, string, time.Duration) error {
	return errSlotStore
}

func (failingInFlight) Release(context.Context, string, string) error { return errSlotStore }

// TestInFlightStoreDown: when the in-flight limiter fails, the Gate's
// failure policy decides (FailOpen runs the handler without a slot,
// FailClosed returns a *RateLimitError with the degraded retry-after,
// which is retried and never archived) and the error is reported.
func TestInFlightStoreDown(t *testing.T) {
	for _, policy := range []throttle.FailurePolicy{throttle.FailOpen, throttle.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			e := newEnv(t)
			rate, err := window.NewMemory(throttle.PerSecond(100))
			if err != nil {
				t.Fatal(err)
			}
			g := newGate(t, rate, throttle.WithFailurePolicy(policy), throttle.WithDegradedRetryAfter(100*time.Millisecond))
			rec := newRecorder(nil)
			var limErrs atomic.Int64
			var rl atomic.Pointer[RateLimitError]
			h := NewHandler(rec, g, WithClient(e.client), WithInFlight(failingInFlight{}, time.Second),
				WithErrorHandler(func(_ context.Context, _ *asynq.Task, err error) {
					if errors.Is(err, errSlotStore) {
						limErrs.Add(1)
					}
				}))
			e.serve(t, asynq.Config{ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
				var r *RateLimitError
				if errors.As(err, &r) {
					rl.Store(r)
				}
			})}, h)
			e.enqueue(t, asynq.NewTask("work", []byte("x")), asynq.MaxRetry(3))
			if policy == throttle.FailOpen {
				rec.waitRuns(t, 1, 5*time.Second)
				if limErrs.Load() != 1 {
					t.Errorf("%d in-flight limiter errors reported, want 1", limErrs.Load())
				}
				return
			}
			deadline := time.Now().Add(5 * time.Second)
			for rl.Load() == nil || limErrs.Load() < 2 {
				if time.Now().After(deadline) {
					t.Fatalf("no retries: %d errors reported", limErrs.Load())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if r := rl.Load(); r.RetryIn != 100*time.Millisecond || r.Decision.Source != throttle.SourceDegraded {
				t.Errorf("RateLimitError %+v, want RetryIn 100ms from a degraded decision", r)
			}
			if rec.total() != 0 {
				t.Fatal("handled without a slot under FailClosed")
			}
			if qi := e.queueInfo(t, "default"); qi.Archived != 0 {
				t.Errorf("%d archived", qi.Archived)
			}
		})
	}
}

func TestWithInFlightBadLease(t *testing.T) {
	m, err := concurrency.NewMemory(1)
	if err != nil {
		t.Fatal(err)
	}
	rate, err := window.NewMemory(throttle.PerSecond(1))
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(newRecorder(nil), newGate(t, rate), WithInFlight(m, 0))
	if err := h.ProcessTask(context.Background(), asynq.NewTask("work", nil)); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("ProcessTask with lease 0 = %v, want ErrInvalidOption", err)
	}
}
