package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the Gate's tracer and meter.
const ScopeName = "github.com/queuethrottle/queuethrottle/throttle"

// Version is the version of this module, recorded as the instrumentation
// scope version.
const Version = "0.1.0"

// Gate makes admission decisions for consumers: it asks its Limiter, applies
// the FailurePolicy when the limiter cannot decide, and records every
// decision as one span, one increment of the decisions counter and one
// latency sample. A Gate is safe for concurrent use.
type Gate struct {
	limiter       Limiter
	ids           IDLimiter // limiter, when it implements IDLimiter
	horizon       time.Duration
	algorithm     string
	limit         int
	policy        FailurePolicy
	quotaPolicy   FailurePolicy // for errors wrapping ErrInvalidQuota
	degradedRetry time.Duration

	// traced and metered are false for the OpenTelemetry no-op providers,
	// whose spans and instruments would record nothing: the Gate then
	// skips them, and the clock reads and allocations they cost.
	traced, metered bool
	tracer          trace.Tracer
	decisions       metric.Int64Counter
	duration        metric.Float64Histogram
	storeErrors     metric.Int64Counter
	keysRefused     metric.Int64Counter
	slowStore       metric.Int64Counter
	dispositions    metric.Int64Counter

	// Metric options are indexed by outcome (see outcomes) and Source.
	// Precomputed option slices: a variadic call through an interface
	// would otherwise allocate its slice on every decision.
	startOpts   []trace.SpanStartOption
	addOpts     [3][SourceDegraded + 1][]metric.AddOption
	recordOpts  [3][SourceDegraded + 1][]metric.RecordOption
	storeErrOpt []metric.AddOption

	logger   *slog.Logger // nil: no logs
	failures failureLog
	aimd     *AIMD       // WithAIMD: Pause decreases the key's limit
	keyed    *keyMetrics // WithKeyMetrics: nil, no key attribute
}

