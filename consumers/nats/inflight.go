package natsthrottle

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/internal/inflight"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// acquire takes the in-flight slot of r when the Handler has an in-flight
// limiter (WithInFlight), before the Gate decides. It reports ok with the
// slot to run the wrapped handler with (nil without a limiter, or when the
// limiter failed under FailOpen), or !ok with the retry-after: refused,
// the earliest lease end of the key; or the Gate's degraded retry-after
// when the limiter failed under FailClosed. Limiter errors go to the
// error handler.
func (h *Handler) acquire(ctx context.Context, span trace.Span, r *request) (s *inflight.Slot, retry time.Duration, refused, ok bool) {
	if h.cfg.inFlight == nil {
		return nil, 0, false, true
	}
	id := r.id
	if id == "" {
		id = inflight.RandomID("natsthrottle:")
	}
	msg := r.msg
	s, d, err := inflight.Acquire(ctx, h.cfg.inFlight, r.key, id, h.cfg.lease, h.decision, func(err error) {
		h.fail(ctx, span, msg, fmt.Errorf("natsthrottle: %w", err))
	})
	switch {
	case err != nil:
		h.fail(ctx, span, msg, fmt.Errorf("natsthrottle: %w", err))
		span.SetAttributes(InFlightAttr.String(InFlightError))
		if h.gate.Policy() == throttle.FailOpen {
			return nil, 0, false, true
		}
		return nil, h.gate.DegradedRetryAfter(), false, false
	case s == nil:
		span.SetAttributes(InFlightAttr.String(InFlightRejected))
		return nil, max(d.RetryAfter, time.Millisecond), true, false
	}
	span.SetAttributes(InFlightAttr.String(InFlightAcquired))
	return s, 0, false, true
}

// run runs the wrapped handler on r's message, holding s (may be nil)
// until the handler returns or acknowledges the message, and renewing it
// meanwhile. A Backoff the handler called is carried out once it returns.
func (h *Handler) run(ctx context.Context, span trace.Span, r *request, s *inflight.Slot) {
	span.SetAttributes(DispositionAttr.String(DispositionHandled))
	if s != nil {
		s.KeepAlive()
		defer s.Release()
	}
	m := &tracedMsg{Msg: r.msg, ctx: ctx, slot: s, h: h, r: r}
	h.next(m)
	if d := m.back.returned(); d > 0 {
		h.putBack(m, d)
	}
}

// decisions is the longest the decisions on one message may take: the
// decision timeout, twice with an in-flight limiter (Gate, then slot).
func (h *Handler) decisions() time.Duration {
	if h.cfg.inFlight != nil {
		return 2 * h.decision
	}
	return h.decision
}

// The acknowledgements of a tracedMsg release its slot once they succeed;
// InProgress renews it.

func (m *tracedMsg) Ack() error { return m.done(m.Msg.Ack()) }

func (m *tracedMsg) DoubleAck(ctx context.Context) error { return m.done(m.Msg.DoubleAck(ctx)) }

func (m *tracedMsg) Nak() error { return m.done(m.Msg.Nak()) }

func (m *tracedMsg) NakWithDelay(d time.Duration) error { return m.done(m.Msg.NakWithDelay(d)) }

func (m *tracedMsg) Term() error { return m.done(m.Msg.Term()) }

func (m *tracedMsg) TermWithReason(reason string) error {
	return m.done(m.Msg.TermWithReason(reason))
}

func (m *tracedMsg) InProgress() error {
	err := m.Msg.InProgress()
	if err == nil {
		m.slot.Renew()
	}
	return err
}

// done releases the slot after a successful acknowledgement, and returns
// its error.
func (m *tracedMsg) done(err error) error {
	if err == nil {
		m.slot.Release()
	}
	return err
}

var _ jetstream.Msg = (*tracedMsg)(nil)
