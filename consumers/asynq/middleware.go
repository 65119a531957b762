package asynqthrottle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/google/uuid"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/internal/fair"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// copyNamespace is the UUID namespace of the IDs of re-enqueued copies.
var copyNamespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte(ScopeName))

// CopyTaskID returns the ID the middleware gives the copy of the task with
// ID id when it re-enqueues it (a name-based UUID, version 5, of id). The ID
// is deterministic, so a task that runs again after its copy was enqueued
// (because asynq could not mark it done) finds the copy by its ID instead of
// enqueueing a second one.
func CopyTaskID(id string) string {
	return uuid.NewSHA1(copyNamespace, []byte(id)).String()
}

// Middleware returns an asynq.MiddlewareFunc that gates every task with g
// before the next handler runs: see NewHandler and the package
// documentation. asynq's ServeMux applies its middleware to every task
// anew; the handlers Middleware returns share one state (the fair shares,
// the reporting of store failures), so a ServeMux is fair across all its
// tasks.
func Middleware(g *throttle.Gate, opts ...Option) asynq.MiddlewareFunc {
	cfg := newConfig(opts)
	st := newState(cfg)
	return func(next asynq.Handler) asynq.Handler { return newHandler(next, g, cfg, st) }
}

// NewHandler returns an asynq.Handler that asks g to admit each task before
// h runs it. An admitted task runs h and returns its result. A rejected task
// does not run h: it returns a *RateLimitError for asynq to retry after the
// retry-after without counting a failure (this needs IsFailure and
// RetryDelayFunc in asynq.Config), except on its last attempt, where it is
// re-enqueued (WithClient) or waits in the handler; see the package
// documentation. A task that can never be admitted returns an error wrapping
// asynq.SkipRetry.
//
// The handler is safe for concurrent use. NewHandler does not panic: if h
// or g is nil, every call returns an error wrapping
// throttle.ErrInvalidOption (a genuine failure to asynq) without running
// anything.
func NewHandler(h asynq.Handler, g *throttle.Gate, opts ...Option) asynq.Handler {
	cfg := newConfig(opts)
	return newHandler(h, g, cfg, newState(cfg))
}

func newHandler(h asynq.Handler, g *throttle.Gate, cfg config, st *state) *handler {
	hd := &handler{
		next:  h,
		gate:  g,
		cfg:   cfg,
		state: st,
		tracer: cfg.tracerProvider.Tracer(ScopeName,
			trace.WithInstrumentationVersion(throttle.Version),
			trace.WithSchemaURL(semconv.SchemaURL)),
	}
	switch {
	case cfg.err != nil:
		hd.misconfig = cfg.err
	case h == nil:
		hd.misconfig = &throttle.OptionError{Field: "handler", Reason: "must not be nil"}
	case g == nil:
		hd.misconfig = &throttle.OptionError{Field: "Gate", Reason: "must not be nil"}
	}
	return hd
}

type handler struct {
	next      asynq.Handler
	gate      *throttle.Gate
	cfg       config
	tracer    trace.Tracer
	misconfig error
	*state
}

// state is what the handlers of one Middleware (or one NewHandler) share.
type state struct {
	storeErrs   throttle.StoreErrors         // rate limit of store failures reported
	sched       *fair.Scheduler              // fair shares of the handlers; nil without
	deferredIDs *lru.Cache[string, struct{}] // tasks the fair shares sent back (see processFair)
	recalls     recalls                      // deferred tasks to bring back sooner (WithInspector)
}

func newState(cfg config) *state {
	st := &state{}
	if n := cfg.fairHandlers(); n > 0 {
		st.sched, _ = fair.New(fair.Config{Handlers: n, Weight: cfg.weights})
		st.deferredIDs, _ = lru.New[string, struct{}](maxDeferred)
		st.recalls = recalls{inspector: cfg.inspector, byKey: map[string][]deferredTask{}}
	}
	return st
}

// taskInfo is what the asynq context says about the task being processed.
type taskInfo struct {
	id                string
	queue             string
	retried, maxRetry int
	hasRetry          bool // both retry counts are known
	start             time.Time
}

// last reports whether asynq would archive the task if the handler returned
// an error: its retry count has reached MaxRetry.
func (ti *taskInfo) last() bool { return ti.hasRetry && ti.retried >= ti.maxRetry }

