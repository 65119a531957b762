package natsthrottle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/internal/fair"
	"github.com/queuethrottle/queuethrottle/internal/inflight"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// ErrClosed is reported to the error handler for a message that was
// rejected on its last delivery while the Handler was closing (or when
// Close gave up holding it): it is left unacknowledged, and the server
// will not deliver it to this consumer again after AckWait (it stays in
// the stream).
var ErrClosed = errors.New("natsthrottle: handler closed")

// errorRetry is the retry-after used when the Gate could not decide and
// gave no usable retry-after (Never).
const errorRetry = time.Second

// Handler gates a jetstream.MessageHandler with a throttle.Gate. Its
// Handle method is a jetstream.MessageHandler to pass to Consume. It is
// safe for concurrent use. The zero Handler is not usable: every message
// it sees is held unhandled, as for a bad configuration (see NewHandler);
// use New.
type Handler struct {
	next      jetstream.MessageHandler
	gate      *throttle.Gate
	cfg       config
	tracer    trace.Tracer
	heartbeat time.Duration
	decision  time.Duration // bound of every Gate.Admit

	mu      sync.Mutex
	closing bool
	wg      sync.WaitGroup // held-message goroutines, whole lifetime
	holding sync.WaitGroup // held-message goroutines, until they stop holding
	stop    chan struct{}  // closed when Close gives up waiting
	sem     chan struct{}  // WithConcurrency > 1: one token per message being decided
	stopped sync.Once

	held       atomic.Int64 // messages in the hold loop
	waiting    atomic.Int64 // messages waiting in process for a near slot
	heartbeats atomic.Int64 // InProgress sent for held messages

	storeErrs   throttle.StoreErrors         // rate limit of store failures reported
	waiters     deliveries                   // the newest delivery of each message waiting here
	sched       *fair.Scheduler              // the fair shares of the WithConcurrency handlers; nil without
	deferredIDs *lru.Cache[string, struct{}] // messages the fair shares sent back (see deferred)
}

// New returns a Handler that gates next with g. next and g are required;
// errors wrap throttle.ErrInvalidOption and name the field. See the package
// documentation for what happens to each message.
func New(next jetstream.MessageHandler, g *throttle.Gate, opts ...Option) (*Handler, error) {
	h, err := build(next, g, opts)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// NewHandler returns a jetstream.MessageHandler that gates h with g: New
// without the error return and without Close.
//
// NewHandler cannot return an error, and it does not panic. If h or g is
// nil or an option is invalid, the returned handler admits nothing and
// loses nothing: a NAK would use one of the message's MaxDeliver
// deliveries, so instead it holds every message, unhandled, on a goroutine
// of its own with InProgress heartbeats (every second, or a third of the
// AckWait when WithConsumerConfig or WithConsumer was read, or the
// WithHeartbeatInterval), which never use a delivery. It reports the
// configuration error (wrapping throttle.ErrInvalidOption) once per
// message, to the error handler, to the logger and on the message's span.
// A message is held until an InProgress fails: the connection is closed
// or the message was acknowledged through the same jetstream.Msg. So a
// misconfigured consumer stalls, up to its MaxAckPending messages, instead
// of losing them; after a restart each message comes back after AckWait,
// on its next delivery. New reports the same errors at start-up: prefer
// it.
func NewHandler(h jetstream.MessageHandler, g *throttle.Gate, opts ...Option) jetstream.MessageHandler {
	hd, err := build(h, g, opts)
	if err != nil {
		return hd.misconfigured(err)
	}
	return hd.Handle
}

// build returns a Handler even on error, configured as far as the options
// allowed, so that a configuration error can be reported.
func build(next jetstream.MessageHandler, g *throttle.Gate, opts []Option) (*Handler, error) {
	cfg, err := newConfig(opts)
	h := &Handler{
		next:      next,
		gate:      g,
		cfg:       cfg,
		heartbeat: cfg.heartbeatInterval(),
		decision:  cfg.decisionTimeout(),
		stop:      make(chan struct{}),
		tracer: cfg.tracerProvider.Tracer(ScopeName,
			trace.WithInstrumentationVersion(throttle.Version),
			trace.WithSchemaURL(semconv.SchemaURL)),
	}
	if cfg.concurrency > 1 {
		h.sem = make(chan struct{}, cfg.concurrency)
	}
	if cfg.concurrency >= 1 && !cfg.noFair {
		h.sched, _ = fair.New(fair.Config{Handlers: cfg.concurrency, Weight: cfg.weights})
		h.deferredIDs = newDeferredSet()
	}
	switch {
	case err != nil:
	case next == nil:
		err = &throttle.OptionError{Field: "handler", Reason: "must not be nil"}
	case g == nil:
		err = &throttle.OptionError{Field: "Gate", Reason: "must not be nil"}
	}
	return h, err
}

// misconfigured returns the handler of a bad configuration: it reports
// err once per message and holds the message with InProgress on a
// goroutine of its own until an InProgress fails (see NewHandler).
func (h *Handler) misconfigured(err error) jetstream.MessageHandler {
	every := h.cfg.configErrorHeartbeat()
	return func(msg jetstream.Msg) {
		if msg == nil {
			return
		}
		ctx, span := h.startSpan(msg)
		span.SetAttributes(DispositionAttr.String(DispositionStalled))
		h.fail(ctx, span, msg, err)
		span.End()
		go h.stall(ctx, msg, every)
	}
}

// stall sends msg InProgress every interval until that fails, which ends
// the goroutine: the connection is closed, or the message was acknowledged.
func (h *Handler) stall(ctx context.Context, msg jetstream.Msg, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		if err := msg.InProgress(); err != nil {
			if h.cfg.logger != nil {
				h.cfg.logger.DebugContext(ctx, "natsthrottle: stopped holding a message of a misconfigured handler",
					slog.String("subject", msg.Subject()), slog.Any("error", err))
			}
			return
		}
		<-ticker.C
	}
}

