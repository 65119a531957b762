package natsthrottle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// TestRateOverStream: 200 messages at 20 per second are all handled exactly
// once, and no 1 s interval holds more than 20 handler starts.
func TestRateOverStream(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{})
	const total, limit = 200, 20
	rec := newRecorder()
	var reported errs
	lim := newInstantsLimiter(t, throttle.Rate{Count: limit, Per: time.Second})
	g, err := throttle.NewGate(lim)
	if err != nil {
		t.Fatal(err)
	}
	h := newHandler(t, rec.handle, g, WithErrorHandler(reported.handle))
	for i := range total {
		e.publish(t, "jobs.bulk", strconv.Itoa(i), nil)
	}
	start := time.Now()
	consume(t, c, h.Handle)
	waitFor(t, 30*time.Second, "200 handled messages", func() bool { return rec.len() >= total })
	elapsed := time.Since(start)
	time.Sleep(300 * time.Millisecond) // room for a duplicate to show up

	recs := rec.records()
	if len(recs) != total {
		t.Fatalf("handled %d messages, want %d", len(recs), total)
	}
	seen := map[uint64]int{}
	starts := make([]time.Time, 0, total)
	for _, r := range recs {
		seen[r.seq]++
		starts = append(starts, r.at)
	}
	for seq := uint64(1); seq <= total; seq++ {
		if seen[seq] != 1 {
			t.Errorf("stream sequence %d handled %d times, want 1", seq, seen[seq])
		}
	}
	// The limiter's own instants obey the limit exactly. Handler starts
	// follow their admission by the wrapper's overhead (microseconds, more
	// under -race or a GC pause), which can bring 21 starts a few
	// microseconds under 1 s apart; allow 20 ms for it.
	admits := lim.admitted()
	if len(admits) != total {
		t.Errorf("%d admissions, want %d", len(admits), total)
	}
	if n := maxInWindow(admits, time.Second); n > limit {
		t.Errorf("%d admissions within 1s, want <= %d", n, limit)
	}
	const latency = 20 * time.Millisecond
	if n := maxInWindow(starts, time.Second-latency); n > limit {
		t.Errorf("%d handler starts within %v, want <= %d (tightest %d starts span %v)",
			n, time.Second-latency, limit, limit+1, tightest(starts, limit+1))
	}
	t.Logf("tightest %d handler starts span %v, %d admissions %v", limit+1, tightest(starts, limit+1), limit+1, tightest(admits, limit+1))
	if min := time.Duration(total/limit-1) * time.Second; elapsed < min {
		t.Errorf("200 messages handled in %v, faster than the limit allows (%v)", elapsed, min)
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("error handler got %d errors, first %v", len(errs), errs[0])
	}
	waitFor(t, 5*time.Second, "no ack pending", func() bool { return ackPending(t, c) == 0 })
	t.Logf("200 messages at 20/s in %v", elapsed)
}

// TestMaxDeliverHolds: with MaxDeliver 3 and a limit that rejects most
// messages more than 3 times, every message is still handled exactly once,
// held messages are kept alive past AckWait with InProgress, and the server
// emits no MAX_DELIVERIES advisory.
func TestMaxDeliverHolds(t *testing.T) {
	e := newEnv(t)
	maxDeliveries := e.watch(t, maxDeliveriesAdvisory)
	cfg := jetstream.ConsumerConfig{MaxDeliver: 3, AckWait: time.Second}
	c := e.consumer(t, cfg)
	const total = 10
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, newGate(t, throttle.Rate{Count: 1, Per: 300 * time.Millisecond}, nil),
		WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
	for i := range total {
		e.publish(t, "jobs.slow", strconv.Itoa(i), nil)
	}
	start := time.Now()
	consume(t, c, h.Handle)
	maxHeld := 0
	waitFor(t, 20*time.Second, "10 handled messages", func() bool {
		maxHeld = max(maxHeld, h.Held())
		return rec.len() >= total
	})
	elapsed := time.Since(start)
	// Past AckWait: any message left unacknowledged would now be redelivered
	// or reported as exceeding MaxDeliver.
	time.Sleep(cfg.AckWait + 500*time.Millisecond)

	recs := rec.records()
	if len(recs) != total {
		t.Fatalf("handled %d messages, want %d", len(recs), total)
	}
	seen := map[uint64]int{}
	var last record
	for _, r := range recs {
		seen[r.seq]++
		if r.delivered > uint64(cfg.MaxDeliver) {
			t.Errorf("seq %d handled on delivery %d > MaxDeliver", r.seq, r.delivered)
		}
		if r.at.After(last.at) {
			last = r
		}
	}
	for seq := uint64(1); seq <= total; seq++ {
		if seen[seq] != 1 {
			t.Errorf("stream sequence %d handled %d times, want 1", seq, seen[seq])
		}
	}
	if a := maxDeliveries.all(); len(a) > 0 {
		t.Errorf("got %d MAX_DELIVERIES advisories, want 0: %v", len(a), a[0])
	}
	if last.at.Sub(start) <= cfg.AckWait {
		t.Errorf("last message handled %v after start; the test needs it held past AckWait %v", last.at.Sub(start), cfg.AckWait)
	}
	if last.delivered != uint64(cfg.MaxDeliver) {
		t.Errorf("last message handled on delivery %d, want %d (held)", last.delivered, cfg.MaxDeliver)
	}
	if maxHeld == 0 {
		t.Error("no message was ever held")
	}
	if n := h.heartbeats.Load(); n < 3 {
		t.Errorf("%d InProgress heartbeats, want several", n)
	}
	if got := ackPending(t, c); got != 0 {
		t.Errorf("NumAckPending = %d, want 0", got)
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("error handler got %d errors, first %v", len(errs), errs[0])
	}
	t.Logf("handled in %v, max held %d, %d heartbeats", elapsed, maxHeld, h.heartbeats.Load())
}

