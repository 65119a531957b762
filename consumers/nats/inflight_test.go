package natsthrottle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/concurrency"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// Both limiters of package concurrency are in-flight limiters.
var (
	_ throttle.InFlightLimiter = (*concurrency.Redis)(nil)
	_ throttle.InFlightLimiter = (*concurrency.Memory)(nil)
)

// inFlightLimiters returns an in-memory and a Redis (on a server of the
// test's own) in-flight limit of limit slots per key.
func inFlightLimiters(t *testing.T, limit int) []struct {
	name string
	l    throttle.InFlightLimiter
} {
	t.Helper()
	mem, err := concurrency.NewMemory(limit)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := concurrency.NewRedis(redistest.Start(t).Client(t), limit,
		concurrency.WithPrefix(redistest.Prefix("natsthrottle")), concurrency.WithTimeout(redistest.CallTimeout))
	if err != nil {
		t.Fatal(err)
	}
	return []struct {
		name string
		l    throttle.InFlightLimiter
	}{{"memory", mem}, {"redis", rl}}
}

// running counts the wrapped handlers running at once.
type running struct {
	now, most atomic.Int64
	mu        sync.Mutex
	handled   map[uint64]int // stream sequence -> handler runs
}

func newRunning() *running { return &running{handled: map[uint64]int{}} }

// handler returns a wrapped handler that runs for work, then acks.
func (r *running) handler(work time.Duration) jetstream.MessageHandler {
	return func(m jetstream.Msg) {
		n := r.now.Add(1)
		for most := r.most.Load(); n > most && !r.most.CompareAndSwap(most, n); most = r.most.Load() {
		}
		time.Sleep(work)
		r.now.Add(-1)
		md, _ := m.Metadata()
		r.mu.Lock()
		r.handled[md.Sequence.Stream]++
		r.mu.Unlock()
		_ = m.Ack()
	}
}

func (r *running) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.handled)
}

// TestInFlightLimitsHandlers sends a burst of one key to a Handler that
// decides 8 messages at once and allows 2 handlers of a key at a time:
// never more than 2 run at once, every message is handled exactly once,
// refused messages wait in process for a handler of their key to end (in
// the fair shares) or, without them, are NAKed (or held on their last
// delivery), never dropped at MaxDeliver, and every slot is free
// afterwards.
func TestInFlightLimitsHandlers(t *testing.T) {
	const (
		limit = 2
		msgs  = 12
		work  = 100 * time.Millisecond
	)
	for _, fairOn := range []bool{true, false} {
		for _, maxDeliver := range []int{5, 1} {
			for _, lim := range inFlightLimiters(t, limit) {
				t.Run(fmt.Sprintf("%s/MaxDeliver=%d/fair=%v", lim.name, maxDeliver, fairOn), func(t *testing.T) {
					e := newEnv(t)
					cfg := jetstream.ConsumerConfig{AckWait: 2 * time.Second, MaxDeliver: maxDeliver}
					c := e.consumer(t, cfg)
					maxed := e.watch(t, maxDeliveriesAdvisory)
					naked := e.watch(t, nakAdvisory)
					var reported errs
					r := newRunning()
					h := newHandler(t, r.handler(work), newGate(t, throttle.PerSecond(1000), nil),
						WithConsumerConfig(cfg), WithConcurrency(8), WithJitter(0, 0),
						WithInFlight(lim.l, 300*time.Millisecond), WithErrorHandler(reported.handle), WithFair(fairOn))
					consume(t, c, h.Handle)
					for i := range msgs {
						e.publish(t, "jobs.a", fmt.Sprint(i), nil)
					}
					waitFor(t, 15*time.Second, "every message handled", func() bool { return r.count() == msgs })
					time.Sleep(200 * time.Millisecond) // any duplicate would show by now
					if most := r.most.Load(); most != limit {
						t.Errorf("%d handlers ran at once, want exactly %d", most, limit)
					}
					r.mu.Lock()
					for seq, n := range r.handled {
						if n != 1 {
							t.Errorf("stream seq %d handled %d times", seq, n)
						}
					}
					r.mu.Unlock()
					if n := len(maxed.all()); n != 0 {
						t.Errorf("%d MAX_DELIVERIES advisories", n)
					}
					nakedSeqs := map[float64]int{}
					for _, a := range naked.all() {
						seq, _ := a["stream_seq"].(float64)
						nakedSeqs[seq]++
					}
					switch {
					case fairOn:
						// A refused message waits for a handler of its key
						// to end, or beyond its key's share of the queue
						// goes back once, to when its turn comes.
						for seq, n := range nakedSeqs {
							if n > 1 {
								t.Errorf("stream seq %v NAKed %d times, want at most once", seq, n)
							}
						}
					case maxDeliver > 1 && len(naked.all()) == 0:
						t.Error("no message was NAKed: the in-flight limit refused none")
					case maxDeliver == 1 && h.heartbeats.Load() == 0:
						t.Error("no message was held on its last delivery")
					}
					if errs := reported.all(); len(errs) != 0 {
						t.Errorf("errors reported: %v", errs)
					}
					t.Logf("%d NAKs, %d heartbeats", len(naked.all()), h.heartbeats.Load())
					// Released after each handler: every slot is free.
					for i := range limit {
						d, err := lim.l.Acquire(context.Background(), "jobs.a", fmt.Sprint("probe", i), time.Second)
						if err != nil || !d.Allowed {
							t.Fatalf("Acquire after the run = %+v, %v; want admitted", d, err)
						}
					}
				})
			}
		}
	}
}

