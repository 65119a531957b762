package natsthrottle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// ErrNotGated is wrapped by the error of Backoff for a message that did not
// come from a Handler: there is no Gate, so no key to pause.
var ErrNotGated = errors.New("natsthrottle: the message was not passed by a natsthrottle Handler")

// Backoff is what the wrapped handler calls, and then returns, when the
// work of msg was refused downstream for d (a partner's 429 with
// Retry-After: d): it pauses the message's key for d in the Gate's
// limiter (Gate.Pause), so that every worker sharing the limiter's store
// stops taking the key's messages, and puts msg back to run again once d
// has passed. The handler must not acknowledge msg itself after calling
// it. msg is the message the Handler passed to the wrapped handler.
//
// Putting back uses as few of the message's deliveries (MaxDeliver) as it
// can. Once the handler has returned:
//
//   - d within WithMaxWait (default 1 s) and within half the ack wait of
//     this delivery: the message waits in process (InProgress is not
//     needed that soon) and is decided again after d, using no delivery;
//   - otherwise, before its last delivery: NakWithDelay(d plus the
//     Handler's jitter), which uses one delivery, as a rejection's NAK
//     does; the pause makes every worker reject it until d has passed, and
//     it comes back after d;
//   - on its last delivery (NumDelivered >= MaxDeliver, with
//     WithConsumerConfig or WithConsumer): held on a goroutine of its own
//     with InProgress heartbeats, using no delivery, and decided again
//     after d, as a rejection on its last delivery is; so Backoff alone
//     never makes the server drop the message. Close gives up held
//     messages as it does rejected ones (left unacknowledged, reported
//     with ErrClosed).
//
// The refused call's admission is given back (throttle.Gate.Release): the
// partner did not count it, so the message is charged again when it comes
// back, as the call it then makes; the wrapped handler runs again (once).
//
// Errors (msg is still put back, except for a bad d): one wrapping
// throttle.ErrInvalidOption, naming "d", for d <= 0, and nothing is done;
// one wrapping ErrNotGated when msg did not come from a Handler (msg is
// NAKed with delay d, and no key is paused); one wrapping
// throttle.ErrCannotPause when the Gate's limiter cannot pause; a store
// or context error when the pause could not be recorded (bounded by the
// decision timeout). Errors of the pause and of the NAK also go to the
// error handler, the logger and the message's span.
func Backoff(msg jetstream.Msg, d time.Duration) error {
	if d <= 0 {
		return &throttle.OptionError{Field: "d", Reason: fmt.Sprintf("the backoff must be > 0, got %v", d)}
	}
	m, ok := msg.(*tracedMsg)
	if !ok || m.h == nil || m.r == nil {
		if msg == nil {
			return fmt.Errorf("%w: nil message", ErrNotGated)
		}
		if err := msg.NakWithDelay(d); err != nil {
			return fmt.Errorf("%w; nak with delay %v: %w", ErrNotGated, d, err)
		}
		return ErrNotGated
	}
	return m.h.backoff(m, d)
}

// backoff pauses m's key for d and puts m back, at once or, while the
// wrapped handler runs, when it returns (see Backoff).
func (h *Handler) backoff(m *tracedMsg, d time.Duration) error {
	span := trace.SpanFromContext(m.ctx)
	span.SetAttributes(BackoffMsAttr.Int64(d.Milliseconds()))
	ctx, cancel := context.WithTimeout(m.ctx, h.decision)
	err := h.gate.Pause(ctx, m.r.key, d)
	if err != nil {
		err = fmt.Errorf("natsthrottle: backoff: pause of key %q: %w", m.r.key, err)
		h.fail(m.ctx, span, m.r.msg, err)
	}
	if rerr := h.gate.Release(ctx, m.r.key, m.r.cost, m.r.id); rerr != nil {
		h.fail(m.ctx, span, m.r.msg, fmt.Errorf("natsthrottle: backoff: give back the refused call of key %q: %w", m.r.key, rerr))
	}
	cancel()
	if m.back.request(d) {
		h.putBack(m, d)
	}
	return err
}

// putBack brings m's message back after d, using as few deliveries as it
// can (see Backoff).
func (h *Handler) putBack(m *tracedMsg, d time.Duration) {
	r := m.r
	span := trace.SpanFromContext(m.ctx)
	switch {
	case !r.keyed && d <= h.cfg.maxWait && h.startWait(r, d):
		ctx, wspan := h.startSpan(r.msg)
		wspan.SetAttributes(BackoffMsAttr.Int64(d.Milliseconds()))
		go h.wait(ctx, wspan, r, d)
	case !h.lastDelivery(r.msg):
		h.nak(m.ctx, span, r, DispositionNak, d, true)
	default:
		ctx, hspan := h.startSpan(r.msg)
		hspan.SetAttributes(BackoffMsAttr.Int64(d.Milliseconds()))
		h.startHold(ctx, hspan, r, throttle.Decision{RetryAfter: d})
	}
}

// backoff is the Backoff state of one run of the wrapped handler: a
// Backoff called while it runs is carried out when it returns (so the
// message never runs twice at once); one called after, at once.
type backoff struct {
	mu    sync.Mutex
	done  bool          // the wrapped handler returned
	delay time.Duration // > 0: a Backoff to carry out when it returns
}

// request records a Backoff of d and reports whether to carry it out now
// (the handler has returned).
func (b *backoff) request(d time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return true
	}
	b.delay = max(b.delay, d)
	return false
}

// returned marks the handler returned and returns the Backoff to carry
// out, or 0.
func (b *backoff) returned() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = true
	return b.delay
}
