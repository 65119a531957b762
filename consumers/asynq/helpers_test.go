package asynqthrottle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/goleak"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Fast asynq polling, so that tests measure the middleware and not asynq's
// defaults (5 s delayed-task checks, 1 s empty-queue sleeps).
const (
	delayedCheck = 100 * time.Millisecond
	taskCheck    = 20 * time.Millisecond
)

// env is a private redis-server with an asynq client and inspector on it.
type env struct {
	addr   asynq.RedisClientOpt
	client *asynq.Client
	insp   *asynq.Inspector
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := redistest.Start(t)
	e := &env{addr: asynq.RedisClientOpt{Addr: srv.Addr()}}
	e.client = asynq.NewClient(e.addr)
	e.insp = asynq.NewInspector(e.addr)
	t.Cleanup(func() {
		_ = e.insp.Close()
		_ = e.client.Close()
	})
	return e
}

// serve starts an asynq.Server running h with cfg, whose zero fields get
// the test defaults: one queue "default", Concurrency 4, fast polling,
// IsFailure and RetryDelayFunc of this package (retrying genuine failures
// at once), a silent logger. It is shut down at t's cleanup.
func (e *env) serve(t *testing.T, cfg asynq.Config, h asynq.Handler) {
	t.Helper()
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 4
	}
	if cfg.DelayedTaskCheckInterval == 0 {
		cfg.DelayedTaskCheckInterval = delayedCheck
	}
	if cfg.TaskCheckInterval == 0 {
		cfg.TaskCheckInterval = taskCheck
	}
	if cfg.IsFailure == nil {
		cfg.IsFailure = IsFailure
	}
	if cfg.RetryDelayFunc == nil {
		cfg.RetryDelayFunc = RetryDelayFunc(func(int, error, *asynq.Task) time.Duration { return 0 })
	}
	if cfg.Logger == nil {
		cfg.Logger = nopLogger{}
	}
	cfg.ShutdownTimeout = 2 * time.Second
	s := asynq.NewServer(e.addr, cfg)
	if err := s.Start(h); err != nil {
		t.Fatalf("asynq server start: %v", err)
	}
	t.Cleanup(s.Shutdown)
}

// enqueue enqueues a task or fails t.
func (e *env) enqueue(t *testing.T, task *asynq.Task, opts ...asynq.Option) *asynq.TaskInfo {
	t.Helper()
	info, err := e.client.Enqueue(task, opts...)
	if err != nil {
		t.Fatalf("enqueue %s: %v", task.Type(), err)
	}
	return info
}

// queueInfo returns the inspector's view of queue q.
func (e *env) queueInfo(t *testing.T, q string) *asynq.QueueInfo {
	t.Helper()
	qi, err := e.insp.GetQueueInfo(q)
	if err != nil {
		t.Fatalf("queue info %s: %v", q, err)
	}
	return qi
}

// settled waits until queue q has no pending, active, scheduled or retry
// task and returns its info.
func (e *env) settled(t *testing.T, q string, within time.Duration) *asynq.QueueInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		qi := e.queueInfo(t, q)
		if qi.Pending+qi.Active+qi.Scheduled+qi.Retry == 0 {
			return qi
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s not settled within %v: pending %d active %d scheduled %d retry %d archived %d",
				q, within, qi.Pending, qi.Active, qi.Scheduled, qi.Retry, qi.Archived)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type nopLogger struct{}

func (nopLogger) Debug(...any) {}
func (nopLogger) Info(...any)  {}
func (nopLogger) Warn(...any)  {}
func (nopLogger) Error(...any) {}
func (nopLogger) Fatal(...any) {}

// scripted is a Limiter that plays a plan per key: the i-th decision for a
// key rejects with plan[key][i] as RetryAfter, or admits when that is 0 or
// the plan is used up. It records every decision.
type scripted struct {
	mu    sync.Mutex
	plan  map[string][]time.Duration
	calls map[string][]call
}

type call struct {
	at         time.Time
	retryAfter time.Duration // 0: admitted
}

func newScripted(plan map[string][]time.Duration) *scripted {
	return &scripted{plan: plan, calls: make(map[string][]call)}
}

func (s *scripted) AllowN(_ context.Context, key string, _ int) (throttle.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := len(s.calls[key])
	var ra time.Duration
	if p := s.plan[key]; i < len(p) {
		ra = p[i]
	}
	s.calls[key] = append(s.calls[key], call{at: time.Now(), retryAfter: ra})
	if ra == 0 {
		return throttle.Decision{Allowed: true, Limit: 1, Source: throttle.SourceLocal}, nil
	}
	return throttle.Decision{Limit: 1, RetryAfter: ra, ResetAfter: ra, Source: throttle.SourceLocal}, nil
}

func (s *scripted) callsOf(key string) []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]call(nil), s.calls[key]...)
}

func newGate(t *testing.T, l throttle.Limiter, opts ...throttle.Option) *throttle.Gate {
	t.Helper()
	g, err := throttle.NewGate(l, opts...)
	if err != nil {
		t.Fatalf("NewGate: %v", err)
	}
	return g
}

// roomyGate returns a gate whose limit (10,000 a second, in memory) no
// test reaches: the handlers, not the rate, are what its tasks wait for.
func roomyGate(t *testing.T) *throttle.Gate {
	t.Helper()
	l, err := window.NewMemory(throttle.PerSecond(10_000))
	if err != nil {
		t.Fatal(err)
	}
	return newGate(t, l)
}

// payloadKey keys tasks by payload, so each test task has its own plan.
func payloadKey(_ context.Context, t *asynq.Task) (string, error) { return string(t.Payload()), nil }

// run is one call of the wrapped handler.
type run struct {
	at       time.Time
	id       string
	queue    string
	retried  int
	maxRetry int
	deadline time.Time
	typ      string
	headers  map[string]string
}

// recorder is a wrapped handler that records its runs by payload and
// returns what result says for the payload and its run number (nil when
// result is nil).
type recorder struct {
	mu     sync.Mutex
	runs   map[string][]run
	result func(payload string, n int) error
}

func newRecorder(result func(payload string, n int) error) *recorder {
	return &recorder{runs: make(map[string][]run), result: result}
}

func (r *recorder) ProcessTask(ctx context.Context, t *asynq.Task) error {
	now := time.Now()
	rn := run{at: now, typ: t.Type(), headers: t.Headers()}
	rn.id, _ = asynq.GetTaskID(ctx)
	rn.queue, _ = asynq.GetQueueName(ctx)
	rn.retried, _ = asynq.GetRetryCount(ctx)
	rn.maxRetry, _ = asynq.GetMaxRetry(ctx)
	rn.deadline, _ = ctx.Deadline()
	p := string(t.Payload())
	r.mu.Lock()
	r.runs[p] = append(r.runs[p], rn)
	n := len(r.runs[p])
	r.mu.Unlock()
	if r.result == nil {
		return nil
	}
	return r.result(p, n)
}

func (r *recorder) runsOf(p string) []run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]run(nil), r.runs[p]...)
}

func (r *recorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rs := range r.runs {
		n += len(rs)
	}
	return n
}

// waitRuns waits until the recorder has seen n runs in total.
func (r *recorder) waitRuns(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for r.total() < n {
		if time.Now().After(deadline) {
			t.Fatalf("got %d handler runs within %v, want %d", r.total(), within, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