// Held returns how many messages are held right now: rejected on their last
// delivery and waiting on their own goroutine for their retry-after.
func (h *Handler) Held() int { return int(h.held.Load()) }

// Waiting returns how many messages wait in process right now for a
// reserved slot at most WithMaxWait ahead.
func (h *Handler) Waiting() int { return int(h.waiting.Load()) }

// Handle gates one message; it is a jetstream.MessageHandler. It decides
// on the calling goroutine (with WithConcurrency, on one of that many
// goroutines, waiting while all are busy), waiting at most the decision
// timeout for the Gate, and returns once the message is handled, NAKed,
// terminated, or handed to a goroutine that holds it or waits for its
// near slot (see the package documentation); it never waits for a
// retry-after.
func (h *Handler) Handle(msg jetstream.Msg) {
	if msg == nil {
		return
	}
	if h.next == nil || h.gate == nil || h.tracer == nil {
		// The zero Handler (New never returns one without these).
		zero, _ := build(nil, nil, nil)
		zero.misconfigured(&throttle.OptionError{Field: "Handler", Reason: "not built by New (zero Handler)"})(msg)
		return
	}
	if h.sched != nil || h.sem == nil || !h.startAsync() {
		h.handle(msg, time.Now())
		return
	}
	arrived := time.Now()
	go func() {
		defer h.wg.Done()
		defer func() { <-h.sem }()
		h.handle(msg, arrived)
	}()
}

// startAsync takes one of the WithConcurrency goroutines, waiting for one
// to be free, and reports false when the Handler is closing (the message
// is then decided on the caller's goroutine).
func (h *Handler) startAsync() bool {
	h.sem <- struct{}{}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		<-h.sem
		return false
	}
	h.wg.Add(1)
	return true
}

// handle decides msg, which reached Handle at arrived.
func (h *Handler) handle(msg jetstream.Msg, arrived time.Time) {
	ctx, span := h.startSpan(msg)
	key, cost, err := h.request(msg)
	if err != nil {
		h.terminate(ctx, span, msg, err)
		span.End()
		return
	}
	r := &request{msg: msg, key: key, cost: cost, arrived: arrived}
	r.id, r.waitKey, r.delivery = requestID(msg)
	h.deliveryArrived(r)
	if h.sched != nil {
		h.arrive(ctx, span, r)
		return
	}
	h.decide(ctx, span, r)
}

// request is a message being decided, with its key, cost and identity.
type request struct {
	msg      jetstream.Msg
	key      string
	cost     int
	id       string    // "" when the message has no metadata
	waitKey  string    // its message among waiting deliveries (see deliveries); "" without metadata
	delivery uint64    // its NumDelivered (0 without metadata)
	arrived  time.Time // when this delivery reached Handle
	keyed    bool      // pulled by a KeyedConsumer: put back by NAK, never waiting outside its key's turn
	counted  string    // the disposition counted for it in process (see dispose), "" before
}

