package asynqthrottle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// A rejected task comes back no earlier than its retry-after, whatever the
// sub-second phase of the rejection (asynq keeps retry times in whole
// seconds), with its retry count unchanged and without counting as a
// failure.
func TestRejectedTaskComesBackAfterRetryAfter(t *testing.T) {
	e := newEnv(t)
	const n = 10
	const retryAfter = 300 * time.Millisecond
	plan := make(map[string][]time.Duration)
	for i := range n {
		plan[fmt.Sprint("t", i)] = []time.Duration{retryAfter, retryAfter}
	}
	lim := newScripted(plan)
	rec := newRecorder(nil)
	var mu sync.Mutex
	var handled []error
	e.serve(t, asynq.Config{
		Concurrency: n,
		ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
			mu.Lock()
			handled = append(handled, err)
			mu.Unlock()
		}),
	}, NewHandler(rec, newGate(t, lim), WithKeyFunc(payloadKey)))

	// Spread the first decisions over one second, so that some land late
	// in a second, where a delay truncated to whole seconds would be early.
	for i := range n {
		e.enqueue(t, asynq.NewTask("job", []byte(fmt.Sprint("t", i))), asynq.MaxRetry(3))
		time.Sleep(100 * time.Millisecond)
	}
	rec.waitRuns(t, n, 20*time.Second)
	qi := e.settled(t, "default", 5*time.Second)

	for i := range n {
		key := fmt.Sprint("t", i)
		calls := lim.callsOf(key)
		runs := rec.runsOf(key)
		if len(calls) != 3 || len(runs) != 1 {
			t.Fatalf("%s: %d decisions and %d runs, want 3 and 1", key, len(calls), len(runs))
		}
		for j := 1; j < len(calls); j++ {
			if early := calls[j-1].at.Add(calls[j-1].retryAfter).Sub(calls[j].at); early > 0 {
				t.Errorf("%s: decision %d came %v before the retry-after of decision %d", key, j+1, early, j)
			}
		}
		if runs[0].at.Before(calls[1].at.Add(retryAfter)) {
			t.Errorf("%s: handler ran before the last retry-after", key)
		}
		if runs[0].retried != 0 {
			t.Errorf("%s: retry count %d after throttling, want 0", key, runs[0].retried)
		}
	}
	if qi.Failed != 0 || qi.FailedTotal != 0 || qi.Archived != 0 {
		t.Errorf("queue: failed %d, failed total %d, archived %d; want 0, 0, 0", qi.Failed, qi.FailedTotal, qi.Archived)
	}
	if qi.ProcessedTotal != n {
		t.Errorf("queue: processed total %d, want %d", qi.ProcessedTotal, n)
	}
	mu.Lock()
	defer mu.Unlock()
	// asynq's ErrorHandler still sees every rejection.
	if len(handled) != 2*n {
		t.Errorf("ErrorHandler called %d times, want %d", len(handled), 2*n)
	}
	for _, err := range handled {
		var rl *RateLimitError
		if !errors.Is(err, throttle.ErrLimited) || !errors.As(err, &rl) || rl.RetryIn != retryAfter {
			t.Errorf("ErrorHandler got %v, want a *RateLimitError with RetryIn %v", err, retryAfter)
		}
	}
}

// Throttling never archives a task: not one with MaxRetry(0), nor one on
// its last genuine attempt; with WithClient a copy is re-enqueued, without
// it the task waits in the handler.
func TestNeverArchivedByThrottling(t *testing.T) {
	for _, withClient := range []bool{true, false} {
		name := "wait"
		if withClient {
			name = "requeue"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testNeverArchived(t, withClient)
		})
	}
}