// ProcessTask gates one task.
func (h *handler) ProcessTask(ctx context.Context, t *asynq.Task) (err error) {
	ti := taskInfo{start: time.Now()}
	ti.id, _ = asynq.GetTaskID(ctx)
	ti.queue, _ = asynq.GetQueueName(ctx)
	var ok1, ok2 bool
	ti.retried, ok1 = asynq.GetRetryCount(ctx)
	ti.maxRetry, ok2 = asynq.GetMaxRetry(ctx)
	ti.hasRetry = ok1 && ok2

	ctx, span := h.startSpan(ctx, t, &ti)
	// A panic in the wrapped handler goes on to asynq, which recovers it
	// and reports the file and line: end the span without recovering.
	returned := false
	defer func() {
		if !returned {
			span.SetStatus(codes.Error, "handler panicked")
		}
		span.End()
	}()
	err = h.process(ctx, span, t, &ti)
	returned = true
	return err
}

func (h *handler) process(ctx context.Context, span trace.Span, t *asynq.Task, ti *taskInfo) error {
	if h.misconfig != nil {
		err := fmt.Errorf("asynqthrottle: bad configuration: %w", h.misconfig)
		fail(span, err)
		return err
	}
	key, cost, err := h.request(ctx, t)
	if err != nil {
		return archive(span, err)
	}
	id := requestID(t, ti)
	if h.sched != nil {
		return h.processFair(ctx, span, t, ti, key, cost, id)
	}
	waits := 0
	for {
		d, err := h.admit(ctx, key, cost, id)
		if d.Err != nil {
			h.storeFailure(ctx, t, key, d)
		}
		at := time.Now()
		refused := false   // admitted, and refused an in-flight slot
		backedOff := false // admitted, and the handler returned Backoff
		switch {
		case err != nil && throttle.IsUsageError(err):
			return archive(span, err)
		case err != nil:
			// Only a done context: asynq sees it too and handles the task
			// as it would any timeout or cancellation.
			err = fmt.Errorf("asynqthrottle: admit: %w", err)
			fail(span, err)
			return err
		case d.Allowed:
			s, sd, ok := h.acquire(ctx, span, t, key, id)
			if !ok {
				// Admitted, but every slot of the key is held: back like a
				// rejection, and admitted again without a second charge
				// (same id) when it returns.
				d, at, refused = sd, time.Now(), true
				break
			}
			err := h.run(ctx, span, t, s)
			be := backoffOf(err)
			if be == nil {
				return err
			}
			// The partner said 429: pause the key for everyone, give back
			// the refused call's charge, and back like a rejection.
			d, backedOff = h.backoff(ctx, span, t, key, cost, id, be), true
			at = time.Now()
		case d.RetryAfter == throttle.Never:
			return archive(span, fmt.Errorf("%w: rejected with a retry-after of never", throttle.ErrInvalidCost))
		}
		rl := newRateLimitError(key, d, at)
		rl.slot, rl.backoff = refused, backedOff
		if waited, err := h.waitOut(ctx, span, t, ti, id, rl, at.Add(d.RetryAfter), d.Reserved, &waits); !waited {
			return err
		}
	}
}

// dispose records disposition on span and counts it for key in the Gate's
// throttle.dispositions.
func (h *handler) dispose(ctx context.Context, span trace.Span, key, disposition string) {
	span.SetAttributes(DispositionAttr.String(disposition))
	h.gate.CountDisposition(ctx, key, disposition)
}

// waitOut handles a task turned away (rl; it may run at until, on its
// reserved slot when reserved): putBack decides, and a task that waits
// here counts the wait on the span (waits) and sleeps until until. It
// reports whether the task waited, to be decided again; otherwise err is
// what asynq gets.
func (h *handler) waitOut(ctx context.Context, span trace.Span, t *asynq.Task, ti *taskInfo, id string, rl *RateLimitError, until time.Time, reserved bool, waits *int) (waited bool, err error) {
	if wait, err := h.putBack(ctx, span, t, ti, id, rl, until, reserved); !wait {
		return false, err
	}
	*waits++
	span.SetAttributes(WaitsAttr.Int(*waits))
	if *waits == 1 { // once per task, however often it asks again
		h.gate.CountDisposition(ctx, rl.Key, DispositionWait)
	}
	if err := sleepUntil(ctx, span, until, rl); err != nil {
		return false, err
	}
	return true, nil
}