// TestInFlightReleaseAtAck: the slot is released when the handler acks,
// before it returns; while the handler runs longer than the lease, its
// slot is renewed and stays held.
func TestInFlightReleaseAtAck(t *testing.T) {
	for _, lim := range inFlightLimiters(t, 1) {
		t.Run(lim.name, func(t *testing.T) {
			e := newEnv(t)
			cfg := jetstream.ConsumerConfig{AckWait: 5 * time.Second, MaxDeliver: 3}
			c := e.consumer(t, cfg)
			const lease = 150 * time.Millisecond
			acked, finish := make(chan struct{}), make(chan struct{})
			next := func(m jetstream.Msg) {
				time.Sleep(3 * lease) // the lease would have ended without renewals
				if d, err := lim.l.Acquire(context.Background(), "jobs.a", "other", time.Second); err != nil || d.Allowed {
					t.Errorf("Acquire while the handler runs = %+v, %v; want rejected (slot renewed)", d, err)
				}
				if err := m.InProgress(); err != nil {
					t.Error(err)
				}
				if err := m.DoubleAck(context.Background()); err != nil {
					t.Error(err)
				}
				close(acked)
				<-finish
			}
			var reported errs
			h := newHandler(t, next, newGate(t, throttle.PerSecond(100), nil),
				WithConsumerConfig(cfg), WithInFlight(lim.l, lease), WithErrorHandler(reported.handle))
			consume(t, c, h.Handle)
			e.publish(t, "jobs.a", "x", nil)
			select {
			case <-acked:
			case <-time.After(10 * time.Second):
				t.Fatal("not handled")
			}
			d, err := lim.l.Acquire(context.Background(), "jobs.a", "other", time.Second)
			close(finish)
			if err != nil || !d.Allowed {
				t.Fatalf("Acquire after the ack, handler still running = %+v, %v; want admitted", d, err)
			}
			if err := lim.l.Release(context.Background(), "jobs.a", "other"); err != nil {
				t.Fatal(err)
			}
			if errs := reported.all(); len(errs) != 0 {
				t.Errorf("errors reported: %v", errs)
			}
		})
	}
}

// dying forwards to an in-flight limiter until it is killed: then Renew
// and Release never reach it, as for a process that died. kill waits for
// the calls under way.
type dying struct {
	throttle.InFlightLimiter
	mu   sync.RWMutex
	dead bool
}

func (d *dying) kill() {
	d.mu.Lock()
	d.dead = true
	d.mu.Unlock()
}

func (d *dying) Renew(ctx context.Context, key, id string, lease time.Duration) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.dead {
		return errors.New("dead")
	}
	return d.InFlightLimiter.Renew(ctx, key, id, lease)
}

func (d *dying) Release(ctx context.Context, key, id string) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.dead {
		return nil
	}
	return d.InFlightLimiter.Release(ctx, key, id)
}