func testNeverArchived(t *testing.T, withClient bool) {
	e := newEnv(t)
	const queue = "throttled"
	const ra = 200 * time.Millisecond
	lim := newScripted(map[string][]time.Duration{
		// MaxRetry(0), rejected three times.
		"timeout":  {ra, ra, ra},
		"deadline": {ra, ra, ra},
		// MaxRetry(1): fails genuinely, then rejected twice on its last
		// attempt.
		"last": {0, ra, ra},
	})
	rec := newRecorder(func(p string, n int) error {
		if p == "last" && n == 1 {
			return errors.New("boom")
		}
		return nil
	})
	var opts []Option
	opts = append(opts, WithKeyFunc(payloadKey))
	if withClient {
		opts = append(opts, WithClient(e.client))
	}
	e.serve(t, asynq.Config{Queues: map[string]int{queue: 1}}, NewHandler(rec, newGate(t, lim), opts...))

	headers := map[string]string{"tenant": "acme", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	deadline := time.Now().Add(45 * time.Second).Truncate(time.Second)
	orig := map[string]*asynq.TaskInfo{
		"timeout":  e.enqueue(t, asynq.NewTaskWithHeaders("job:a", []byte("timeout"), headers), asynq.Queue(queue), asynq.MaxRetry(0), asynq.Timeout(37*time.Second)),
		"deadline": e.enqueue(t, asynq.NewTaskWithHeaders("job:b", []byte("deadline"), headers), asynq.Queue(queue), asynq.MaxRetry(0), asynq.Deadline(deadline)),
		"last":     e.enqueue(t, asynq.NewTaskWithHeaders("job:c", []byte("last"), headers), asynq.Queue(queue), asynq.MaxRetry(1)),
	}
	rec.waitRuns(t, 4, 20*time.Second)
	qi := e.settled(t, queue, 5*time.Second)
	time.Sleep(300 * time.Millisecond) // no late duplicates
	if got := rec.total(); got != 4 {
		t.Fatalf("%d handler runs, want 4 (one per task, two for the genuine failure)", got)
	}
	if qi.Archived != 0 {
		t.Errorf("archived %d tasks, want 0", qi.Archived)
	}
	if qi.FailedTotal != 1 {
		t.Errorf("failed total %d, want 1 (the genuine failure)", qi.FailedTotal)
	}

	for p, info := range orig {
		runs := rec.runsOf(p)
		r := runs[len(runs)-1]
		if r.typ != info.Type || r.queue != queue || r.headers["tenant"] != "acme" || len(r.headers) != len(headers) {
			t.Errorf("%s: ran as type %q in queue %q with headers %v; want %q, %q, %v", p, r.typ, r.queue, r.headers, info.Type, queue, headers)
		}
		calls := lim.callsOf(p)
		for j := 1; j < len(calls); j++ {
			if early := calls[j-1].at.Add(calls[j-1].retryAfter).Sub(calls[j].at); early > 0 {
				t.Errorf("%s: decision %d came %v before the retry-after of decision %d", p, j+1, early, j)
			}
		}
		if last := calls[len(calls)-2]; r.at.Before(last.at.Add(last.retryAfter)) {
			t.Errorf("%s: ran %v before its retry-after", p, last.at.Add(last.retryAfter).Sub(r.at))
		}
		wantID, wantRetried, wantMax := info.ID, info.MaxRetry, info.MaxRetry
		if withClient {
			for range len(calls) - 1 - (len(runs) - 1) {
				wantID = CopyTaskID(wantID)
			}
			wantRetried, wantMax = 0, 0 // a copy gets the remaining budget
		}
		if r.id != wantID || r.retried != wantRetried || r.maxRetry != wantMax {
			t.Errorf("%s: ran as id %s retry %d/%d; want %s %d/%d", p, r.id, r.retried, r.maxRetry, wantID, wantRetried, wantMax)
		}
		if !withClient {
			continue
		}
		switch p {
		case "timeout":
			if left := r.deadline.Sub(r.at); left < 36*time.Second || left > 37*time.Second {
				t.Errorf("copy of a Timeout(37s) task has %v left", left)
			}
		case "deadline":
			if !r.deadline.Equal(deadline) {
				t.Errorf("copy of a Deadline(%v) task has deadline %v", deadline, r.deadline)
			}
		}
	}
}

// When the copy cannot be enqueued, the original goes back to asynq with
// the rejection and the enqueue error: asynq archives a task on its last
// attempt, and the archived task says why.
func TestRequeueFailureGoesBackToAsynq(t *testing.T) {
	e := newEnv(t)
	dead := asynq.NewClient(asynq.RedisClientOpt{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = dead.Close() })
	lim := newScripted(map[string][]time.Duration{"x": {time.Second}})
	rec := newRecorder(nil)
	errs := make(chan error, 10)
	e.serve(t, asynq.Config{
		ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) { errs <- err }),
	}, NewHandler(rec, newGate(t, lim), WithKeyFunc(payloadKey), WithClient(dead)))
	info := e.enqueue(t, asynq.NewTask("job", []byte("x")), asynq.MaxRetry(0))
	qi := e.settled(t, "default", 10*time.Second)
	if qi.Archived != 1 || rec.total() != 0 {
		t.Fatalf("archived %d, handler runs %d; want 1, 0", qi.Archived, rec.total())
	}
	ti, err := e.insp.GetTaskInfo("default", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ti.LastErr, "re-enqueue failed") {
		t.Errorf("archived task's last error %q does not say the re-enqueue failed", ti.LastErr)
	}
	err = <-errs
	var rl *RateLimitError
	if !errors.Is(err, throttle.ErrLimited) || !errors.As(err, &rl) || rl.Err == nil {
		t.Errorf("ErrorHandler got %v, want a *RateLimitError with Err set", err)
	}
}

