package asynqthrottle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// tenantKey keys a task by its payload's prefix: "hog-7" is tenant hog.
func tenantKey(_ context.Context, t *asynq.Task) (string, error) {
	k, _, _ := strings.Cut(string(t.Payload()), "-")
	return k, nil
}

// deferrals counts, from asynq's ErrorHandler, the tasks the fair shares
// deferred (by payload, with when each was told to come back) and every
// other error.
type deferrals struct {
	mu       sync.Mutex
	byTask   map[string]int
	returnAt map[string]time.Time
	others   []error
}

func newDeferrals() *deferrals {
	return &deferrals{byTask: map[string]int{}, returnAt: map[string]time.Time{}}
}

func (d *deferrals) HandleError(_ context.Context, t *asynq.Task, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var rl *RateLimitError
	if errors.As(err, &rl) && rl.deferred && rl.Err == nil {
		d.byTask[string(t.Payload())]++
		d.returnAt[string(t.Payload())] = rl.returnAt
		return
	}
	d.others = append(d.others, err)
}

// concurrent counts the wrapped handler's runs at once.
type concurrent struct{ now, most atomic.Int64 }

func (c *concurrent) work(d time.Duration) func(string, int) error {
	return func(string, int) error {
		n := c.now.Add(1)
		for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
		}
		time.Sleep(d)
		c.now.Add(-1)
		return nil
	}
}

// TestFairShares: 60 tasks of one tenant at once, then a calm tenant's
// task every 200 ms, through 4 handlers of 200 ms (a backlog of 3 s).
// With fair shares the calm tasks start about as they come and are never
// deferred, the flood's tasks beyond their share go back once each, at
// most 4 run at once, and every task runs once; first come, first served
// (WithFair(false)), the calm ones wait behind the flood.
func TestFairShares(t *testing.T) {
	const hog, calm, work = 60, 10, 200 * time.Millisecond
	for _, fairOn := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fairOn), func(t *testing.T) {
			e := newEnv(t)
			var c concurrent
			rec := newRecorder(c.work(work))
			defs := newDeferrals()
			scfg := asynq.Config{Concurrency: 40, ErrorHandler: defs}
			if !fairOn {
				scfg.Concurrency = 4 // first come, first served on 4 workers
			}
			scfg.DelayedTaskCheckInterval = delayedCheck
			h := NewHandler(rec, roomyGate(t), WithKeyFunc(tenantKey), WithServerConfig(scfg), WithHandlers(4), WithFair(fairOn), WithInspector(e.insp))
			for i := range hog {
				e.enqueue(t, asynq.NewTask("work", fmt.Appendf(nil, "hog-%d", i)), asynq.MaxRetry(3))
			}
			e.serve(t, scfg, h)
			rec.waitRuns(t, 1, 5*time.Second)
			enqueued := map[string]time.Time{}
			for i := range calm {
				p := fmt.Sprintf("calm-%d", i)
				enqueued[p] = time.Now()
				e.enqueue(t, asynq.NewTask("work", []byte(p)), asynq.MaxRetry(3))
				time.Sleep(work)
			}
			rec.waitRuns(t, hog+calm, 30*time.Second)
			e.settled(t, "default", 5*time.Second)
			var waits []time.Duration
			for p, at := range enqueued {
				waits = append(waits, rec.runsOf(p)[0].at.Sub(at))
			}
			slices.Sort(waits)
			switch longest := waits[len(waits)-1]; {
			case fairOn && longest > 300*time.Millisecond:
				t.Errorf("calm's longest wait %v with fair shares, want well under the flood's backlog (waits %v)", longest, waits)
			case !fairOn && waits[0] < time.Second:
				t.Errorf("calm's shortest wait %v without fair shares, want it behind the flood's backlog", waits[0])
			}
			if most := c.most.Load(); most > 4 {
				t.Errorf("%d handlers at once, want <= 4", most)
			}
			defs.mu.Lock()
			defer defs.mu.Unlock()
			for p, n := range defs.byTask {
				if strings.HasPrefix(p, "calm") || n > 1 {
					t.Errorf("task %s deferred %d times, want calm tasks never, the flood's at most once", p, n)
				}
			}
			if fairOn && len(defs.byTask) == 0 {
				t.Error("no flood task deferred")
			}
			if len(defs.others) > 0 {
				t.Errorf("other errors: %v", defs.others)
			}
			for i := range hog {
				if n := len(rec.runsOf(fmt.Sprintf("hog-%d", i))); n != 1 {
					t.Errorf("hog-%d ran %d times", i, n)
				}
			}
			t.Logf("calm waits p50 %v max %v; %d flood tasks deferred", waits[len(waits)/2], waits[len(waits)-1], len(defs.byTask))
		})
	}
}

