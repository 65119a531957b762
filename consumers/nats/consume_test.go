package natsthrottle

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestConsumeBuffersWhatRuns: Handler.Consume keeps the client's buffer
// at the handlers' count, even when opts ask for nats.go's default of
// 500: with 2 handlers of 100 ms first come, first served (Handle waits
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
	cc, err := h.Consume(c, jetstream.PullMaxMessages(500))
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
