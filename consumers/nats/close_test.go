package natsthrottle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestCloseWaitsForHeld: Close waits until a held message is admitted and
// handled.
func TestCloseWaitsForHeld(t *testing.T) {
	e := newEnv(t)
	cfg := jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 500 * time.Millisecond}
	c := e.consumer(t, cfg)
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, newGate(t, throttle.Rate{Count: 1, Per: 600 * time.Millisecond}, nil),
		WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
	e.publish(t, "jobs.close", "1", nil)
	e.publish(t, "jobs.close", "2", nil)
	consume(t, c, h.Handle)
	waitFor(t, 5*time.Second, "a held message", func() bool { return h.Held() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Close(ctx); err != nil {
		t.Fatalf("Close = %v, want nil", err)
	}
	if n := rec.len(); n != 2 {
		t.Errorf("handled %d messages when Close returned, want 2", n)
	}
	if h.Held() != 0 {
		t.Errorf("Held() = %d after Close", h.Held())
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
	waitFor(t, 5*time.Second, "no ack pending", func() bool { return ackPending(t, c) == 0 })
}

// TestCloseGivesUp: when Close's context ends, held messages are left
// unacknowledged and reported with ErrClosed; after Close, a message
// rejected on its last delivery is not held.
func TestCloseGivesUp(t *testing.T) {
	e := newEnv(t)
	cfg := jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 2 * time.Second}
	c := e.consumer(t, cfg)
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, newGate(t, throttle.PerHour(1), nil),
		WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
	e.publish(t, "jobs.close", "1", nil)
	e.publish(t, "jobs.close", "2", nil)
	consume(t, c, h.Handle)
	waitFor(t, 5*time.Second, "a held message", func() bool { return h.Held() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := h.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v after its context ended", d)
	}
	if h.Held() != 0 {
		t.Errorf("Held() = %d after Close", h.Held())
	}
	if n := reported.matching(ErrClosed); n != 1 {
		t.Errorf("errors = %v, want one ErrClosed", reported.all())
	}
	if got := ackPending(t, c); got != 1 {
		t.Errorf("NumAckPending = %d, want 1 (left unacknowledged)", got)
	}

	// After Close: rejected on the last delivery, abandoned at once.
	e.publish(t, "jobs.close", "3", nil)
	waitFor(t, 5*time.Second, "a second ErrClosed", func() bool { return reported.matching(ErrClosed) == 2 })
	if h.Held() != 0 {
		t.Errorf("Held() = %d: a message was held after Close", h.Held())
	}
	if n := rec.len(); n != 1 {
		t.Errorf("handled %d messages, want 1", n)
	}
	if err := h.Close(context.Background()); err != nil {
		t.Errorf("second Close = %v", err)
	}
}
