package natsthrottle

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// hangingGate returns a Gate whose limiter hangs, until its context is
// done, on the calls for which hang returns true, and admits otherwise.
// A hanging call also ends when the test cleans up, so that without a
// decision timeout the test fails instead of leaking goroutines.
func hangingGate(t *testing.T, hang func(call int) bool) (*throttle.Gate, *atomic.Int32) {
	t.Helper()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var calls atomic.Int32
	lim := throttle.LimiterFunc(func(ctx context.Context, _ string, _ int) (throttle.Decision, error) {
		if hang(int(calls.Add(1))) {
			select {
			case <-ctx.Done():
				return throttle.Decision{}, ctx.Err()
			case <-release:
				return throttle.Decision{}, errors.New("released by the test cleanup")
			case <-time.After(3 * time.Second):
				return throttle.Decision{}, errors.New("hung for 3s")
			}
		}
		return throttle.Decision{Allowed: true, Limit: 1}, nil
	})
	g, err := throttle.NewGate(lim, throttle.WithDegradedRetryAfter(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return g, &calls
}

// TestDecisionTimeout: while the limiter hangs, every decision gives up
// after the decision timeout (by default a quarter of AckWait), the
// Consume callback returns long before AckWait, the message is NAKed with
// the Gate's degraded retry-after and the timeout reported; neither the
// message being decided nor the ones behind it are redelivered while
// waiting, and each is handled exactly once when the limiter is back.
func TestDecisionTimeout(t *testing.T) {
	e := newEnv(t)
	cfg := jetstream.ConsumerConfig{AckWait: time.Second}
	c := e.consumer(t, cfg)
	const total = 3
	rec := newRecorder()
	var reported errs
	// Hangs on the first decision of each message: 3 × 250 ms < AckWait.
	g, _ := hangingGate(t, func(call int) bool { return call <= total })
	h := newHandler(t, rec.handle, g, WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
	if h.decision != cfg.AckWait/4 {
		t.Fatalf("decision timeout %v, want AckWait/4", h.decision)
	}
	for i := range total {
		e.publish(t, "jobs.hang", strconv.Itoa(i), nil)
	}
	var mu sync.Mutex
	var took []time.Duration
	start := time.Now()
	consume(t, c, func(m jetstream.Msg) {
		begin := time.Now()
		h.Handle(m)
		mu.Lock()
		took = append(took, time.Since(begin))
		mu.Unlock()
	})
	waitFor(t, 10*time.Second, "3 handled messages", func() bool { return rec.len() >= total })
	elapsed := time.Since(start)
	time.Sleep(cfg.AckWait + 300*time.Millisecond) // room for a duplicate

	seen := map[uint64]int{}
	for _, r := range rec.records() {
		seen[r.seq]++
		if r.delivered != 2 {
			t.Errorf("seq %d handled on delivery %d, want 2 (NAKed once after the timeout)", r.seq, r.delivered)
		}
	}
	for seq := uint64(1); seq <= total; seq++ {
		if seen[seq] != 1 {
			t.Errorf("stream sequence %d handled %d times, want 1", seq, seen[seq])
		}
	}
	mu.Lock()
	for i, d := range took[:total] {
		if d < h.decision || d >= cfg.AckWait {
			t.Errorf("callback %d took %v, want about the decision timeout %v", i, d, h.decision)
		}
	}
	mu.Unlock()
	errs := reported.all()
	if len(errs) != total || reported.matching(context.DeadlineExceeded) != total {
		t.Errorf("errors = %v, want %d DeadlineExceeded", errs, total)
	}
	for _, err := range errs {
		if throttle.IsUsageError(err) {
			t.Errorf("timeout %v reported as a usage error", err)
		}
	}
	if got := ackPending(t, c); got != 0 {
		t.Errorf("NumAckPending = %d, want 0", got)
	}
	t.Logf("3 messages through a hanging limiter in %v, callbacks %v", elapsed, took)
}

// TestDecisionTimeoutLastDelivery: on the last delivery a decision that
// times out holds the message instead of NAKing it, and the hold loop's
// own decisions are bounded too: a limiter that hangs while the message is
// held delays it by the decision timeout, and heartbeats go on.
func TestDecisionTimeoutLastDelivery(t *testing.T) {
	var reported errs
	var handled atomic.Int32
	// Hangs on the decision in Handle and on the first one in the hold
	// loop; admits the third.
	g, calls := hangingGate(t, func(call int) bool { return call <= 2 })
	h := newHandler(t, func(jetstream.Msg) { handled.Add(1) }, g,
		WithConsumerConfig(jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 2 * time.Second}),
		WithDecisionTimeout(100*time.Millisecond), WithHeartbeatInterval(30*time.Millisecond),
		WithJitter(0, 0), WithErrorHandler(reported.handle))
	msg := &failingMsg{md: jetstream.MsgMetadata{NumDelivered: 1}}
	begin := time.Now()
	h.Handle(msg)
	if d := time.Since(begin); d >= time.Second {
		t.Errorf("Handle took %v with a decision timeout of 100ms", d)
	}
	if h.Held() != 1 {
		t.Fatalf("Held() = %d, want 1", h.Held())
	}
	waitFor(t, 5*time.Second, "the held message handled", func() bool { return handled.Load() == 1 })
	if n := calls.Load(); n != 3 {
		t.Errorf("%d decisions, want 3", n)
	}
	if n := reported.matching(context.DeadlineExceeded); n != 2 || len(reported.all()) != 2 {
		t.Errorf("errors = %v, want 2 DeadlineExceeded", reported.all())
	}
	if n := msg.count("nak"); n != 0 {
		t.Errorf("message on its last delivery NAKed %d times", n)
	}
	if n := msg.count("wip"); n < 4 {
		t.Errorf("%d InProgress, want heartbeats through the held decisions", n)
	}
}
