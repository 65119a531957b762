package natsthrottle

import "go.opentelemetry.io/otel/attribute"

// ScopeName is the instrumentation scope of the handler's tracer.
const ScopeName = "github.com/queuethrottle/queuethrottle/consumers/nats"

// SpanNamePrefix starts the name of every process span: "process " then
// the message subject, as the messaging semantic conventions name a span
// "{operation} {destination}".
const SpanNamePrefix = "process "

// Span attributes the handler sets on its process span, besides the
// messaging ones of semconv v1.43.0.
const (
	// NumDeliveredAttr (int) is the message's delivery count,
	// MsgMetadata.NumDelivered. Semconv v1.43.0 has no delivery-count key.
	NumDeliveredAttr = attribute.Key("nats.num_delivered")
	// DispositionAttr (string) says what the handler did with the message:
	// one of the Disposition constants.
	DispositionAttr = attribute.Key("throttle.disposition")
	// HeldAttr (bool) is true when the message was held (see the package
	// documentation) instead of NAKed.
	HeldAttr = attribute.Key("throttle.held")
	// WaitedAttr (bool) is true when the message waited in process for a
	// reserved slot at most WithMaxWait ahead (see the package
	// documentation).
	WaitedAttr = attribute.Key("throttle.waited")
	// DeferredAttr (bool) is true when the fair shares sent the message
	// back to the server, to come back when its key's share of the
	// handlers reaches it (see Fair shares in the package documentation).
	DeferredAttr = attribute.Key("throttle.deferred")
	// InFlightAttr (string) says what became of the in-flight slot of an
	// admitted message (WithInFlight): one of the InFlight constants. It
	// is not set without an in-flight limiter.
	InFlightAttr = attribute.Key("throttle.in_flight")
	// BackoffMsAttr (int) is the d of a Backoff the wrapped handler called,
	// in milliseconds, on the span of that run and on the span of the
	// message's wait or hold after it.
	BackoffMsAttr = attribute.Key("throttle.backoff_ms")
)

// Values of InFlightAttr.
const (
	// InFlightAcquired: the message got its slot and the handler ran.
	InFlightAcquired = "acquired"
	// InFlightRejected: every slot of the key was held; the message was
	// NAKed (or held) like a rate rejection.
	InFlightRejected = "rejected"
	// InFlightError: the in-flight limiter failed; the Gate's failure
	// policy decided.
	InFlightError = "error"
)

// Values of DispositionAttr.
const (
	// DispositionHandled: admitted and passed to the wrapped handler.
	DispositionHandled = "handled"
	// DispositionNak: rejected, or not decided within the decision
	// timeout, and NAKed with the retry-after delay.
	DispositionNak = "nak"
	// DispositionTerm: never admissible (key or cost error, usage error),
	// terminated.
	DispositionTerm = "term"
	// DispositionAbandoned: rejected on its last delivery and not held,
	// because the Handler was closing; left unacknowledged.
	DispositionAbandoned = "abandoned"
	// DispositionSuperseded: a delivery that waited in process while the
	// server delivered its message again; dropped, the newer delivery
	// runs instead (see the package documentation).
	DispositionSuperseded = "superseded"
	// DispositionStalled: seen by a handler built from a bad configuration
	// and held unhandled with InProgress (see NewHandler).
	DispositionStalled = "stalled"
	// DispositionDeferred: NAKed by the fair shares, to come back when its
	// key's share reaches it (counted apart from DispositionNak).
	DispositionDeferred = "deferred"
	// DispositionWait: refused, it waits in process for a slot a moment
	// ahead, however often it asks again (throttle.DispositionsMetric).
	DispositionWait = "wait"
	// DispositionHold: refused on its last delivery, held in process with
	// InProgress until admitted (throttle.DispositionsMetric).
	DispositionHold = "hold"
)