// NewGate returns a Gate over l. The limiter is required; errors wrap
// ErrInvalidOption.
func NewGate(l Limiter, opts ...Option) (*Gate, error) {
	if l == nil {
		return nil, &OptionError{Field: "Limiter", Reason: "must not be nil"}
	}
	cfg := gateConfig{policy: FailClosed, quotaPolicy: FailClosed, degradedRetry: time.Second}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.tracerProvider == nil {
		cfg.tracerProvider = otel.GetTracerProvider()
	}
	if cfg.meterProvider == nil {
		cfg.meterProvider = otel.GetMeterProvider()
	}
	g := &Gate{limiter: l, policy: cfg.policy, quotaPolicy: cfg.quotaPolicy, degradedRetry: cfg.degradedRetry, algorithm: cfg.algorithmOverride, horizon: cfg.horizon, logger: cfg.logger, aimd: cfg.aimd, keyed: cfg.keyMetrics}
	g.ids, _ = l.(IDLimiter)
	if a, ok := l.(Algorithmer); ok && g.algorithm == "" {
		g.algorithm = a.Algorithm()
	}
	if g.horizon > 0 && g.ids == nil {
		name := fmt.Sprintf("%T", l)
		if g.algorithm != "" {
			name = g.algorithm + " (" + name + ")"
		}
		why := "it is not a throttle.IDLimiter"
		if a := allOf(l); a != nil {
			why = "its " + a.slotless + " is not a throttle.SlotLimiter (AllowIDAfter), so it cannot hold one slot in every part"
		}
		return nil, &OptionError{Field: "WithReservations", Reason: "the limiter " + name +
			" cannot reserve a slot: " + why + ", so every rejection would bounce; drop WithReservations, or use limiters with AllowID (window.Memory, window.Redis, bucket.Local, bucket.Redis)"}
	}
	if r, ok := l.(interface{ Rate() Rate }); ok {
		g.limit = r.Rate().Count
	}
	_, noopTracer := cfg.tracerProvider.(tracenoop.TracerProvider)
	_, noopMeter := cfg.meterProvider.(metricnoop.MeterProvider)
	g.traced, g.metered = !noopTracer, !noopMeter
	g.tracer = cfg.tracerProvider.Tracer(ScopeName, trace.WithInstrumentationVersion(Version))
	meter := cfg.meterProvider.Meter(ScopeName, metric.WithInstrumentationVersion(Version))
	var err error
	if g.decisions, err = meter.Int64Counter(DecisionsMetric,
		metric.WithUnit("{decision}"),
		metric.WithDescription("Admission decisions by outcome and source.")); err != nil {
		return nil, err
	}
	if g.duration, err = meter.Float64Histogram(DurationMetric,
		metric.WithUnit("s"),
		metric.WithDescription("Time to make one admission decision, including store round trips."),
		metric.WithExplicitBucketBoundaries(0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1)); err != nil {
		return nil, err
	}
	if g.storeErrors, err = meter.Int64Counter(StoreErrorsMetric,
		metric.WithUnit("{error}"),
		metric.WithDescription("Limiter store failures and timeouts; the failure policy decided instead.")); err != nil {
		return nil, err
	}
	if g.keysRefused, err = meter.Int64Counter(KeysRefusedMetric,
		metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions for new keys refused: the in-process limiter holds its most keys, all still limited.")); err != nil {
		return nil, err
	}
	if g.slowStore, err = meter.Int64Counter(SlowStoreMetric,
		metric.WithUnit("{error}"),
		metric.WithDescription("Store timeouts while the store's round trip is longer than the limiter's timeout: raise the timeout.")); err != nil {
		return nil, err
	}
	if g.dispositions, err = meter.Int64Counter(DispositionsMetric,
		metric.WithUnit("{message}"),
		metric.WithDescription("What the consumers did with messages not run at once: NAKed, waited in process, held, deferred, retried.")); err != nil {
		return nil, err
	}
	for allowed, outcome := range outcomes {
		for s := SourceUnknown; s <= SourceDegraded; s++ {
			set := metric.WithAttributeSet(attribute.NewSet(OutcomeAttr.String(outcome), SourceAttr.String(s.String())))
			g.addOpts[allowed][s] = []metric.AddOption{set}
			g.recordOpts[allowed][s] = []metric.RecordOption{set}
		}
	}
	g.storeErrOpt = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AlgorithmAttr.String(g.algorithm)))}
	g.startOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	return g, nil
}

// outcomes are the values of the throttle.outcome metric label, indexed
// by outcomeOf.
var outcomes = [...]string{"rejected", "admitted", "reserved"}

func outcomeOf(d Decision) int {
	switch {
	case d.Allowed:
		return 1
	case d.Reserved:
		return 2
	}
	return 0
}

// Policy returns the Gate's failure policy.
func (g *Gate) Policy() FailurePolicy { return g.policy }

// DegradedRetryAfter returns the RetryAfter of the Gate's FailClosed
// rejections (WithDegradedRetryAfter, default 1 s): the consumers use it
// for a message whose in-flight limiter could not decide under FailClosed.
// It is 1 s for the zero Gate.
func (g *Gate) DegradedRetryAfter() time.Duration {
	if g == nil || g.degradedRetry <= 0 {
		return time.Second
	}
	return g.degradedRetry
}

// CountDisposition counts, in DispositionsMetric, that a consumer did
// disposition (such as "nak", "wait", "hold", "deferred", "retry") with a
// message of key that its decision did not run at once; with
// WithKeyMetrics the count carries the key's label. The consumers of this
// module call it; a consumer of one's own may too. Without a meter
// provider it does nothing.
func (g *Gate) CountDisposition(ctx context.Context, key, disposition string) {
	if g == nil || !g.metered {
		return
	}
	attrs := []attribute.KeyValue{DispositionAttr.String(disposition)}
	if g.keyed != nil {
		attrs = append(attrs, KeyAttr.String(g.keyed.of(key).name))
	}
	g.dispositions.Add(ctx, 1, metric.WithAttributes(attrs...))
}