// TestTraceContext: the process span is a child of the producer's span
// whatever the case of the traceparent header, the Gate's span is its
// child, and a message without headers starts a new trace.
func TestTraceContext(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{})
	tp, sr := newTracing(t)
	rec := newRecorder()
	h := newHandler(t, rec.handle, newGate(t, throttle.PerSecond(100), tp),
		WithTracerProvider(tp), WithPropagators(propagation.TraceContext{}))

	producer := tp.Tracer("producer")
	tc := propagation.TraceContext{}
	send := func(subj string, inject func(context.Context, nats.Header)) (trace.SpanContext, uint64) {
		ctx, span := producer.Start(context.Background(), "send "+subj, trace.WithSpanKind(trace.SpanKindProducer))
		defer span.End()
		var hdr nats.Header
		if inject != nil {
			hdr = nats.Header{}
			inject(ctx, hdr)
		}
		return span.SpanContext(), e.publish(t, subj, "x", hdr)
	}
	canonical := func(ctx context.Context, hdr nats.Header) {
		tc.Inject(ctx, propagation.HeaderCarrier(http.Header(hdr)))
		if hdr["Traceparent"] == nil {
			t.Fatalf("canonical header not written as Traceparent: %v", hdr)
		}
	}
	lower := func(ctx context.Context, hdr nats.Header) {
		tc.Inject(ctx, HeaderCarrier(hdr))
		if hdr["traceparent"] == nil {
			t.Fatalf("lowercase header not written as traceparent: %v", hdr)
		}
	}
	tests := []struct {
		name    string
		subject string
		inject  func(context.Context, nats.Header)
	}{
		{"canonical Traceparent", "jobs.trace.canonical", canonical},
		{"lowercase traceparent", "jobs.trace.lower", lower},
		{"no headers", "jobs.trace.none", nil},
	}
	producers := map[string]trace.SpanContext{}
	seqs := map[string]uint64{}
	for _, tt := range tests {
		producers[tt.subject], seqs[tt.subject] = send(tt.subject, tt.inject)
	}
	consume(t, c, h.Handle)
	waitFor(t, 10*time.Second, "3 handled messages", func() bool { return rec.len() >= len(tests) })
	processSpans := func() map[string]sdktrace.ReadOnlySpan {
		m := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range sr.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer {
				m[s.Name()] = s
			}
		}
		return m
	}
	waitFor(t, 5*time.Second, "3 process spans", func() bool { return len(processSpans()) >= len(tests) })
	spans := processSpans()
	handlerCtx := map[string]context.Context{}
	for _, r := range rec.records() {
		handlerCtx[r.subject] = r.ctx
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, ok := spans[SpanNamePrefix+tt.subject]
			if !ok {
				t.Fatalf("no span %q among %v", SpanNamePrefix+tt.subject, spans)
			}
			prod := producers[tt.subject]
			if tt.inject != nil {
				if ps.Parent().TraceID() != prod.TraceID() || ps.Parent().SpanID() != prod.SpanID() {
					t.Errorf("process span parent = %v/%v, want producer %v/%v",
						ps.Parent().TraceID(), ps.Parent().SpanID(), prod.TraceID(), prod.SpanID())
				}
				if !ps.Parent().IsRemote() {
					t.Error("process span parent is not remote")
				}
			} else {
				if ps.Parent().IsValid() {
					t.Errorf("process span of a message without headers has parent %v", ps.Parent())
				}
				if ps.SpanContext().TraceID() == prod.TraceID() {
					t.Error("message without headers joined the producer's trace")
				}
			}
			want := map[attribute.Key]attribute.Value{
				semconv.MessagingSystemKey:            attribute.StringValue("nats"),
				semconv.MessagingDestinationNameKey:   attribute.StringValue(tt.subject),
				semconv.MessagingOperationTypeKey:     attribute.StringValue("process"),
				semconv.MessagingOperationNameKey:     attribute.StringValue("process"),
				semconv.MessagingMessageIDKey:         attribute.StringValue(strconv.FormatUint(seqs[tt.subject], 10)),
				semconv.MessagingConsumerGroupNameKey: attribute.StringValue(consumerName),
				semconv.MessagingMessageBodySizeKey:   attribute.IntValue(1),
				NumDeliveredAttr:                      attribute.Int64Value(1),
				DispositionAttr:                       attribute.StringValue(DispositionHandled),
			}
			got := map[attribute.Key]attribute.Value{}
			for _, kv := range ps.Attributes() {
				got[kv.Key] = kv.Value
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("attribute %s = %v, want %v", k, got[k].String(), v.String())
				}
			}
			if ps.Status().Code != codes.Unset {
				t.Errorf("status = %v, want unset", ps.Status())
			}
			if ps.InstrumentationScope().Name != ScopeName {
				t.Errorf("scope = %q, want %q", ps.InstrumentationScope().Name, ScopeName)
			}
			var admit sdktrace.ReadOnlySpan
			for _, s := range sr.Ended() {
				if s.Name() == throttle.SpanName && s.Parent().SpanID() == ps.SpanContext().SpanID() {
					admit = s
				}
			}
			if admit == nil {
				t.Fatalf("no %s span with the process span as parent", throttle.SpanName)
			}
			if admit.SpanContext().TraceID() != ps.SpanContext().TraceID() {
				t.Error("admit span in another trace")
			}
			if sc := trace.SpanContextFromContext(handlerCtx[tt.subject]); sc.SpanID() != ps.SpanContext().SpanID() {
				t.Errorf("ContextFromMsg span = %v, want the process span %v", sc.SpanID(), ps.SpanContext().SpanID())
			}
		})
	}
}

