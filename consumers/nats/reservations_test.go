package natsthrottle

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// nakCounter counts the NAKs of the messages it wraps, by stream sequence.
type nakCounter struct {
	mu   sync.Mutex
	naks map[uint64]int
	all  atomic.Int64
}

type countedMsg struct {
	jetstream.Msg
	c *nakCounter
}

func (m countedMsg) NakWithDelay(d time.Duration) error {
	if md, err := m.Metadata(); err == nil {
		m.c.mu.Lock()
		m.c.naks[md.Sequence.Stream]++
		m.c.mu.Unlock()
	}
	m.c.all.Add(1)
	return m.Msg.NakWithDelay(d)
}

// TestReservationsNakOnce: a burst of 30 messages on one key at 10 per
// 300 ms, with reservations: each message that must wait is NAKed once, to
// its own slot, none is NAKed twice, every message is handled exactly
// once, and the limiter's admissions hold the limit.
func TestReservationsNakOnce(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{MaxDeliver: 5, AckWait: 5 * time.Second})
	const total, limit = 30, 10
	r := throttle.Rate{Count: limit, Per: 300 * time.Millisecond}
	lim := newInstantsLimiter(t, r)
	g, err := throttle.NewGate(lim, throttle.WithReservations(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, g, WithErrorHandler(reported.handle),
		WithConsumerConfig(jetstream.ConsumerConfig{MaxDeliver: 5, AckWait: 5 * time.Second}))
	for i := range total {
		e.publish(t, "jobs.burst", strconv.Itoa(i), nil)
	}
	naks := &nakCounter{naks: map[uint64]int{}}
	consume(t, c, func(m jetstream.Msg) { h.Handle(countedMsg{Msg: m, c: naks}) })
	waitFor(t, 10*time.Second, "30 handled messages", func() bool { return rec.len() >= total })
	time.Sleep(200 * time.Millisecond) // room for a duplicate to show up

	handledOnce(t, rec, total)
	naks.mu.Lock()
	defer naks.mu.Unlock()
	for seq, n := range naks.naks {
		// A claim a millisecond late, behind others on time, may have
		// to wait for the next slot: rarely, never a third time.
		if n > 2 {
			t.Errorf("stream sequence %d NAKed %d times, want at most twice", seq, n)
		}
	}
	// 10 are admitted on arrival; the other 20 wait, each NAKed once (or
	// waiting in process when its slot is a few ms away).
	if n := naks.all.Load(); n > total-limit {
		t.Errorf("%d NAKs, want at most %d", n, total-limit)
	}
	if n := maxInWindow(lim.admitted(), r.Per); n > limit {
		t.Errorf("%d admissions within %v, want <= %d", n, r.Per, limit)
	}
	if h.Held() != 0 {
		t.Errorf("Held() = %d, want 0", h.Held())
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("error handler got %d errors, first %v", len(errs), errs[0])
	}
}

// TestConcurrentDecisions: with WithConcurrency(4), without fair shares,
// and a limiter that takes 50 ms per decision, 8 messages are decided 4
// at a time (the Consume callback hands each to a goroutine and waits
// only when 4 are busy), every one handled once, and Close waits for
// them. (With fair shares a message's rate decides as it starts waiting
// for its handler.)
func TestConcurrentDecisions(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{})
	var inFlight, most atomic.Int64
	lim := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
		inFlight.Add(-1)
		return throttle.Decision{Allowed: true, Limit: 100}, nil
	})
	g, err := throttle.NewGate(lim)
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	h := newHandler(t, rec.handle, g, WithConcurrency(4), WithFair(false))
	for i := range 8 {
		e.publish(t, "jobs.c", strconv.Itoa(i), nil)
	}
	consume(t, c, h.Handle)
	waitFor(t, 5*time.Second, "8 handled messages", func() bool { return rec.len() >= 8 })
	if n := most.Load(); n != 4 {
		t.Errorf("at most %d decisions at once, want 4", n)
	}
	seen := map[uint64]int{}
	for _, r := range rec.records() {
		seen[r.seq]++
	}
	if len(seen) != 8 {
		t.Errorf("handled %d distinct messages, want 8", len(seen))
	}
}