// Reservations returns the horizon of WithReservations when the limiter
// implements IDLimiter, else 0: how far ahead AdmitID reserves slots.
func (g *Gate) Reservations() time.Duration {
	if g == nil || g.ids == nil {
		return 0
	}
	return g.horizon
}

// Admit decides whether a request of cost n for key may proceed.
//
// A rejection is a Decision with Allowed == false and a nil error. When the
// limiter fails (store error or timeout), the failure policy decides and the
// Decision has Source SourceDegraded and Err set to the limiter's error; the
// error is then recorded on the span, counted and logged (WithLogger), and
// Admit still returns a nil error. A limiter closed while
// in use (ErrClosed) gives a rejection with the degraded retry-after,
// whatever the policy.
//
// Admit returns an error in three cases, each with a rejection: for a
// request that can never be admitted (IsUsageError; RetryAfter is Never
// and the caller must not retry it); when ctx ended before the limiter
// decided (the context's error; RetryAfter is the degraded retry-after);
// and for the zero Gate (ErrInvalidOption). The zero Gate is not usable:
// call NewGate.
func (g *Gate) Admit(ctx context.Context, key string, n int) (Decision, error) {
	return g.admit(ctx, key, n, "", false)
}

// AdmitID is Admit for a request with identity id (a stream sequence, a
// task ID): when the limiter implements IDLimiter, it decides with
// AllowID and the Gate's reservation horizon (WithReservations), so an id
// already admitted is not charged again and, with a horizon, a rejection
// reserves the request's own future slot (Decision.Reserved). Otherwise
// it is Admit, and so it is for an empty id: a caller's id function that
// found none must not make every such request one identity, admitted
// again for free. Failures and errors are as for Admit; a degraded
// decision reserves nothing.
func (g *Gate) AdmitID(ctx context.Context, key string, n int, id string) (Decision, error) {
	return g.admit(ctx, key, n, id, id != "")
}

// Release gives back what AdmitID's id holds for key (its admission or
// its reservation) when the request will not run: a consumer that gives a
// message up, with no redelivery to claim its slot. It does nothing, with
// no error, when the limiter cannot give back (it is not a Refunder) or
// id is "". Errors are the limiter's Refund's.
func (g *Gate) Release(ctx context.Context, key string, n int, id string) error {
	if g == nil || id == "" {
		return nil
	}
	r, ok := g.limiter.(Refunder)
	if !ok {
		return nil
	}
	_, err := r.Refund(ctx, key, n, id)
	return err
}

