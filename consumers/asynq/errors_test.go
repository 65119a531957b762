package asynqthrottle

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestRateLimitErrorMatches(t *testing.T) {
	d := throttle.Decision{Limit: 10, RetryAfter: 250 * time.Millisecond}
	var err error = fmt.Errorf("wrapped: %w", newRateLimitError("k", d, time.Now()))
	var rl *RateLimitError
	var le *throttle.LimitedError
	if !errors.Is(err, throttle.ErrLimited) || !errors.As(err, &rl) || !errors.As(err, &le) {
		t.Fatalf("%v: errors.Is ErrLimited / As *RateLimitError / As *throttle.LimitedError = %v %v %v",
			err, errors.Is(err, throttle.ErrLimited), errors.As(err, &rl), errors.As(err, &le))
	}
	if rl.RetryIn != d.RetryAfter || rl.Decision != d || rl.Key != "k" || le.RetryAfter() != d.RetryAfter {
		t.Errorf("got %+v", rl)
	}
	cause := errors.New("redis down")
	rl.Err = cause
	if !errors.Is(err, cause) || !errors.Is(err, throttle.ErrLimited) {
		t.Errorf("with Err set, %v does not match both the cause and ErrLimited", err)
	}
}

func TestIsFailure(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"rate limit", newRateLimitError("k", throttle.Decision{RetryAfter: time.Second}, time.Now()), false},
		{"wrapped rate limit", fmt.Errorf("x: %w", &RateLimitError{RetryIn: time.Second}), false},
		{"throttle.LimitedError", &throttle.LimitedError{Key: "k"}, false},
		{"ErrLimited", throttle.ErrLimited, false},
		{"genuine", errors.New("boom"), true},
		{"skip retry", fmt.Errorf("x: %w", asynq.SkipRetry), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := IsFailure(c.err); got != c.want {
				t.Errorf("IsFailure(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

// retryDelay never lets asynq's whole-second truncation bring a task back
// before its retry-after: asynq stores floor(now + d) and forwards the task
// once the current Unix second reaches it.
func TestRetryDelayNeverEarly(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := time.Millisecond
	for _, c := range []struct {
		name     string
		decided  time.Duration // after t0
		retryIn  time.Duration
		now      time.Duration // after t0, when asynq asks
		want     time.Duration
		ownError bool // a *RateLimitError without decision time
	}{
		{name: "early in second", decided: 100 * ms, retryIn: 300 * ms, now: 100 * ms, want: 900 * ms},
		{name: "late in second", decided: 900 * ms, retryIn: 300 * ms, now: 901 * ms, want: 1099 * ms},
		{name: "exact second", decided: 700 * ms, retryIn: 300 * ms, now: 700 * ms, want: 300 * ms},
		{name: "long", decided: 500 * ms, retryIn: 2700 * ms, now: 510 * ms, want: 3490 * ms},
		{name: "already passed", decided: 0, retryIn: 100 * ms, now: 3 * time.Second, want: 0},
		{name: "built elsewhere", retryIn: 300 * ms, now: 900 * ms, want: 1300 * ms, ownError: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var err error
			if c.ownError {
				err = &RateLimitError{RetryIn: c.retryIn}
			} else {
				err = newRateLimitError("k", throttle.Decision{RetryAfter: c.retryIn}, t0.Add(c.decided))
			}
			now := t0.Add(c.now)
			got, ok := retryDelay(now, err)
			if !ok || got != c.want {
				t.Fatalf("retryDelay = %v, %v; want %v, true", got, ok, c.want)
			}
			// What asynq does with it: score floor(now+d), forwarded when
			// the Unix second reaches it. Later calls of time.Now in asynq
			// only move the score later.
			back := time.Unix(now.Add(got).Unix(), 0)
			if due := t0.Add(c.decided + c.retryIn); back.Before(due) {
				t.Errorf("task would be forwarded at %v, %v before its retry-after", back.Sub(t0), due.Sub(back))
			}
		})
	}
}

func TestRetryDelayFuncFallback(t *testing.T) {
	task := asynq.NewTask("x", nil)
	var gotN int
	f := RetryDelayFunc(func(n int, _ error, _ *asynq.Task) time.Duration { gotN = n; return 42 * time.Second })
	if d := f(3, errors.New("boom"), task); d != 42*time.Second || gotN != 3 {
		t.Errorf("genuine error: delay %v (n %d), want the fallback's 42s (n 3)", d, gotN)
	}
	if d := f(3, &throttle.LimitedError{Decision: throttle.Decision{RetryAfter: time.Second}}, task); d != 2*time.Second {
		t.Errorf("throttle.LimitedError: delay %v, want 2s", d)
	}
	if d := f(3, throttle.ErrLimited, task); d != 42*time.Second {
		t.Errorf("bare ErrLimited: delay %v, want the fallback's 42s", d)
	}
	def := RetryDelayFunc(nil)
	if d := def(0, errors.New("boom"), task); d < 15*time.Second || d > 45*time.Second {
		t.Errorf("nil fallback: delay %v, want asynq.DefaultRetryDelayFunc's 15s..45s for n=0", d)
	}
}

func TestCeilSecond(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, c := range []struct{ in, want time.Duration }{
		{0, 0}, {1, time.Second}, {999 * time.Millisecond, time.Second}, {time.Second, time.Second}, {1500 * time.Millisecond, 2 * time.Second},
	} {
		if got := ceilSecond(t0.Add(c.in)); !got.Equal(t0.Add(c.want)) {
			t.Errorf("ceilSecond(t0+%v) = t0+%v, want t0+%v", c.in, got.Sub(t0), c.want)
		}
	}
}

func TestDeadlineOptions(t *testing.T) {
	start := time.Now()
	for _, c := range []struct {
		name     string
		deadline time.Time
		want     string
	}{
		{"timeout", start.Add(-time.Millisecond).Add(37 * time.Second).Truncate(time.Millisecond).Add(123 * time.Nanosecond), "Timeout(37s)"},
		{"deadline", time.Unix(start.Unix()+60, 0), fmt.Sprintf("Deadline(%v)", time.Unix(start.Unix()+60, 0).Format(time.UnixDate))},
		{"none", time.Time{}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			if !c.deadline.IsZero() {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, c.deadline)
				defer cancel()
			}
			got := ""
			for _, o := range deadlineOptions(ctx, start) {
				got += o.String()
			}
			if got != c.want {
				t.Errorf("deadlineOptions = %q, want %q", got, c.want)
			}
		})
	}
}