// putBack decides what becomes of a task turned away (rl; it may run at
// until, on its reserved slot when reserved): it waits in the handler for
// a near reserved slot (a retry could not come back in time for it, in
// whole seconds and the check interval), and then wait is true; otherwise
// err is what asynq gets: rl, a retry, or, on the task's last attempt, the
// result of re-enqueueing a copy (WithClient), or rl with why it cannot
// be kept from being archived; without a client, a task on its last
// attempt waits in the handler.
func (h *handler) putBack(ctx context.Context, span trace.Span, t *asynq.Task, ti *taskInfo, id string, rl *RateLimitError, until time.Time, reserved bool) (wait bool, err error) {
	if reserved && rl.RetryIn <= h.cfg.maxWait && !pastDeadline(ctx, until) {
		return true, nil
	}
	if reserved {
		rl.returnAt = until.Add(-h.cfg.checkInterval)
	}
	if !ti.last() {
		h.dispose(ctx, span, rl.Key, DispositionRetry)
		return false, rl
	}
	if h.cfg.client != nil {
		return false, h.requeue(ctx, span, t, ti, id, rl)
	}
	// Last attempt, no client: wait for the retry-after, then decide
	// again.
	if dl, ok := ctx.Deadline(); ok && until.After(dl) {
		rl.Err = fmt.Errorf("rejected on its last attempt (retry %d of %d) and its deadline %v comes before the retry-after; asynq will archive it (use WithClient to re-enqueue instead)",
			ti.retried, ti.maxRetry, dl.Format(time.RFC3339))
		h.dispose(ctx, span, rl.Key, DispositionRetry)
		fail(span, rl)
		return false, rl
	}
	return true, nil
}

// sleepUntil waits in the handler until until, and returns rl with the
// context's error if ctx is done first.
func sleepUntil(ctx context.Context, span trace.Span, until time.Time, rl *RateLimitError) error {
	timer := time.NewTimer(time.Until(until))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		rl.Err = ctx.Err()
		span.SetAttributes(DispositionAttr.String(DispositionRetry))
		fail(span, rl)
		return rl
	case <-timer.C:
		return nil
	}
}

// IDHeader is the task header that carries the identity the Gate decides a
// task by, when it is not the task's own ID: a copy re-enqueued on its
// last attempt keeps its original's identity, and so its reservation.
const IDHeader = "queuethrottle-id"

// requestID returns the identity of t for Gate.AdmitID: its IDHeader, or
// its task ID ("" outside an asynq.Server).
func requestID(t *asynq.Task, ti *taskInfo) string {
	if id := t.Headers()[IDHeader]; id != "" {
		return id
	}
	return ti.id
}

// admit asks the Gate, by id when there is one.
func (h *handler) admit(ctx context.Context, key string, cost int, id string) (throttle.Decision, error) {
	if id == "" {
		return h.gate.Admit(ctx, key, cost)
	}
	return h.gate.AdmitID(ctx, key, cost, id)
}

// pastDeadline reports whether ctx ends before t.
func pastDeadline(ctx context.Context, t time.Time) bool {
	dl, ok := ctx.Deadline()
	return ok && t.After(dl)
}

// request derives the key and cost of t.
func (h *handler) request(ctx context.Context, t *asynq.Task) (string, int, error) {
	key, err := h.cfg.keyFunc(ctx, t)
	if err != nil {
		return "", 0, fmt.Errorf("%w: key function: %w", throttle.ErrInvalidKey, err)
	}
	cost := 1
	if h.cfg.costFunc != nil {
		if cost, err = h.cfg.costFunc(ctx, t); err != nil {
			return "", 0, fmt.Errorf("%w: cost function: %w", throttle.ErrInvalidCost, err)
		}
	}
	return key, cost, nil
}

