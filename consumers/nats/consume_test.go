package natsthrottle

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestConsumeBuffersWhatRuns: Handler.Consume pulls no more than the
// handlers' count at once (nats.go's Consume buffers 500): with 2 handlers of 100 ms first come, first served (Handle waits
// while both run) and 20 messages, at most 2 run and 2 wait in the buffer
// (ack pending <= 8 with acks on their way, where a buffer of 500 takes
// all 20), and each is
// handled once. (With fair shares the messages wait in the scheduler,
// with InProgress heartbeats, instead.)
func TestConsumeBuffersWhatRuns(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{AckWait: 5 * time.Second, MaxAckPending: -1})
	const total, n = 20, 2
	s := newStarts(100 * time.Millisecond)
	h := newHandler(t, s.handle, newGate(t, throttle.PerSecond(10_000), nil), WithConcurrency(n), WithFair(false), WithConsumer(c))
	for i := range total {
		e.publish(t, "jobs.a", fmt.Sprint(i), nil)
	}
	cc, err := h.Consume(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	most := 0
	for deadline := time.Now().Add(10 * time.Second); s.handled() < total; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d handled in 10 s", s.handled(), total)
		}
		most = max(most, ackPending(t, c))
	}
	// The server counts an ack once it arrives: a few acked messages may
	// still count beside those running and buffered (a buffer of 500
	// shows 18 to 20).
	if limit := 2*n + 4; most > limit {
		t.Errorf("%d messages delivered and not acked at once, want at most %d (%d running, %d buffered, a few acks on their way)", most, limit, n, n)
	}
	for seq, runs := range s.runs {
		if runs != 1 {
			t.Errorf("stream seq %d handled %d times", seq, runs)
		}
	}
	if _, err := h.Consume(nil); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Errorf("Consume(nil): %v, want ErrInvalidOption", err)
	}
}

// TestConsumeStopDrain: Drain hands over what was pulled and ends within
// the pull request's second; after Stop nothing more is handled.
func TestConsumeStopDrain(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{AckWait: 5 * time.Second})
	rec := newRecorder()
	h := newHandler(t, rec.handle, newGate(t, throttle.PerSecond(10_000), nil), WithConcurrency(2), WithConsumer(c))
	for i := range 5 {
		e.publish(t, "jobs.a", fmt.Sprint(i), nil)
	}
	cc, err := h.Consume(c)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "5 handled messages", func() bool { return rec.len() >= 5 })
	start := time.Now()
	cc.Drain()
	select {
	case <-cc.Closed():
	case <-time.After(3 * time.Second):
		t.Fatal("Drain did not end within 3 s")
	}
	t.Logf("Drain took %v", time.Since(start))
	e.publish(t, "jobs.a", "late", nil)
	time.Sleep(300 * time.Millisecond)
	if n := rec.len(); n != 5 {
		t.Errorf("%d handled after Drain ended, want 5", n)
	}

	cc, err = h.Consume(c)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the late message", func() bool { return rec.len() >= 6 })
	cc.Stop()
	<-cc.Closed()
	e.publish(t, "jobs.a", "after stop", nil)
	time.Sleep(300 * time.Millisecond)
	if n := rec.len(); n != 6 {
		t.Errorf("%d handled after Stop, want 6", n)
	}
}