// Genuine errors and panics keep asynq's semantics: the retry count grows
// and the task is archived after MaxRetry, throttling in between or not.
func TestGenuineErrorsAndPanics(t *testing.T) {
	e := newEnv(t)
	lim := newScripted(map[string][]time.Duration{"x": {0, 300 * time.Millisecond, 0, 0}})
	rec := newRecorder(func(_ string, n int) error {
		switch n {
		case 2:
			panic("boom 2")
		default:
			return fmt.Errorf("boom %d", n)
		}
	})
	var mu sync.Mutex
	var errs []error
	e.serve(t, asynq.Config{
		ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}),
	}, NewHandler(rec, newGate(t, lim), WithKeyFunc(payloadKey)))
	info := e.enqueue(t, asynq.NewTask("job", []byte("x")), asynq.MaxRetry(2))
	rec.waitRuns(t, 3, 15*time.Second)
	qi := e.settled(t, "default", 5*time.Second)

	runs := rec.runsOf("x")
	for i, r := range runs {
		if r.retried != i {
			t.Errorf("run %d: retry count %d, want %d", i+1, r.retried, i)
		}
	}
	if qi.Archived != 1 || qi.FailedTotal != 3 {
		t.Errorf("archived %d, failed total %d; want 1, 3", qi.Archived, qi.FailedTotal)
	}
	ti, err := e.insp.GetTaskInfo("default", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ti.State != asynq.TaskStateArchived || ti.Retried != 2 || ti.LastErr != "boom 3" {
		t.Errorf("task %v retried %d last error %q; want archived, 2, %q", ti.State, ti.Retried, ti.LastErr, "boom 3")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 4 {
		t.Fatalf("ErrorHandler saw %d errors, want 4: %v", len(errs), errs)
	}
	if !IsFailure(errs[0]) || IsFailure(errs[1]) || !errors.Is(errs[1], throttle.ErrLimited) ||
		!asynq.IsPanicError(errs[2]) || !IsFailure(errs[2]) || !IsFailure(errs[3]) {
		t.Errorf("ErrorHandler saw %v; want a failure, a rejection, a panic, a failure", errs)
	}
}

// A task that can never be admitted (key function error, cost above the
// limit) is archived at once, without running and without retrying.
func TestNeverAdmissibleIsArchived(t *testing.T) {
	e := newEnv(t)
	lim, err := window.NewMemory(throttle.PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(nil)
	e.serve(t, asynq.Config{}, NewHandler(rec, newGate(t, lim),
		WithKeyFunc(func(_ context.Context, t *asynq.Task) (string, error) {
			if t.Type() == "nokey" {
				return "", errors.New("no tenant")
			}
			return t.Type(), nil
		}),
		WithCostFunc(func(_ context.Context, t *asynq.Task) (int, error) { return len(t.Payload()), nil }),
	))
	a := e.enqueue(t, asynq.NewTask("nokey", []byte("x")), asynq.MaxRetry(5))
	b := e.enqueue(t, asynq.NewTask("big", []byte("123456")), asynq.MaxRetry(5))
	qi := e.settled(t, "default", 10*time.Second)
	if qi.Archived != 2 || rec.total() != 0 {
		t.Fatalf("archived %d, runs %d; want 2, 0", qi.Archived, rec.total())
	}
	for _, c := range []struct {
		id, want string
	}{{a.ID, "invalid key"}, {b.ID, "invalid cost"}} {
		ti, err := e.insp.GetTaskInfo("default", c.id)
		if err != nil {
			t.Fatal(err)
		}
		if ti.Retried != 0 || !strings.Contains(ti.LastErr, c.want) {
			t.Errorf("archived task: retried %d, last error %q; want 0 and %q", ti.Retried, ti.LastErr, c.want)
		}
	}
}