// requeue enqueues a copy of t, rejected on its last attempt, to run once
// rl's retry-after has passed, and returns nil (asynq marks the original
// done) once the copy is enqueued, or rl with the enqueue error.
func (h *handler) requeue(ctx context.Context, span trace.Span, t *asynq.Task, ti *taskInfo, id string, rl *RateLimitError) error {
	// The scheduled set is scored in whole seconds like the retry set:
	// process at the retry instant rounded up to a whole second, or a
	// little before a reserved slot.
	processAt := ceilSecond(rl.decidedAt.Add(rl.RetryIn))
	if !rl.returnAt.IsZero() {
		processAt = rl.returnAt
	}
	opts := []asynq.Option{
		asynq.ProcessAt(processAt),
		asynq.MaxRetry(max(ti.maxRetry-ti.retried, 0)),
	}
	if ti.queue != "" {
		opts = append(opts, asynq.Queue(ti.queue))
	}
	if ti.id != "" {
		opts = append(opts, asynq.TaskID(CopyTaskID(ti.id)))
	}
	opts = append(opts, deadlineOptions(ctx, ti.start)...)
	headers := t.Headers()
	if id != "" && (rl.Decision.Reserved || rl.slot || rl.backoff) {
		// The copy claims its original's reservation, or its admission
		// when only an in-flight slot was refused or the handler backed
		// off.
		headers = maps.Clone(headers)
		if headers == nil {
			headers = map[string]string{}
		}
		headers[IDHeader] = id
	}
	info, err := h.cfg.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers), opts...)
	switch {
	case err == nil:
		span.SetAttributes(CopyIDAttr.String(info.ID))
		h.dispose(ctx, span, rl.Key, DispositionRequeued)
		return nil
	case errors.Is(err, asynq.ErrTaskIDConflict):
		// A copy with this ID exists: an earlier run of this task enqueued
		// it and could not be marked done.
		span.SetAttributes(CopyIDAttr.String(CopyTaskID(ti.id)))
		h.dispose(ctx, span, rl.Key, DispositionRequeued)
		return nil
	}
	rl.Err = fmt.Errorf("rejected on its last attempt (retry %d of %d) and re-enqueue failed: %w", ti.retried, ti.maxRetry, err)
	h.dispose(ctx, span, rl.Key, DispositionRetry)
	fail(span, rl)
	return rl
}

// deadlineOptions returns the Timeout or Deadline option that gives a copy
// of the task the time limit the original had, read from ctx.Deadline(). The
// asynq processor computes that deadline as now + Timeout (Timeout in whole
// seconds, so the deadline has the sub-second part of now) or as the task's
// Deadline (a whole Unix second, as are the deadlines of tasks with both).
// So a deadline on a whole second is kept as a Deadline; any other becomes a
// Timeout of the time left since the handler started, rounded up to a whole
// second, which recovers the original Timeout unless the handlers before
// this one took a second or more. Without a deadline (not run by an
// asynq.Server) no option is returned: asynq's default applies.
func deadlineOptions(ctx context.Context, start time.Time) []asynq.Option {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	if dl.Nanosecond() == 0 {
		return []asynq.Option{asynq.Deadline(dl)}
	}
	left := max(dl.Sub(start), time.Second)
	if r := left % time.Second; r != 0 {
		left += time.Second - r
	}
	return []asynq.Option{asynq.Timeout(left)}
}

// archive returns err, the error of a task that can never be admitted,
// wrapping asynq.SkipRetry so that asynq archives it at once.
func archive(span trace.Span, err error) error {
	err = fmt.Errorf("asynqthrottle: task can never be admitted: %w: %w", err, asynq.SkipRetry)
	span.SetAttributes(DispositionAttr.String(DispositionArchive))
	fail(span, err)
	return err
}

func fail(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// startSpan extracts the producer's trace context from the task headers and
// starts the process span as its child.
func (h *handler) startSpan(ctx context.Context, t *asynq.Task, ti *taskInfo) (context.Context, trace.Span) {
	ctx = h.cfg.propagators.Extract(ctx, headerCarrier(t.Headers()))
	dest := ti.queue
	if dest == "" {
		dest = t.Type()
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		semconv.MessagingSystemKey.String(MessagingSystem),
		semconv.MessagingDestinationName(dest),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingMessageBodySize(len(t.Payload())),
		TaskTypeAttr.String(t.Type()),
	)
	if ti.id != "" {
		attrs = append(attrs, semconv.MessagingMessageID(ti.id))
	}
	if ti.hasRetry {
		attrs = append(attrs, RetryCountAttr.Int(ti.retried), MaxRetryAttr.Int(ti.maxRetry))
	}
	return h.tracer.Start(ctx, SpanNamePrefix+dest,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...))
}