func TestCopyTaskID(t *testing.T) {
	a, b := CopyTaskID("task-1"), CopyTaskID("task-1")
	if a != b || a == "task-1" || a == CopyTaskID("task-2") || CopyTaskID(a) == a {
		t.Errorf("CopyTaskID not deterministic and distinct: %q %q %q", a, b, CopyTaskID("task-2"))
	}
}

func TestMisconfiguredHandler(t *testing.T) {
	lim := newScripted(nil)
	g := newGate(t, lim)
	next := asynq.HandlerFunc(func(context.Context, *asynq.Task) error { t.Error("handler ran"); return nil })
	for name, h := range map[string]asynq.Handler{
		"nil gate":    NewHandler(next, nil),
		"nil handler": NewHandler(nil, g),
		"middleware":  Middleware(nil)(next),
	} {
		err := h.ProcessTask(context.Background(), asynq.NewTask("x", nil))
		if !errors.Is(err, throttle.ErrInvalidOption) || !IsFailure(err) {
			t.Errorf("%s: %v, want an error wrapping throttle.ErrInvalidOption", name, err)
		}
	}
	if calls := lim.callsOf("x"); len(calls) != 0 {
		t.Errorf("%d decisions, want 0", len(calls))
	}
}

// Outside an asynq.Server (no task ID, retry counts or deadline in ctx) the
// handler admits or returns the rejection.
func TestHandlerWithoutServer(t *testing.T) {
	lim := newScripted(map[string][]time.Duration{"x": {time.Second}})
	ran := 0
	h := NewHandler(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran++; return nil }), newGate(t, lim))
	task := asynq.NewTask("x", nil)
	err := h.ProcessTask(context.Background(), task)
	var rl *RateLimitError
	if !errors.As(err, &rl) || rl.RetryIn != time.Second || ran != 0 {
		t.Fatalf("first call: %v (ran %d), want a *RateLimitError with RetryIn 1s", err, ran)
	}
	if err := h.ProcessTask(context.Background(), task); err != nil || ran != 1 {
		t.Fatalf("second call: %v (ran %d), want nil and one run", err, ran)
	}
}

func TestHeaderCarrier(t *testing.T) {
	c := headerCarrier{"Traceparent": "a", "TRACEPARENT": "b", "x": "y"}
	if got := c.Get("traceparent"); got != "b" {
		t.Errorf("Get case-insensitive = %q, want the smallest matching key's value %q", got, "b")
	}
	if got := c.Get("Traceparent"); got != "a" {
		t.Errorf("Get exact = %q, want %q", got, "a")
	}
	c.Set("x", "z")
	if c["x"] != "y" || headerCarrier(nil).Get("x") != "" || len(headerCarrier(nil).Keys()) != 0 {
		t.Error("headerCarrier must be read-only and nil-safe")
	}
}

func TestInjectTraceContextWithoutSpan(t *testing.T) {
	got := InjectTraceContext(context.Background(), nil)
	if got == nil || len(got) != 0 {
		t.Errorf("InjectTraceContext(no span, nil) = %v, want an empty map", got)
	}
}