// TestConsumePaced: 30 messages of one key at 10 per 300 ms, pulled with
// ConsumePaced: every message handled exactly once, none NAKed (nothing is
// delivered before there is room), and the limit held.
func TestConsumePaced(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{})
	const total, limit = 30, 10
	r := throttle.Rate{Count: limit, Per: 300 * time.Millisecond}
	lim := newInstantsLimiter(t, r)
	g, err := throttle.NewGate(lim, throttle.WithReservations(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, g, WithErrorHandler(reported.handle))
	for i := range total {
		e.publish(t, "jobs.paced", strconv.Itoa(i), nil)
	}
	naks := &nakCounter{naks: map[uint64]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ConsumePaced(ctx, countingConsumer{c, naks}, h, lim, "jobs.paced") }()
	waitFor(t, 10*time.Second, "30 handled messages", func() bool { return rec.len() >= total })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ConsumePaced: %v", err)
	}
	handledOnce(t, rec, total)
	if n := naks.all.Load(); n != 0 {
		t.Errorf("%d NAKs, want 0 (a paced pull fetches only what fits)", n)
	}
	if n := maxInWindow(lim.admitted(), r.Per); n > limit {
		t.Errorf("%d admissions within %v, want <= %d", n, r.Per, limit)
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("error handler got %d errors, first %v", len(errs), errs[0])
	}
}

// countingConsumer counts the NAKs of the messages it fetches.
type countingConsumer struct {
	jetstream.Consumer
	naks *nakCounter
}

func (c countingConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(n, opts...)
	if err != nil {
		return nil, err
	}
	out := make(chan jetstream.Msg)
	go func() {
		defer close(out)
		for m := range b.Messages() {
			out <- countedMsg{Msg: m, c: c.naks}
		}
	}()
	return countedBatch{MessageBatch: b, msgs: out}, nil
}

type countedBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b countedBatch) Messages() <-chan jetstream.Msg { return b.msgs }

// slowClaim is window.Memory whose AllowID calls for one id after the
// first run onClaim and then wait a while before deciding.
type slowClaim struct {
	*window.Memory
	id      string
	calls   atomic.Int64
	onClaim func()
}

func (l *slowClaim) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	if id == l.id && l.calls.Add(1) == 2 && l.onClaim != nil {
		l.onClaim()
		time.Sleep(300 * time.Millisecond)
	}
	return l.Memory.AllowID(ctx, key, n, id, horizon)
}