// dispose counts, once per message, that r stays in process as
// disposition (DispositionWait or DispositionHold) in the Gate's
// throttle.dispositions: however often it asks again, and a wait that
// becomes a hold counts once as each.
func (h *Handler) dispose(ctx context.Context, r *request, disposition string) {
	if r.counted != disposition {
		r.counted = disposition
		h.gate.CountDisposition(ctx, r.key, disposition)
	}
}

// requestID is the identity the Gate decides msg by: its stream and
// stream sequence, the same on every delivery and for every consumer of
// the stream, or "" without metadata; waitKey, the message's key among
// waiting deliveries: the id per consumer (one Handler may serve several
// consumers of a stream, each delivering on its own); and the count of
// the delivery.
func requestID(msg jetstream.Msg) (id, waitKey string, delivery uint64) {
	md, err := msg.Metadata()
	if err != nil {
		return "", "", 0
	}
	id = md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10)
	return id, md.Consumer + "\x00" + id, md.NumDelivered
}

// decide makes one decision for r and acts on it: runs the handler,
// terminates, NAKs, or hands the message to a goroutine that waits for a
// near slot or holds it on its last delivery. It ends span unless a
// goroutine took the message.
func (h *Handler) decide(ctx context.Context, span trace.Span, r *request) {
	v := h.judge(ctx, span, r)
	switch {
	case v.done:
		span.End()
		return
	case v.run:
		h.run(ctx, span, r, v.slot)
		span.End()
		return
	}
	retry := v.retry
	if v.reserved && retry <= h.cfg.maxWait && h.startWait(r, retry) {
		go h.wait(ctx, span, r, retry)
		return
	}
	if !h.lastDelivery(r.msg) {
		if v.reserved {
			// The slot is the message's own: no jitter (the herd a jitter
			// spreads is already spread). The server may redeliver late
			// (with more than 1,024 messages pending it skips its
			// redelivery check while acks are queued): ask for the message
			// half of WithMaxWait early, and wait in process for the rest.
			h.nak(ctx, span, r, DispositionNak, retry-h.cfg.maxWait/2, false)
		} else {
			h.nak(ctx, span, r, DispositionNak, retry, true)
		}
		span.End()
		return
	}

	// Last delivery: a NAK would make the server drop the message for this
	// consumer (MaxDeliver), so hold it instead, on its own goroutine.
	h.startHold(ctx, span, r, throttle.Decision{RetryAfter: retry})
}

// startHold holds r, on its last delivery, on a goroutine of its own until
// d.RetryAfter has passed and it is admitted (see hold); when the Handler
// is closing it abandons r instead and ends span.
func (h *Handler) startHold(ctx context.Context, span trace.Span, r *request, d throttle.Decision) {
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		h.abandon(ctx, span, r.msg)
		span.End()
		return
	}
	h.wg.Add(1)
	h.holding.Add(1)
	h.held.Add(1)
	h.mu.Unlock()
	h.waitStarted(r)
	go h.hold(ctx, span, r, d)
}

// startWait registers a goroutine that waits d in process for r's slot.
// It reports false when the Handler is closing, or when the delivery would
// then have been kept past half its ack wait: a message whose slot keeps
// moving goes back to the broker, long before the server would redeliver
// it.
func (h *Handler) startWait(r *request, d time.Duration) bool {
	if time.Since(r.arrived)+d > h.cfg.shortestAckWait()/2 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return false
	}
	h.wg.Add(1)
	h.waiting.Add(1)
	h.waitStarted(r)
	return true
}