// TestInspectorBringsDeferredBack: two tenants flood 4 handlers of 50 ms
// at once, so each one's tasks beyond its share are deferred at half the
// handlers' pace; one tenant's flood is short, and once it is done the
// other's deferred tasks are brought back sooner (WithInspector) than
// they were told to come back, instead of leaving handlers idle.
func TestInspectorBringsDeferredBack(t *testing.T) {
	const work = 50 * time.Millisecond
	e := newEnv(t)
	var c concurrent
	rec := newRecorder(c.work(work))
	defs := newDeferrals()
	scfg := asynq.Config{Concurrency: 24, ErrorHandler: defs, DelayedTaskCheckInterval: delayedCheck}
	h := NewHandler(rec, roomyGate(t), WithKeyFunc(tenantKey), WithServerConfig(scfg), WithHandlers(4), WithInspector(e.insp))
	const long, short = 240, 12
	for i := range long {
		e.enqueue(t, asynq.NewTask("work", fmt.Appendf(nil, "long-%d", i)), asynq.MaxRetry(3))
		if i < short {
			e.enqueue(t, asynq.NewTask("work", fmt.Appendf(nil, "short-%d", i)), asynq.MaxRetry(3))
		}
	}
	e.serve(t, scfg, h)
	rec.waitRuns(t, long+short, 30*time.Second)
	e.settled(t, "default", 5*time.Second)
	defs.mu.Lock()
	defer defs.mu.Unlock()
	early := 0
	for p, at := range defs.returnAt {
		if runs := rec.runsOf(p); len(runs) == 1 && runs[0].at.Before(at.Add(-time.Second)) {
			early++
		}
	}
	if early == 0 {
		t.Fatalf("no deferred task ran a second before it was told to come back (%d deferred): none was brought back", len(defs.returnAt))
	}
	for i := range long {
		if n := len(rec.runsOf(fmt.Sprintf("long-%d", i))); n != 1 {
			t.Errorf("long-%d ran %d times", i, n)
		}
	}
	t.Logf("%d of %d deferred tasks brought back sooner", early, len(defs.returnAt))
}

func TestWithHandlersValidates(t *testing.T) {
	h := NewHandler(newRecorder(nil), newGate(t, newScripted(nil)), WithHandlers(0))
	err := h.ProcessTask(context.Background(), asynq.NewTask("work", []byte("x")))
	if !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("ProcessTask with WithHandlers(0) = %v, want ErrInvalidOption", err)
	}
}

// TestRecallKeepsBringingBack: one handler; the first task takes 800 ms,
// so the 19 behind it, of the same tenant, are deferred a slot of 800 ms
// apart; the rest take 2 ms each. Once the slow one is done, the deferred
// tasks are brought back one after another (WithInspector) as the handler
// goes idle, even when each ends within recallEvery of the recall that
// brought it back, instead of waiting for their slots. With a second
// server on the queue that runs what it takes for 3 s (its tasks are
// active while listed as deferred here), the others are brought back all
// the same.
func TestRecallKeepsBringingBack(t *testing.T) {
	for _, other := range []bool{false, true} {
		t.Run(fmt.Sprintf("other server=%v", other), func(t *testing.T) { recallKeepsBringingBack(t, other) })
	}
}