// TestRejected: a rejected message is NAKed with a delay, its handler does
// not run, and the rejection is not an error.
func TestRejected(t *testing.T) {
	e := newEnv(t)
	naks := e.watch(t, nakAdvisory)
	c := e.consumer(t, jetstream.ConsumerConfig{})
	tp, sr := newTracing(t)
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, newGate(t, throttle.PerHour(1), tp),
		WithTracerProvider(tp), WithErrorHandler(reported.handle))
	first := e.publish(t, "jobs.one", "first", nil)
	second := e.publish(t, "jobs.one", "second", nil)
	consume(t, c, h.Handle)
	waitFor(t, 5*time.Second, "a NAK advisory", func() bool { return len(naks.all()) > 0 })
	time.Sleep(200 * time.Millisecond)

	recs := rec.records()
	if len(recs) != 1 || recs[0].seq != first {
		t.Fatalf("handled %+v, want only seq %d", recs, first)
	}
	a := naks.all()
	if len(a) != 1 || a[0]["stream_seq"] != float64(second) {
		t.Errorf("NAK advisories = %v, want one for seq %d", a, second)
	}
	if got := ackPending(t, c); got != 1 {
		t.Errorf("NumAckPending = %d, want 1 (the NAKed message waiting for its delay)", got)
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("a rejection reported errors: %v", errs)
	}
	var nakSpan sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == DispositionAttr && kv.Value.AsString() == DispositionNak {
				nakSpan = s
			}
		}
	}
	if nakSpan == nil {
		t.Fatal("no span with disposition nak")
	}
	if nakSpan.Status().Code != codes.Unset {
		t.Errorf("rejection span status = %v, want unset", nakSpan.Status())
	}
}