// wait sleeps until r's reserved slot, a few milliseconds ahead, and
// decides again; Close cutting it short NAKs the message to its slot. The
// message's AckWait restarts as the wait starts (InProgress).
func (h *Handler) wait(ctx context.Context, span trace.Span, r *request, d time.Duration) {
	defer h.wg.Done()
	defer h.waiting.Add(-1)
	span.SetAttributes(WaitedAttr.Bool(true))
	h.dispose(ctx, r, DispositionWait)
	// Its AckWait restarts now: how long it sat in the client's buffer
	// before Handle is not known here, and that, the wait and the wrapped
	// handler's run must not add up to a redelivery. (If this fails the
	// connection is down, and so will be what follows: reported there.)
	_ = r.msg.InProgress()
	timer := time.NewTimer(d)
	start := time.Now()
	select {
	case <-timer.C:
	case <-h.stop:
		timer.Stop()
		if h.superseded(r) {
			h.supersede(ctx, span, r) // a NAK would bring back a message the newer delivery has
		} else {
			h.nak(ctx, span, r, DispositionNak, max(d-time.Since(start), time.Millisecond), false)
		}
		h.waitDone(r)
		span.End()
		return
	}
	// Still registered while deciding: a newer delivery that arrives
	// meanwhile is seen before the handler runs (decided).
	defer h.waitDone(r)
	if h.superseded(r) {
		h.supersede(ctx, span, r)
		span.End()
		return
	}
	if h.sched != nil && !r.keyed {
		h.schedule(ctx, span, r) // back into its key's turn
		return
	}
	h.decide(ctx, span, r)
}

// verdict is what r's limits said: run it (with its in-flight slot, nil
// without one), or it is done with (terminated, superseded), or ask again
// after retry.
type verdict struct {
	run      bool
	slot     *inflight.Slot
	done     bool
	retry    time.Duration
	reserved bool // the rejection reserved the message's own slot
	refused  bool // its in-flight limit refused a slot: one may come back when a handler of the key ends
}

// judge asks r's in-flight limit for a slot (WithInFlight), then the Gate
// (rate), so that a message that cannot get a slot is never charged by
// the rate; a slot taken for a message the Gate then rejects is released.
// (With fair shares the rate decides first, as the message starts waiting
// for its handler, and the slot once it has one: see schedule.)
func (h *Handler) judge(ctx context.Context, span trace.Span, r *request) verdict {
	s, retry, refused, ok := h.acquire(ctx, span, r)
	if !ok {
		return verdict{retry: retry, refused: refused}
	}
	v := h.rate(ctx, span, r)
	if v.run {
		v.slot = s
	} else {
		s.Release()
	}
	return v
}

// rate asks the Gate for r: run means admitted. It handles a usage error
// or a never-admissible rejection (Term), and a delivery superseded while
// it waited.
func (h *Handler) rate(ctx context.Context, span trace.Span, r *request) verdict {
	d, err := h.admit(ctx, r)
	var v verdict
	switch {
	case err != nil && throttle.IsUsageError(err):
		h.terminate(ctx, span, r.msg, err)
		v.done = true
	case err != nil:
		// No decision within the decision timeout (the context's error):
		// retry after the Gate's degraded retry-after.
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("natsthrottle: no decision within the decision timeout of %v: %w", h.decision, err)
		} else {
			err = fmt.Errorf("natsthrottle: admit: %w", err)
		}
		h.fail(ctx, span, r.msg, err)
		v.retry = d.RetryAfter
		if d.RetryAfter < 0 || d.RetryAfter == throttle.Never {
			v.retry = errorRetry
		}
	case d.Allowed && h.superseded(r):
		// Admitted, but a newer delivery of the message arrived while this
		// one waited: that one runs (admitted again, free), not both.
		h.supersede(ctx, span, r)
		v.done = true
	case d.Allowed:
		v.run = true
	case d.RetryAfter == throttle.Never:
		h.terminate(ctx, span, r.msg, fmt.Errorf("%w: rejected with a retry-after of never", throttle.ErrInvalidCost))
		v.done = true
	default:
		v.retry, v.reserved = d.RetryAfter, d.Reserved
	}
	return v
}

// lastDelivery reports whether the server would not redeliver msg after a
// NAK: MaxDeliver is set and NumDelivered has reached it. Without metadata
// the delivery count is unknown and msg is treated as not the last.
func (h *Handler) lastDelivery(msg jetstream.Msg) bool {
	if h.cfg.maxDeliver <= 0 {
		return false
	}
	md, err := msg.Metadata()
	return err == nil && md.NumDelivered >= uint64(h.cfg.maxDeliver)
}

// admit asks the Gate for r, by its id when it has one, bounded by the
// decision timeout.
func (h *Handler) admit(ctx context.Context, r *request) (throttle.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, h.decision)
	defer cancel()
	var d throttle.Decision
	var err error
	if r.id == "" {
		d, err = h.gate.Admit(ctx, r.key, r.cost)
	} else {
		d, err = h.gate.AdmitID(ctx, r.key, r.cost, r.id)
	}
	if d.Err != nil {
		h.storeFailure(ctx, r, d)
	}
	return d, err
}

