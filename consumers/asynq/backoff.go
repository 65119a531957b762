package asynqthrottle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// BackoffError is the error of Backoff: a handler returns it when the work
// of its task was refused downstream for Delay (a partner's 429 with
// Retry-After). It matches throttle.ErrLimited with errors.Is, so
// IsFailure reports false for it.
type BackoffError struct {
	// Delay is how long the partner asked to wait, > 0.
	Delay time.Duration
}

// Backoff returns the error a handler behind the middleware returns when
// the partner answered 429 (Retry-After: d): the middleware then pauses
// the task's key for d in the Gate's limiter (throttle.Gate.Pause), so
// that every worker sharing the limiter's store stops running the key's
// tasks, and puts the task back exactly as it puts back a rejected one:
// returned as a *RateLimitError with RetryIn d, which asynq retries after
// d without counting a failure or incrementing the retry count (with
// IsFailure and RetryDelayFunc in asynq.Config, as for rejections), and,
// on its last attempt, re-enqueued (WithClient) or waited for in the
// handler, so it is never archived because of it. The refused call's
// admission is given back (throttle.Gate.Release): the partner did not
// count it, so the task's next call is charged as the call it is.
//
// d <= 0 is a programming error: Backoff then returns an error wrapping
// throttle.ErrInvalidOption, naming "d", which asynq treats as a failure.
// Returned by a handler without the middleware, a *BackoffError pauses
// nothing; IsFailure and RetryDelayFunc still treat it as throttling
// (delay d + 1 s).
func Backoff(d time.Duration) error {
	if d <= 0 {
		return &throttle.OptionError{Field: "d", Reason: fmt.Sprintf("the backoff must be > 0, got %v", d)}
	}
	return &BackoffError{Delay: d}
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("asynqthrottle: backoff for %v", e.Delay)
}

// Is reports whether target is throttle.ErrLimited.
func (e *BackoffError) Is(target error) bool { return target == throttle.ErrLimited }

// backoffOf returns the *BackoffError in err, or nil.
func backoffOf(err error) *BackoffError {
	var be *BackoffError
	if errors.As(err, &be) && be.Delay > 0 {
		return be
	}
	return nil
}

// backoff pauses key for be.Delay, gives back what the refused call's
// admission took (id's), and returns the rejection that puts the task
// back: RetryAfter be.Delay. A failed pause or give-back is recorded on
// the span and passed to the error handler; the task goes back all the
// same.
func (h *handler) backoff(ctx context.Context, span trace.Span, t *asynq.Task, key string, cost int, id string, be *BackoffError) throttle.Decision {
	span.SetAttributes(BackoffMsAttr.Int64(be.Delay.Milliseconds()))
	for _, err := range []error{h.gate.Pause(ctx, key, be.Delay), h.gate.Release(ctx, key, cost, id)} {
		if err != nil {
			err = fmt.Errorf("asynqthrottle: backoff of key %q: %w", key, err)
			fail(span, err)
			if h.cfg.onError != nil {
				h.cfg.onError(ctx, t, err)
			}
		}
	}
	return throttle.Decision{RetryAfter: be.Delay, ResetAfter: be.Delay}
}