// TestNakErrorReported: a NAK that fails (the message was already acked)
// reaches the error handler and the span; the handler does not run.
func TestNakErrorReported(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, jetstream.ConsumerConfig{})
	tp, sr := newTracing(t)
	g := newGate(t, throttle.PerHour(1), tp)
	if d, err := g.Admit(context.Background(), "jobs.acked", 1); err != nil || !d.Allowed {
		t.Fatalf("Admit = %+v, %v", d, err)
	}
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, g, WithTracerProvider(tp), WithErrorHandler(reported.handle))
	e.publish(t, "jobs.acked", "x", nil)
	consume(t, c, func(msg jetstream.Msg) {
		_ = msg.Ack() // the NAK that follows must fail
		h.Handle(msg)
	})
	waitFor(t, 5*time.Second, "a reported error", func() bool { return len(reported.all()) > 0 })
	if n := reported.matching(jetstream.ErrMsgAlreadyAckd); n != 1 {
		t.Errorf("errors = %v, want one matching ErrMsgAlreadyAckd", reported.all())
	}
	if rec.len() != 0 {
		t.Error("handler ran for a rejected message")
	}
	waitFor(t, 5*time.Second, "the process span", func() bool {
		for _, s := range sr.Ended() {
			if s.Name() == SpanNamePrefix+"jobs.acked" {
				return s.Status().Code == codes.Error && len(s.Events()) > 0
			}
		}
		return false
	})
}

// TestNeverAdmissible: a key function error or a cost the limiter refuses
// terminates the message, reports the error, and never runs the handler.
func TestNeverAdmissible(t *testing.T) {
	errNoTenant := errors.New("no tenant header")
	tests := []struct {
		name string
		opt  Option
		want []error
	}{
		{"key func error", WithKeyFunc(func(jetstream.Msg) (string, error) { return "", errNoTenant }),
			[]error{throttle.ErrInvalidKey, errNoTenant}},
		{"cost above the limit", WithCostFunc(func(jetstream.Msg) (int, error) { return 5, nil }),
			[]error{throttle.ErrInvalidCost}},
		{"cost func error", WithCostFunc(func(jetstream.Msg) (int, error) { return 0, errNoTenant }),
			[]error{throttle.ErrInvalidCost, errNoTenant}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			terms := e.watch(t, termAdvisory)
			cfg := jetstream.ConsumerConfig{AckWait: 300 * time.Millisecond}
			c := e.consumer(t, cfg)
			rec := newRecorder()
			var reported errs
			h := newHandler(t, rec.handle, newGate(t, throttle.PerSecond(2), nil),
				tt.opt, WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
			seq := e.publish(t, "jobs.bad", "x", nil)
			consume(t, c, h.Handle)
			waitFor(t, 5*time.Second, "a MSG_TERMINATED advisory", func() bool { return len(terms.all()) > 0 })
			time.Sleep(cfg.AckWait + 200*time.Millisecond) // no redelivery
			a := terms.all()
			if len(a) != 1 || a[0]["stream_seq"] != float64(seq) {
				t.Fatalf("terminated advisories = %v, want one for seq %d", a, seq)
			}
			if reason, _ := a[0]["reason"].(string); reason == "" {
				t.Error("Term without a reason")
			}
			errs := reported.all()
			if len(errs) != 1 {
				t.Fatalf("reported %v, want one error", errs)
			}
			for _, w := range tt.want {
				if !errors.Is(errs[0], w) {
					t.Errorf("error %v does not match %v", errs[0], w)
				}
			}
			if !throttle.IsUsageError(errs[0]) {
				t.Errorf("error %v is not a usage error", errs[0])
			}
			if rec.len() != 0 {
				t.Error("handler ran")
			}
			if got := ackPending(t, c); got != 0 {
				t.Errorf("NumAckPending = %d, want 0", got)
			}
		})
	}
}

