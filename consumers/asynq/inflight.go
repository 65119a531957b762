package asynqthrottle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/internal/inflight"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// acquire takes the in-flight slot of task t, admitted by the Gate, when
// the handler has an in-flight limiter (WithInFlight). It reports ok with
// the slot to run the wrapped handler with (nil without a limiter, or when
// the limiter failed under FailOpen), or !ok with the rejection to return:
// the limiter's, or the Gate's degraded retry-after when the limiter
// failed under FailClosed. Limiter errors go to the error handler and the
// span.
func (h *handler) acquire(ctx context.Context, span trace.Span, t *asynq.Task, key, id string) (*inflight.Slot, throttle.Decision, bool) {
	if h.cfg.inFlight == nil {
		return nil, throttle.Decision{}, true
	}
	if id == "" {
		id = inflight.RandomID("asynqthrottle:")
	}
	report := func(err error) {
		err = fmt.Errorf("asynqthrottle: %w", err)
		span.RecordError(err)
		if h.cfg.onError != nil {
			h.cfg.onError(ctx, t, err)
		}
	}
	// Every call is bounded by the lease: a slot whose renewal takes
	// longer is lost anyway.
	s, d, err := inflight.Acquire(ctx, h.cfg.inFlight, key, id, h.cfg.lease, h.cfg.lease, report)
	switch {
	case err != nil:
		report(err)
		fail(span, err)
		span.SetAttributes(InFlightAttr.String(InFlightError))
		if h.gate.Policy() == throttle.FailOpen {
			return nil, throttle.Decision{}, true
		}
		return nil, throttle.Decision{RetryAfter: h.gate.DegradedRetryAfter(), ResetAfter: h.gate.DegradedRetryAfter(), Source: throttle.SourceDegraded}, false
	case s == nil:
		span.SetAttributes(InFlightAttr.String(InFlightRejected))
		d.RetryAfter = max(d.RetryAfter, time.Millisecond)
		return nil, d, false
	}
	span.SetAttributes(InFlightAttr.String(InFlightAcquired))
	return s, d, true
}

// run runs the wrapped handler, holding s (may be nil) until it returns
// and renewing it meanwhile.
func (h *handler) run(ctx context.Context, span trace.Span, t *asynq.Task, s *inflight.Slot) error {
	span.SetAttributes(DispositionAttr.String(DispositionHandled))
	if s != nil {
		s.KeepAlive()
		defer s.Release()
	}
	err := h.next.ProcessTask(ctx, t)
	if err != nil && !errors.Is(err, throttle.ErrLimited) {
		fail(span, err)
	}
	return err
}