// TestSupersededDeliveryNotRun: when the server delivers a message again
// while an earlier delivery of it waits in process for its reserved slot
// (as a restarted server does with what it had pending), only the newest
// delivery runs the handler: both would be admitted at the slot, the
// second for free on the first's admission. The newer delivery may come
// while the earlier one waits, or while it is being decided at its slot.
func TestSupersededDeliveryNotRun(t *testing.T) {
	for _, during := range []string{"wait", "claim"} {
		t.Run("during the "+during, func(t *testing.T) {
			e := newEnv(t)
			cfg := jetstream.ConsumerConfig{MaxDeliver: 10, AckWait: 4 * time.Second}
			c := e.consumer(t, cfg)
			r := throttle.Rate{Count: 1, Per: 600 * time.Millisecond}
			mem, err := window.NewMemory(r)
			if err != nil {
				t.Fatal(err)
			}
			e.publish(t, "jobs.k", "first", nil)
			second := e.publish(t, "jobs.k", "second", nil)
			lim := &slowClaim{Memory: mem, id: streamName + ":" + strconv.FormatUint(second, 10)}
			g, err := throttle.NewGate(lim, throttle.WithReservations(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder()
			var reported errs
			h := newHandler(t, rec.handle, g, WithErrorHandler(reported.handle), WithConsumerConfig(cfg))
			var first atomic.Value // the second message's first delivery
			if during == "claim" {
				// Its decision at the slot (the id's second AllowID) is slow;
				// the server delivers the message again as it starts.
				lim.onClaim = func() { _ = first.Load().(jetstream.Msg).Nak() }
			}
			consume(t, c, func(m jetstream.Msg) {
				if md, err := m.Metadata(); err == nil && md.Sequence.Stream == second && md.NumDelivered == 1 {
					first.Store(m)
					if during == "wait" {
						// While this delivery waits for its slot (600 ms
						// ahead), the server delivers the message again.
						time.AfterFunc(100*time.Millisecond, func() { _ = m.Nak() })
					}
				}
				h.Handle(m)
			})
			waitFor(t, 5*time.Second, "both messages handled", func() bool { return rec.len() >= 2 })
			time.Sleep(600 * time.Millisecond) // room for a second run to show up
			var runs []uint64
			for _, rc := range rec.records() {
				if rc.seq == second {
					runs = append(runs, rc.delivered)
				}
			}
			if len(runs) != 1 || runs[0] != 2 {
				t.Fatalf("the second message ran on deliveries %v, want once, on its newest delivery (2)", runs)
			}
			if errs := reported.all(); len(errs) > 0 {
				t.Errorf("error handler got %d errors, first %v", len(errs), errs[0])
			}
		})
	}
}

// TestWaitRestartsAckWait: a message that reaches Handle late (it sat in
// the client's buffer behind others) and then waits in process for its
// slot restarts its AckWait as the wait starts (InProgress), so that the
// buffer, the wait and the handler together may outlast one AckWait
// without a redelivery. Here: AckWait 1 s, 450 ms in the buffer, a slot
// about 250 ms ahead, a 500 ms handler: the ack comes 1.2 s after the
// delivery, and the message is still delivered once.
func TestWaitRestartsAckWait(t *testing.T) {
	e := newEnv(t)
	cfg := jetstream.ConsumerConfig{MaxDeliver: 5, AckWait: time.Second}
	c := e.consumer(t, cfg)
	mem, err := window.NewMemory(throttle.Rate{Count: 1, Per: 700 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g, err := throttle.NewGate(mem, throttle.WithReservations(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, "jobs.k", "first", nil)
	slow := e.publish(t, "jobs.k", "slow", nil)
	rec := newRecorder()
	var reported errs
	h := newHandler(t, func(m jetstream.Msg) {
		if md, err := m.Metadata(); err == nil && md.Sequence.Stream == slow {
			time.Sleep(500 * time.Millisecond)
		}
		rec.handle(m)
	}, g, WithErrorHandler(reported.handle), WithConsumerConfig(cfg), WithMaxWait(400*time.Millisecond))
	var mu sync.Mutex
	deliveries := map[uint64]uint64{} // stream sequence -> highest NumDelivered seen
	consume(t, c, func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		deliveries[md.Sequence.Stream] = max(deliveries[md.Sequence.Stream], md.NumDelivered)
		mu.Unlock()
		if md.Sequence.Stream == slow && md.NumDelivered == 1 {
			time.Sleep(450 * time.Millisecond) // as if buffered behind others
		}
		h.Handle(m)
	})
	waitFor(t, 5*time.Second, "both messages handled", func() bool { return rec.len() >= 2 })
	time.Sleep(time.Second) // room for a redelivery to show up
	mu.Lock()
	defer mu.Unlock()
	if n := deliveries[slow]; n != 1 {
		t.Errorf("the slow message was delivered %d times, want once: its wait did not restart its AckWait", n)
	}
	if n := rec.len(); n != 2 {
		t.Errorf("%d runs, want 2", n)
	}
	if h.Waiting() != 0 {
		t.Errorf("Waiting() = %d, want 0", h.Waiting())
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("error handler got %d errors, first %v", len(errs), errs[0])
	}
}

// handledOnce checks that stream sequences 1 to total were each handled
// exactly once.
func handledOnce(t *testing.T, rec *recorder, total int) {
	t.Helper()
	seen := map[uint64]int{}
	for _, rc := range rec.records() {
		seen[rc.seq]++
	}
	for seq := uint64(1); seq <= uint64(total); seq++ {
		if seen[seq] != 1 {
			t.Errorf("stream sequence %d handled %d times, want 1", seq, seen[seq])
		}
	}
}

// admissionTimes wraps an IDLimiter and records when it admits anew (not
// an id admitted before), by key.
type admissionTimes struct {
	throttle.IDLimiter
	mu sync.Mutex
	at map[string][]time.Time
}

func (l *admissionTimes) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	d, err := l.IDLimiter.AllowID(ctx, key, n, id, horizon)
	if err == nil && d.Allowed && !d.AlreadyAdmitted {
		l.mu.Lock()
		l.at[key] = append(l.at[key], time.Now())
		l.mu.Unlock()
	}
	return d, err
}

// TestReservationsStackedNakOnce: two tenants (8 per 300 ms each) burst
// 20 messages each under one partner limit (10 per 300 ms, a part of All
// keyed "partner"), with reservations: 10 start on arrival, and each of
// the 30 others is NAKed about once, to the slot All holds in both parts
// (at most 1.15 x 30 NAKs, none NAKed three times); every message is handled exactly once, and
// neither the tenants nor the partner go over their limits.
func TestReservationsStackedNakOnce(t *testing.T) {
	e := newEnv(t)
	cfg := jetstream.ConsumerConfig{MaxDeliver: 5, AckWait: 5 * time.Second}
	c := e.consumer(t, cfg)
	const perTenant, tenantLimit, partnerLimit = 20, 8, 10
	per := 300 * time.Millisecond
	tenants, err := window.NewMemory(throttle.Rate{Count: tenantLimit, Per: per})
	if err != nil {
		t.Fatal(err)
	}
	partner, err := window.NewMemory(throttle.Rate{Count: partnerLimit, Per: per})
	if err != nil {
		t.Fatal(err)
	}
	all, err := throttle.All(
		throttle.Part{Limiter: tenants},
		throttle.Part{Limiter: partner, Key: func(string) string { return "partner" }},
	)
	if err != nil {
		t.Fatal(err)
	}
	lim := &admissionTimes{IDLimiter: all.(throttle.IDLimiter), at: map[string][]time.Time{}}
	g, err := throttle.NewGate(lim, throttle.WithReservations(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	var reported errs
	// WithMaxWait(100ms): a message whose slot is further away goes back
	// to the broker (to return 50 ms before its slot and wait the rest in
	// process), so nearly every message that waits is NAKed.
	h := newHandler(t, rec.handle, g, WithErrorHandler(reported.handle), WithConsumerConfig(cfg), WithMaxWait(100*time.Millisecond))
	for i := range perTenant {
		e.publish(t, "jobs.a", strconv.Itoa(i), nil)
		e.publish(t, "jobs.b", strconv.Itoa(i), nil)
	}
	naks := &nakCounter{naks: map[uint64]int{}}
	consume(t, c, func(m jetstream.Msg) { h.Handle(countedMsg{Msg: m, c: naks}) })
	const total = 2 * perTenant
	waitFor(t, 15*time.Second, "40 handled messages", func() bool { return rec.len() >= total })
	time.Sleep(200 * time.Millisecond) // room for a duplicate to show up

	handledOnce(t, rec, total)
	mustWait := total - partnerLimit
	naks.mu.Lock()
	for seq, n := range naks.naks {
		// A claim a millisecond late, behind others on time, may have
		// to wait for the next slot: rarely, never a third time.
		if n > 2 {
			t.Errorf("stream sequence %d NAKed %d times, want at most twice", seq, n)
		}
	}
	naks.mu.Unlock()
	if n := naks.all.Load(); float64(n) > 1.15*float64(mustWait) {
		t.Errorf("%d NAKs, want at most 1.15 x the %d messages that cannot start on arrival", n, mustWait)
	}
	lim.mu.Lock()
	defer lim.mu.Unlock()
	// Instants taken after each decision: a slot exactly one window after
	// another may show a little less apart.
	var every []time.Time
	for key, ts := range lim.at {
		if n := maxInWindow(ts, per-5*time.Millisecond); n > tenantLimit {
			t.Errorf("%s: %d admissions within %v, want <= %d", key, n, per, tenantLimit)
		}
		every = append(every, ts...)
	}
	if n := maxInWindow(every, per-5*time.Millisecond); n > partnerLimit {
		t.Errorf("partner: %d admissions within %v, want <= %d", n, per, partnerLimit)
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("error handler got %d errors, first %v", len(errs), errs[0])
	}
	t.Logf("%d NAKs for %d messages that cannot start on arrival", naks.all.Load(), mustWait)
}