// request derives the key and cost of msg.
func (h *Handler) request(msg jetstream.Msg) (string, int, error) {
	key, err := h.cfg.keyFunc(msg)
	if err != nil {
		return "", 0, fmt.Errorf("%w: key function: %w", throttle.ErrInvalidKey, err)
	}
	cost := 1
	if h.cfg.costFunc != nil {
		if cost, err = h.cfg.costFunc(msg); err != nil {
			return "", 0, fmt.Errorf("%w: cost function: %w", throttle.ErrInvalidCost, err)
		}
	}
	return key, cost, nil
}

// hold keeps msg, on its last delivery, from the server's redelivery with
// InProgress heartbeats, and asks the Gate again each time its retry-after
// has passed, until it is admitted (then runs the wrapped handler), can
// never be admitted (Term), or Close gives up (left unacknowledged).
func (h *Handler) hold(ctx context.Context, span trace.Span, r *request, d throttle.Decision) {
	msg := r.msg
	defer h.wg.Done()
	defer span.End()
	defer h.waitDone(r)
	span.SetAttributes(HeldAttr.Bool(true))
	h.dispose(ctx, r, DispositionHold)
	if h.cfg.logger != nil {
		h.cfg.logger.DebugContext(ctx, "natsthrottle: holding message on its last delivery",
			slog.String("subject", msg.Subject()), slog.Duration("retry_after", d.RetryAfter))
	}
	ticker := time.NewTicker(h.heartbeat)
	defer ticker.Stop()
	var lastBeat time.Time
	beat := func() {
		h.inProgress(ctx, span, msg)
		lastBeat = time.Now()
		ticker.Reset(h.heartbeat)
	}
	// The message may have waited in the client's buffer: renew its ack
	// timer at once.
	beat()
	timer := time.NewTimer(h.delay(d.RetryAfter))
	defer timer.Stop()
	holding := true
	release := func() {
		if holding {
			holding = false
			h.held.Add(-1)
			h.holding.Done()
		}
	}
	defer release()
	for {
		select {
		case <-h.stop:
			h.abandon(ctx, span, msg)
			return
		case <-ticker.C:
			beat()
			continue
		case <-timer.C:
		}
		select {
		case <-h.stop:
			h.abandon(ctx, span, msg)
			return
		default:
		}
		if h.superseded(r) {
			h.supersede(ctx, span, r)
			return
		}
		if time.Since(lastBeat)+h.decisions() > h.heartbeat {
			// The decision may take up to the decision timeout (twice
			// with an in-flight limiter): no heartbeat may come later
			// than usual because of it.
			beat()
		}
		v := h.judge(ctx, span, r)
		switch {
		case v.done:
			return
		case v.run:
			// Admitted, with its slot: give the wrapped handler a full
			// AckWait.
			beat()
			release()
			h.run(ctx, span, r, v.slot)
			return
		}
		timer.Reset(h.delay(v.retry))
	}
}

// Close stops holding messages. Messages that arrive after Close and are
// rejected on their last delivery are not held: they are left
// unacknowledged and reported with ErrClosed. Close waits until every held
// message has been admitted and handled (or terminated), or until ctx is
// done; then the messages still held are given up: left unacknowledged,
// each reported with ErrClosed (the server will not deliver them to this
// consumer again once AckWait passes: they were on their last delivery),
// and Close returns ctx.Err(), up to a decision timeout later if a held
// message was being decided. A wrapped handler already running is not
// interrupted and may still be running when Close returns after ctx is
// done. Stop or drain the ConsumeContext first. Close is safe to call more
// than once.
func (h *Handler) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	h.stopped.Do(func() {
		if h.stop != nil { // nil in the zero Handler, which holds nothing
			close(h.stop)
		}
	})
	// Goroutines still holding see stop at once, or after the decision
	// they are waiting for (at most the decision timeout); wait for them,
	// not for wrapped handlers already running.
	h.holding.Wait()
	return ctx.Err()
}

// delay is retryAfter plus jitter.
func (h *Handler) delay(retryAfter time.Duration) time.Duration {
	j := min(time.Duration(float64(retryAfter)*h.cfg.jitterFraction), h.cfg.jitterMax)
	if j > 0 {
		retryAfter += rand.N(j + 1)
	}
	return retryAfter
}

