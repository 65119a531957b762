package natsthrottle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// backoffRun is one run of the wrapped handler in a Backoff test.
type backoffRun struct {
	at        time.Time
	delivered uint64
	paused    throttle.Decision // Peek of the key right after Backoff
	err       error             // Backoff's
}

// refundCounter counts the Refunds of a window.
type refundCounter struct {
	*window.Memory
	refunds atomic.Int64
}

func (r *refundCounter) Refund(ctx context.Context, key string, n int, id string) (bool, error) {
	r.refunds.Add(1)
	return r.Memory.Refund(ctx, key, n, id)
}

// TestBackoff: a handler that calls Backoff on its first run pauses the
// message's key, and the message comes back after at least d and is
// handled once more, charged once, by that second run (the refused call's
// charge is given back); in process, by a NAK, or held on its last
// delivery, as Backoff says.
func TestBackoff(t *testing.T) {
	tests := []struct {
		name       string
		maxDeliver int
		d          time.Duration
		delivered  uint64 // NumDelivered of the second run
	}{
		{"in process", 5, 300 * time.Millisecond, 1},
		{"nak", 5, 1500 * time.Millisecond, 2},
		{"held on the last delivery", 1, 1500 * time.Millisecond, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			maxDeliveries := e.watch(t, maxDeliveriesAdvisory)
			cfg := jetstream.ConsumerConfig{MaxDeliver: tt.maxDeliver, AckWait: 5 * time.Second}
			c := e.consumer(t, cfg)
			lim, err := window.NewMemory(throttle.Rate{Count: 100, Per: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			counted := &refundCounter{Memory: lim}
			g, err := throttle.NewGate(counted)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var runs []backoffRun
			handle := func(msg jetstream.Msg) {
				md, _ := msg.Metadata()
				run := backoffRun{at: time.Now(), delivered: md.NumDelivered}
				mu.Lock()
				first := len(runs) == 0
				mu.Unlock()
				if first {
					run.err = Backoff(msg, tt.d)
					run.paused, _ = lim.Peek(context.Background(), msg.Subject(), 1)
				} else {
					_ = msg.Ack()
				}
				mu.Lock()
				runs = append(runs, run)
				mu.Unlock()
			}
			var reported errs
			h := newHandler(t, handle, g, WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
			e.publish(t, "jobs.partner", "x", nil)
			consume(t, c, h.Handle)
			waitFor(t, 15*time.Second, "the second run", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(runs) >= 2
			})
			time.Sleep(300 * time.Millisecond) // a third run would come now
			mu.Lock()
			got := append([]backoffRun(nil), runs...)
			mu.Unlock()
			if len(got) != 2 {
				t.Fatalf("%d runs, want 2", len(got))
			}
			first, second := got[0], got[1]
			if first.err != nil {
				t.Fatalf("Backoff: %v", first.err)
			}
			if p := first.paused; p.Allowed || p.RetryAfter < tt.d-100*time.Millisecond {
				t.Errorf("key right after Backoff: %+v; want paused for about %v", p, tt.d)
			}
			if gap := second.at.Sub(first.at); gap < tt.d {
				t.Errorf("second run %v after the first, want >= %v", gap, tt.d)
			}
			if second.delivered != tt.delivered {
				t.Errorf("second run on delivery %d, want %d", second.delivered, tt.delivered)
			}
			// Charged once, by the second run: the refused call gave its
			// charge back (the newest unit is the second run's, so the
			// window resets a minute after it, not after the first).
			if p, _ := lim.Peek(context.Background(), "jobs.partner", 1); p.Remaining != 98 {
				t.Errorf("Peek after: Remaining %d, want 98 (one admission charged)", p.Remaining)
			}
			if n := counted.refunds.Load(); n != 1 {
				t.Errorf("%d refunds, want 1: the refused call's charge given back", n)
			}
			if a := maxDeliveries.all(); len(a) > 0 {
				t.Errorf("MAX_DELIVERIES advisory: %v", a[0])
			}
			if errs := reported.all(); len(errs) > 0 {
				t.Errorf("error handler got %v", errs[0])
			}
			if n := ackPending(t, c); n != 0 {
				t.Errorf("NumAckPending %d, want 0", n)
			}
		})
	}
}

// TestBackoffErrors: a bad d does nothing; a message that did not come
// from a Handler is NAKed, with ErrNotGated; a limiter that cannot pause
// is reported, and the message still comes back.
func TestBackoffErrors(t *testing.T) {
	var oe *throttle.OptionError
	if err := Backoff(nil, 0); !errors.As(err, &oe) || oe.Field != "d" {
		t.Fatalf("Backoff(nil, 0) = %v; want an OptionError naming d", err)
	}
	if err := Backoff(nil, time.Second); !errors.Is(err, ErrNotGated) {
		t.Fatalf("Backoff(nil, 1s) = %v; want ErrNotGated", err)
	}

	e := newEnv(t)
	cfg := jetstream.ConsumerConfig{AckWait: 5 * time.Second}
	c := e.consumer(t, cfg)
	g, err := throttle.NewGate(throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{Allowed: true}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var runs []error
	handle := func(msg jetstream.Msg) {
		mu.Lock()
		first := len(runs) == 0
		mu.Unlock()
		var err error
		if first {
			err = Backoff(msg, 200*time.Millisecond)
		} else {
			_ = msg.Ack()
		}
		mu.Lock()
		runs = append(runs, err)
		mu.Unlock()
	}
	var reported errs
	h := newHandler(t, handle, g, WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
	e.publish(t, "jobs.partner", "x", nil)
	consume(t, c, h.Handle)
	waitFor(t, 10*time.Second, "the second run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) >= 2
	})
	mu.Lock()
	first := runs[0]
	mu.Unlock()
	if !errors.Is(first, throttle.ErrCannotPause) {
		t.Errorf("Backoff over a limiter without Pause = %v; want ErrCannotPause", first)
	}
	if errs := reported.all(); len(errs) != 1 || !errors.Is(errs[0], throttle.ErrCannotPause) {
		t.Errorf("error handler got %v; want the ErrCannotPause once", errs)
	}
}

// TestBackoffPausesKeyForEveryone: two workers on one consumer, each with
// its own Gate over one Redis window. After one backs off a message, the
// key's next message waits out the pause whichever worker it reaches;
// another key's message does not wait.
func TestBackoffPausesKeyForEveryone(t *testing.T) {
	e := newEnv(t)
	cfg := jetstream.ConsumerConfig{AckWait: 5 * time.Second}
	c := e.consumer(t, cfg)
	client := redistest.Start(t).Client(t)
	prefix := redistest.Prefix("natsthrottle")
	const d = 1500 * time.Millisecond
	var mu sync.Mutex
	handled := map[string]time.Time{} // data -> when handled (acked)
	// backedOff is taken before the Backoff (no later than the pause
	// starts); paused once it has returned, the pause recorded: a message
	// decided before then is not paused.
	var backedOff time.Time
	paused := make(chan struct{})
	handle := func(msg jetstream.Msg) {
		mu.Lock()
		first := string(msg.Data()) == "a" && backedOff.IsZero()
		if first {
			backedOff = time.Now()
		}
		mu.Unlock()
		if first {
			if err := Backoff(msg, d); err != nil {
				t.Errorf("Backoff: %v", err)
			}
			close(paused)
			return
		}
		_ = msg.Ack()
		mu.Lock()
		handled[string(msg.Data())] = time.Now()
		mu.Unlock()
	}
	for range 2 {
		lim, err := window.NewRedis(client, throttle.Rate{Count: 100, Per: time.Minute},
			window.WithPrefix(prefix), window.WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		g, err := throttle.NewGate(lim)
		if err != nil {
			t.Fatal(err)
		}
		consume(t, c, newHandler(t, handle, g, WithConsumerConfig(cfg)).Handle)
	}
	e.publish(t, "jobs.partner", "a", nil)
	select {
	case <-paused:
	case <-time.After(10 * time.Second):
		t.Fatal("no Backoff within 10s")
	}
	// The key's next message, and another key's.
	e.publish(t, "jobs.partner", "b", nil)
	e.publish(t, "jobs.other", "c", nil)
	waitFor(t, 15*time.Second, "three messages handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 3
	})
	mu.Lock()
	defer mu.Unlock()
	for _, data := range []string{"a", "b"} {
		if gap := handled[data].Sub(backedOff); gap < d {
			t.Errorf("message %s of the paused key handled %v after the Backoff, want >= %v", data, gap, d)
		}
	}
	if gap := handled["c"].Sub(backedOff); gap >= d {
		t.Errorf("another key's message handled %v after the Backoff; it should not wait for the pause", gap)
	}
}
