package natsthrottle

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/queuethrottle/queuethrottle/internal/natsserver"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	streamName   = "JOBS"
	consumerName = "workers"
)

// env is one embedded nats-server with a stream JOBS on "jobs.>".
type env struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := natsserver.Run(t)
	nc, js := natsserver.Connect(t, s)
	natsserver.Stream(t, js, streamName, "jobs.>")
	return &env{nc: nc, js: js}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// consumer creates the durable consumer "workers" with cfg (name and ack
// policy filled in).
func (e *env) consumer(t *testing.T, cfg jetstream.ConsumerConfig) jetstream.Consumer {
	t.Helper()
	cfg.Durable = consumerName
	cfg.AckPolicy = jetstream.AckExplicitPolicy
	c, err := e.js.CreateOrUpdateConsumer(testCtx(t), streamName, cfg)
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	return c
}

// consume starts c.Consume(h), stopped in t.Cleanup.
func consume(t *testing.T, c jetstream.Consumer, h jetstream.MessageHandler) {
	t.Helper()
	cc, err := c.Consume(h)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	t.Cleanup(func() {
		cc.Stop()
		select {
		case <-cc.Closed():
		case <-time.After(5 * time.Second):
			t.Error("consume context not closed within 5s")
		}
	})
}

// publish publishes a message on subj with headers hdr (may be nil) and
// returns its stream sequence.
func (e *env) publish(t *testing.T, subj string, data string, hdr nats.Header) uint64 {
	t.Helper()
	m := &nats.Msg{Subject: subj, Data: []byte(data), Header: hdr}
	ack, err := e.js.PublishMsg(testCtx(t), m)
	if err != nil {
		t.Fatalf("publish %s: %v", subj, err)
	}
	return ack.Sequence
}

// advisories collects JetStream advisories on subject (a wildcard).
type advisories struct {
	mu   sync.Mutex
	msgs []map[string]any
}

func (e *env) watch(t *testing.T, subject string) *advisories {
	t.Helper()
	a := &advisories{}
	sub, err := e.nc.Subscribe(subject, func(m *nats.Msg) {
		var v map[string]any
		_ = json.Unmarshal(m.Data, &v)
		a.mu.Lock()
		a.msgs = append(a.msgs, v)
		a.mu.Unlock()
	})
	if err != nil {
		t.Fatalf("subscribe %s: %v", subject, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *advisories) all() []map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]map[string]any(nil), a.msgs...)
}

const (
	maxDeliveriesAdvisory = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"
	nakAdvisory           = "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.>"
	termAdvisory          = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.>"
)

// record is what the test handler saw of one handled message.
type record struct {
	seq       uint64
	delivered uint64
	subject   string
	data      string
	at        time.Time
	ctx       context.Context
}

// recorder is a wrapped handler that records and acks every message. It
// is safe for concurrent use, as the wrapped handler must be.
type recorder struct {
	mu   sync.Mutex
	recs []record
	ack  bool
}

func newRecorder() *recorder { return &recorder{ack: true} }

func (r *recorder) handle(msg jetstream.Msg) {
	at := time.Now()
	rec := record{at: at, subject: msg.Subject(), data: string(msg.Data()), ctx: ContextFromMsg(msg)}
	if md, err := msg.Metadata(); err == nil {
		rec.seq, rec.delivered = md.Sequence.Stream, md.NumDelivered
	}
	if r.ack {
		_ = msg.Ack()
	}
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func (r *recorder) records() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.recs...)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// waitFor polls cond every 10 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// errs collects the errors reported to the error handler.
type errs struct {
	mu   sync.Mutex
	list []error
}

func (e *errs) handle(_ jetstream.Msg, err error) {
	e.mu.Lock()
	e.list = append(e.list, err)
	e.mu.Unlock()
}

func (e *errs) all() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.list...)
}

func (e *errs) matching(target error) int {
	n := 0
	for _, err := range e.all() {
		if errors.Is(err, target) {
			n++
		}
	}
	return n
}

// newGate returns a Gate over an in-memory sliding window of r, tracing to
// tp when not nil.
func newGate(t *testing.T, r throttle.Rate, tp *sdktrace.TracerProvider) *throttle.Gate {
	t.Helper()
	lim, err := window.NewMemory(r)
	if err != nil {
		t.Fatal(err)
	}
	var opts []throttle.Option
	if tp != nil {
		opts = append(opts, throttle.WithTracerProvider(tp))
	}
	g, err := throttle.NewGate(lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func newTracing(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, sr
}

// newHandler builds a Handler and closes it in t.Cleanup.
func newHandler(t *testing.T, next jetstream.MessageHandler, g *throttle.Gate, opts ...Option) *Handler {
	t.Helper()
	h, err := New(next, g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

// maxInWindow returns the most timestamps in any half-open interval of
// length w.
func maxInWindow(ts []time.Time, w time.Duration) int {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi].Sub(ts[lo]) >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

func ackPending(t *testing.T, c jetstream.Consumer) int {
	t.Helper()
	info, err := c.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.NumAckPending
}