func (g *Gate) admit(ctx context.Context, key string, n int, id string, hasID bool) (Decision, error) {
	if g == nil || g.limiter == nil {
		return Decision{RetryAfter: Never}, &OptionError{Field: "Gate", Reason: "not built by NewGate"}
	}
	var start time.Duration
	if g.metered {
		start = monotonic()
	}
	span := nonRecording
	if g.traced {
		ctx, span = g.tracer.Start(ctx, SpanName, g.startOpts...)
	}
	var d Decision
	var err error
	if hasID && g.ids != nil {
		d, err = g.ids.AllowID(ctx, key, n, id, g.horizon)
	} else {
		d, err = g.limiter.AllowN(ctx, key, n)
	}
	if err != nil {
		span.RecordError(err)
		switch {
		case IsUsageError(err):
			span.SetStatus(codes.Error, err.Error())
			span.End()
			d = Decision{Limit: g.limit, RetryAfter: Never}
			if g.logger != nil {
				g.logDecision(ctx, key, n, d, err)
			}
			return d, err
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
			// The caller gave up: no decision, but nothing wrong with
			// the request either.
			span.SetStatus(codes.Error, err.Error())
			span.End()
			d = Decision{Limit: g.limit, RetryAfter: g.degradedRetry}
			if g.logger != nil {
				g.logDecision(ctx, key, n, d, err)
			}
			return d, err
		case errors.Is(err, ErrClosed):
			d = g.rejectDegraded()
			span.SetStatus(codes.Error, "limiter closed; rejected")
		case errors.Is(err, ErrTooManyKeys):
			// Not a store failure: no policy admits it.
			d = g.rejectDegraded()
			d.Source = SourceLocal
			span.SetStatus(codes.Error, "key refused; rejected")
		default:
			d = g.degraded(err)
			span.SetStatus(codes.Error, "limiter failed; "+g.policyFor(err).String()+" decided")
		}
		d.Err = err
		if g.metered {
			if d.Source == SourceLocal {
				g.keysRefused.Add(ctx, 1, g.storeErrOpt...)
			} else {
				g.storeErrors.Add(ctx, 1, g.storeErrOpt...)
			}
			if errors.Is(err, ErrSlowStore) {
				g.slowStore.Add(ctx, 1, g.storeErrOpt...)
			}
		}
		if g.logger != nil {
			g.logFailure(ctx, key, err)
		}
	} else if g.logger != nil {
		g.failures.succeeded()
	}
	if d.Allowed {
		d.Reserved = false
	}
	outcome := outcomeOf(d)
	src := d.Source
	if src < SourceUnknown || src > SourceDegraded {
		src = SourceUnknown
	}
	if span.IsRecording() {
		span.SetAttributes(
			KeyAttr.String(key),
			AlgorithmAttr.String(g.algorithm),
			CostAttr.Int(n),
			LimitAttr.Int(d.Limit),
			AllowedAttr.Bool(d.Allowed),
			RemainingAttr.Int(d.Remaining),
			RetryAfterMsAttr.Int64(d.RetryAfter.Milliseconds()),
			SourceAttr.String(d.Source.String()),
		)
		if hasID {
			span.SetAttributes(ReservedAttr.Bool(d.Reserved))
		}
		if err != nil {
			span.SetAttributes(PolicyAttr.String(g.policyFor(err).String()))
		}
	}
	span.End()
	if g.metered {
		add, record := g.addOpts[outcome][src], g.recordOpts[outcome][src]
		if g.keyed != nil {
			ks := g.keyed.of(key)
			add, record = ks.add[outcome][src], ks.record[outcome][src]
		}
		g.decisions.Add(ctx, 1, add...)
		g.duration.Record(ctx, (monotonic() - start).Seconds(), record...)
	}
	if g.logger != nil {
		g.logDecision(ctx, key, n, d, nil)
	}
	return d, nil
}

// nonRecording is the span of a Gate whose tracer provider is the no-op
// one: it records nothing, and unlike the caller's span it may be ended.
var nonRecording = trace.SpanFromContext(context.Background())

// epoch anchors monotonic.
var epoch = time.Now()

// monotonic reads only the monotonic clock (time.Now reads the wall clock
// as well): the latency histogram needs no more, and it is half the cost.
func monotonic() time.Duration { return time.Since(epoch) }

// policyFor returns the failure policy that decides for the limiter's
// error err: the quota one for a quota that cannot be enforced.
func (g *Gate) policyFor(err error) FailurePolicy {
	if errors.Is(err, ErrInvalidQuota) {
		return g.quotaPolicy
	}
	return g.policy
}

// degraded is the failure policy's decision for the limiter's error err.
func (g *Gate) degraded(err error) Decision {
	if g.policyFor(err) == FailOpen {
		return Decision{Allowed: true, Limit: g.limit, Source: SourceDegraded}
	}
	return g.rejectDegraded()
}

func (g *Gate) rejectDegraded() Decision {
	return Decision{Limit: g.limit, RetryAfter: g.degradedRetry, ResetAfter: g.degradedRetry, Source: SourceDegraded}
}