func recallKeepsBringingBack(t *testing.T, other bool) {
	const n, slow = 20, 800 * time.Millisecond
	e := newEnv(t)
	rec := newRecorder(func(p string, _ int) error {
		if p == "a-0" {
			time.Sleep(slow)
		} else {
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	})
	defs := newDeferrals()
	scfg := asynq.Config{Concurrency: 30, ErrorHandler: defs, TaskCheckInterval: taskCheck}
	h := NewHandler(rec, roomyGate(t), WithKeyFunc(tenantKey), WithServerConfig(scfg), WithHandlers(1), WithInspector(e.insp))
	e.enqueue(t, asynq.NewTask("work", []byte("a-0")), asynq.MaxRetry(3))
	start := time.Now()
	e.serve(t, scfg, h)
	rec.waitRuns(t, 1, 5*time.Second)
	for i := 1; i < n; i++ {
		e.enqueue(t, asynq.NewTask("work", fmt.Appendf(nil, "a-%d", i)), asynq.MaxRetry(3))
	}
	var elsewhere atomic.Int64
	if other {
		time.Sleep(slow + 100*time.Millisecond)
		e.serve(t, asynq.Config{Concurrency: 2}, asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			elsewhere.Add(1)
			time.Sleep(3 * time.Second)
			return nil
		}))
	}
	deadline := time.Now().Add(30 * time.Second)
	for int64(rec.total())+elsewhere.Load() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	e.settled(t, "default", 10*time.Second)
	defs.mu.Lock()
	defer defs.mu.Unlock()
	var latest time.Time
	for _, at := range defs.returnAt {
		if at.After(latest) {
			latest = at
		}
	}
	if len(defs.returnAt) < n/2 {
		t.Fatalf("%d tasks deferred, want most of the %d behind the slow one", len(defs.returnAt), n-1)
	}
	if slots := latest.Sub(start); took > slots/2 {
		t.Errorf("all %d started %v after the start, want well before the last deferred slot (%v): the idle handler was not given the deferred tasks", n, took, slots)
	}
	if len(defs.others) > 0 {
		t.Errorf("other errors: %v", defs.others)
	}
	if runs := int64(rec.total()) + elsewhere.Load(); runs != n {
		t.Errorf("%d runs here and on the other server, want each of the %d tasks once", runs, n)
	}
	t.Logf("all %d started in %v (%d on the other server); %d deferred, the last told to come back %v after the start", n, took, elsewhere.Load(), len(defs.returnAt), latest.Sub(start))
}

// TestPanicGivesHandlerBack: the wrapped handler panics on a task's first
// run, with one handler in the fair shares; asynq recovers the panic and
// retries the task, and the handler is free again: the other tenant's
// tasks and the retry all run.
func TestPanicGivesHandlerBack(t *testing.T) {
	e := newEnv(t)
	rec := newRecorder(func(p string, run int) error {
		if p == "x-0" && run == 1 {
			panic("boom")
		}
		return nil
	})
	scfg := asynq.Config{Concurrency: 8}
	h := NewHandler(rec, roomyGate(t), WithKeyFunc(tenantKey), WithServerConfig(scfg), WithHandlers(1))
	e.enqueue(t, asynq.NewTask("work", []byte("x-0")), asynq.MaxRetry(3))
	for i := 1; i <= 3; i++ {
		e.enqueue(t, asynq.NewTask("work", fmt.Appendf(nil, "y-%d", i)), asynq.MaxRetry(3))
	}
	e.serve(t, scfg, h)
	rec.waitRuns(t, 5, 10*time.Second)
	if n := len(rec.runsOf("x-0")); n != 2 {
		t.Errorf("x-0 ran %d times, want 2 (a panic, then its retry)", n)
	}
}