// TestHeldDoesNotBlockConsume: while one message is held, the messages
// behind it are decided and handled at once.
func TestHeldDoesNotBlockConsume(t *testing.T) {
	e := newEnv(t)
	maxDeliveries := e.watch(t, maxDeliveriesAdvisory)
	cfg := jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 500 * time.Millisecond}
	c := e.consumer(t, cfg)
	rec := newRecorder()
	var reported errs
	var mu sync.Mutex
	heldAt := map[string]int{} // data -> Held() when its handler ran
	var h *Handler
	h = newHandler(t, func(m jetstream.Msg) {
		mu.Lock()
		heldAt[string(m.Data())] = h.Held()
		mu.Unlock()
		rec.handle(m)
	}, newGate(t, throttle.Rate{Count: 1, Per: time.Second}, nil),
		WithKeyFunc(func(m jetstream.Msg) (string, error) { return m.Headers().Get("Key"), nil }),
		WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
	pub := func(data, key string) { e.publish(t, "jobs.mixed", data, nats.Header{"Key": []string{key}}) }
	pub("a1", "a")
	pub("a2", "a") // rejected on its only delivery: held for about 1 s
	for i := 1; i <= 5; i++ {
		pub(fmt.Sprintf("b%d", i), fmt.Sprintf("b%d", i))
	}
	consume(t, c, h.Handle)
	waitFor(t, 10*time.Second, "7 handled messages", func() bool { return rec.len() >= 7 })

	recs := rec.records()
	at := map[string]record{}
	for _, r := range recs {
		at[r.data] = r
	}
	if recs[len(recs)-1].data != "a2" {
		t.Errorf("last handled %q, want the held a2", recs[len(recs)-1].data)
	}
	if d := at["a2"].at.Sub(at["a1"].at); d < 900*time.Millisecond {
		t.Errorf("a2 handled %v after a1, want about 1s (the window)", d)
	}
	if at["a2"].delivered != 1 {
		t.Errorf("a2 handled on delivery %d, want 1", at["a2"].delivered)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i <= 5; i++ {
		// Run while a2 was held (not after it, blocked behind it).
		b := fmt.Sprintf("b%d", i)
		if heldAt[b] != 1 {
			t.Errorf("Held() = %d while %s ran, want 1: blocked behind the held a2", heldAt[b], b)
		}
	}
	time.Sleep(cfg.AckWait)
	if a := maxDeliveries.all(); len(a) > 0 {
		t.Errorf("MAX_DELIVERIES advisories: %v", a)
	}
	if n := h.heartbeats.Load(); n < 2 {
		t.Errorf("%d heartbeats for a message held 1s with AckWait 500ms", n)
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}

// tightest returns the shortest time spanned by k consecutive sorted
// timestamps.
func tightest(ts []time.Time, k int) time.Duration {
	best := time.Duration(1<<63 - 1)
	for i := 0; i+k-1 < len(ts); i++ {
		best = min(best, ts[i+k-1].Sub(ts[i]))
	}
	return best
}

// instantsLimiter is a window.Memory that records the instant of every
// admission as the window saw it. It serializes decisions so that the
// instant read by the window belongs to the decision that read it.
type instantsLimiter struct {
	*window.Memory
	mu      sync.Mutex
	clockMu sync.Mutex // the Memory's janitor reads the clock too
	last    time.Time
	admits  []time.Time
	units   []int // of each admission in admits
}

func newInstantsLimiter(t *testing.T, r throttle.Rate) *instantsLimiter {
	l := &instantsLimiter{}
	m, err := window.NewMemory(r, window.WithClock(throttle.ClockFunc(func() time.Time {
		now := time.Now()
		l.clockMu.Lock()
		l.last = now
		l.clockMu.Unlock()
		return now
	})))
	if err != nil {
		t.Fatal(err)
	}
	l.Memory = m
	return l
}

func (l *instantsLimiter) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, err := l.Memory.AllowN(ctx, key, n)
	if err == nil && d.Allowed {
		l.admits = append(l.admits, l.lastRead())
		l.units = append(l.units, n)
	}
	return d, err
}

// lastRead returns the clock's latest reading: the decision's, but for a
// janitor's sweep in between (every 5 s, µs later).
func (l *instantsLimiter) lastRead() time.Time {
	l.clockMu.Lock()
	defer l.clockMu.Unlock()
	return l.last
}

func (l *instantsLimiter) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, err := l.Memory.AllowID(ctx, key, n, id, horizon)
	if err == nil && d.Allowed {
		l.admits = append(l.admits, l.lastRead())
		l.units = append(l.units, n)
	}
	return d, err
}

// mostUnits returns the most units admitted in any window of w.
func (l *instantsLimiter) mostUnits(w time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	most := 0
	for _, t := range l.admits {
		sum := 0
		for j, u := range l.admits {
			if !u.Before(t) && u.Sub(t) < w {
				sum += l.units[j]
			}
		}
		most = max(most, sum)
	}
	return most
}

func (l *instantsLimiter) admitted() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.admits...)
}