// nak NAKs r's message with retryAfter (plus jitter), counted as
// disposition (DispositionNak, or DispositionDeferred) in the Gate's
// throttle.dispositions.
func (h *Handler) nak(ctx context.Context, span trace.Span, r *request, disposition string, retryAfter time.Duration, jitter bool) {
	span.SetAttributes(DispositionAttr.String(DispositionNak))
	h.gate.CountDisposition(ctx, r.key, disposition)
	d := retryAfter
	if jitter {
		d = h.delay(retryAfter)
	}
	if err := r.msg.NakWithDelay(d); err != nil {
		h.fail(ctx, span, r.msg, fmt.Errorf("natsthrottle: nak with delay %v: %w", d, err))
	}
}

func (h *Handler) inProgress(ctx context.Context, span trace.Span, msg jetstream.Msg) {
	h.heartbeats.Add(1)
	if err := msg.InProgress(); err != nil {
		h.fail(ctx, span, msg, fmt.Errorf("natsthrottle: in progress: %w", err))
	}
}

// terminate reports cause and terminates msg, which can never be admitted.
func (h *Handler) terminate(ctx context.Context, span trace.Span, msg jetstream.Msg, cause error) {
	span.SetAttributes(DispositionAttr.String(DispositionTerm))
	h.fail(ctx, span, msg, cause)
	if err := msg.TermWithReason(termReason(cause)); err != nil {
		h.fail(ctx, span, msg, fmt.Errorf("natsthrottle: term: %w", err))
	}
}

// termReason is the reason sent with Term, shown in the server's
// MSG_TERMINATED advisory: the error text, cut to 200 bytes.
func termReason(err error) string {
	s := "natsthrottle: never admissible: " + err.Error()
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

func (h *Handler) abandon(ctx context.Context, span trace.Span, msg jetstream.Msg) {
	span.SetAttributes(DispositionAttr.String(DispositionAbandoned))
	n := "unknown"
	if md, err := msg.Metadata(); err == nil {
		n = strconv.FormatUint(md.NumDelivered, 10)
	}
	h.fail(ctx, span, msg, fmt.Errorf("%w: message rejected on its last delivery (%s of MaxDeliver %d) left unacknowledged",
		ErrClosed, n, h.cfg.maxDeliver))
}

// fail reports err for msg: span, error handler, logger.
func (h *Handler) fail(ctx context.Context, span trace.Span, msg jetstream.Msg, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	if h.cfg.onError != nil {
		h.cfg.onError(msg, err)
	}
	if h.cfg.logger != nil {
		h.cfg.logger.ErrorContext(ctx, "natsthrottle: message error",
			slog.String("subject", msg.Subject()), slog.Any("error", err))
	}
}

// startSpan extracts the producer's trace context from the headers and
// starts the process span as its child.
func (h *Handler) startSpan(msg jetstream.Msg) (context.Context, trace.Span) {
	ctx := h.cfg.propagators.Extract(context.Background(), HeaderCarrier(msg.Headers()))
	subject := msg.Subject()
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs,
		semconv.MessagingSystemKey.String("nats"),
		semconv.MessagingDestinationName(subject),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingMessageBodySize(len(msg.Data())),
	)
	if md, err := msg.Metadata(); err == nil {
		attrs = append(attrs,
			semconv.MessagingMessageID(strconv.FormatUint(md.Sequence.Stream, 10)),
			semconv.MessagingConsumerGroupName(md.Consumer),
			NumDeliveredAttr.Int64(int64(md.NumDelivered)),
		)
	}
	return h.tracer.Start(ctx, SpanNamePrefix+subject,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...))
}

// tracedMsg is the message passed to the wrapped handler: the original,
// carrying the context of its process span and the message's in-flight
// slot (nil without one), released by an acknowledgement (see inflight.go).
type tracedMsg struct {
	jetstream.Msg
	ctx  context.Context
	slot *inflight.Slot
	h    *Handler
	r    *request
	back backoff // Backoff
}

// ContextFromMsg returns the context of the process span of a message the
// Handler passed to the wrapped handler, so the handler's own spans become
// its children. For any other message it returns context.Background().
func ContextFromMsg(msg jetstream.Msg) context.Context {
	if m, ok := msg.(*tracedMsg); ok {
		return m.ctx
	}
	return context.Background()
}