// TestInFlightDeadHolder: the slot of a worker that dies while its
// handler runs (no renewal, no release reaches Redis) comes back when its
// lease ends, and not before.
func TestInFlightDeadHolder(t *testing.T) {
	lim := inFlightLimiters(t, 1)[1].l // Redis
	e := newEnv(t)
	cfg := jetstream.ConsumerConfig{AckWait: 5 * time.Second, MaxDeliver: 3}
	c := e.consumer(t, cfg)
	const lease = 400 * time.Millisecond
	dl := &dying{InFlightLimiter: lim}
	started, finish := make(chan struct{}), make(chan struct{})
	next := func(m jetstream.Msg) {
		close(started)
		<-finish
		_ = m.Ack()
	}
	h := newHandler(t, next, newGate(t, throttle.PerSecond(100), nil),
		WithConsumerConfig(cfg), WithInFlight(dl, lease), WithErrorHandler(func(jetstream.Msg, error) {}))
	consume(t, c, h.Handle)
	e.publish(t, "jobs.a", "x", nil)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("not handled")
	}
	time.Sleep(lease) // renewed meanwhile
	dl.kill()
	died := time.Now()
	defer close(finish)
	ctx := context.Background()
	// Its last renewal was at most lease/3 before it died. until is no
	// later than the lease's end: the clock is read before the request.
	sent := time.Now()
	d, err := lim.Acquire(ctx, "jobs.a", "other", time.Second)
	if err != nil || d.Allowed || d.RetryAfter > lease {
		t.Fatalf("Acquire right after the holder died = %+v, %v; want rejected, RetryAfter <= %v", d, err, lease)
	}
	until := sent.Add(d.RetryAfter)
	if early := until.Add(-lease / 4); time.Now().Before(early) {
		time.Sleep(time.Until(early))
		d, err := lim.Acquire(ctx, "jobs.a", "other", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// An admission whose reply came before until was decided before the
		// lease ended.
		if d.Allowed && time.Now().Before(until) {
			t.Fatalf("Acquire %v after the holder died, before its lease ends = %+v; want rejected", time.Since(died), d)
		}
	}
	// Then it comes back: polled until admitted. Every rejection on the way
	// points at the same end (the dead holder's lease never moves later);
	// 5 s is only the net for a lease that never ends.
	time.Sleep(time.Until(until))
	for {
		d, err := lim.Acquire(ctx, "jobs.a", "other", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			break
		}
		if left := time.Until(until); d.RetryAfter > left+50*time.Millisecond {
			t.Fatalf("the dead holder's lease moved: RetryAfter %v, %v left of it", d.RetryAfter, left)
		}
		if since := time.Since(died); since > lease+5*time.Second {
			t.Fatalf("slot not back %v after the holder died (lease %v): %+v", since, lease, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("slot back %v after the holder died, lease %v", time.Since(died), lease)
}

// failingInFlight is an in-flight limiter whose store is down.
type failingInFlight struct{ calls atomic.Int64 }

var errSlotStore = errors.New("slot store: connection refused")

func (f *failingInFlight) Acquire(context.Context, string, string, time.Duration) (throttle.Decision, error) {
	f.calls.Add(1)
	return throttle.Decision{}, errSlotStore
}

func (f *failingInFlight) Renew(context.Context, string, string, time.Duration) error {
	return errSlotStore
}

func (f *failingInFlight) Release(context.Context, string, string) error { return errSlotStore }

// TestInFlightStoreDown: when the in-flight limiter fails, the Gate's
// failure policy decides (FailOpen runs the handler without a slot,
// FailClosed NAKs with the degraded retry-after) and the error is
// reported.
func TestInFlightStoreDown(t *testing.T) {
	for _, policy := range []throttle.FailurePolicy{throttle.FailOpen, throttle.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			e := newEnv(t)
			cfg := jetstream.ConsumerConfig{AckWait: 5 * time.Second, MaxDeliver: 10}
			c := e.consumer(t, cfg)
			naked := e.watch(t, nakAdvisory)
			lim, err := window.NewMemory(throttle.PerSecond(100))
			if err != nil {
				t.Fatal(err)
			}
			g, err := throttle.NewGate(lim, throttle.WithFailurePolicy(policy), throttle.WithDegradedRetryAfter(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			var reported errs
			rec := newRecorder()
			f := &failingInFlight{}
			h := newHandler(t, rec.handle, g, WithConsumerConfig(cfg), WithInFlight(f, time.Second),
				WithErrorHandler(reported.handle), WithJitter(0, 0))
			consume(t, c, h.Handle)
			e.publish(t, "jobs.a", "x", nil)
			if policy == throttle.FailOpen {
				waitFor(t, 5*time.Second, "handled", func() bool { return rec.len() == 1 })
				if n := reported.matching(errSlotStore); n != 1 {
					t.Errorf("%d errors reported, want 1 (Acquire; Release is skipped without a slot)", n)
				}
				return
			}
			waitFor(t, 5*time.Second, "two NAKs", func() bool { return len(naked.all()) >= 2 })
			if rec.len() != 0 {
				t.Fatal("handled without a slot under FailClosed")
			}
			if reported.matching(errSlotStore) < 2 {
				t.Errorf("errors reported: %v", reported.all())
			}
		})
	}
}

func TestWithInFlightValidates(t *testing.T) {
	mem, err := concurrency.NewMemory(1)
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t, throttle.PerSecond(1), nil)
	if _, err := New(func(jetstream.Msg) {}, g, WithInFlight(mem, 0)); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("lease 0: %v, want ErrInvalidOption", err)
	}
	if _, err := New(func(jetstream.Msg) {}, g, WithInFlight(nil, 0)); err != nil {
		t.Fatalf("nil limiter: %v, want the default", err)
	}
}
