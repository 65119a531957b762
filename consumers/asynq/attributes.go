package asynqthrottle

import "go.opentelemetry.io/otel/attribute"

// ScopeName is the instrumentation scope of the middleware's tracer.
const ScopeName = "github.com/queuethrottle/queuethrottle/consumers/asynq"

// SpanNamePrefix starts the name of every process span: "process " then the
// task's queue (or its type when the queue is unknown, as for a Handler
// called outside an asynq.Server), as the messaging semantic conventions
// name a span "{operation} {destination}".
const SpanNamePrefix = "process "

// MessagingSystem is the value of messaging.system on the process spans.
// Semconv v1.43.0 has no constant for asynq.
const MessagingSystem = "asynq"

// Span attributes the middleware sets on its process span, besides the
// messaging ones of semconv v1.43.0.
const (
	// TaskTypeAttr (string) is the task type, asynq.Task.Type.
	TaskTypeAttr = attribute.Key("asynq.task.type")
	// RetryCountAttr (int) is the task's retry count, asynq.GetRetryCount:
	// how many genuine failures it has had. Throttling never increments it.
	RetryCountAttr = attribute.Key("asynq.retry_count")
	// MaxRetryAttr (int) is the task's MaxRetry, asynq.GetMaxRetry.
	MaxRetryAttr = attribute.Key("asynq.max_retry")
	// DispositionAttr (string) says what the middleware did with the task:
	// one of the Disposition constants.
	DispositionAttr = attribute.Key("throttle.disposition")
	// WaitsAttr (int) is how many times the task waited in the handler for
	// its retry-after (see the package documentation); set only when > 0.
	WaitsAttr = attribute.Key("throttle.waits")
	// CopyIDAttr (string) is the task ID of the copy enqueued for a task
	// rejected on its last attempt (see CopyTaskID).
	CopyIDAttr = attribute.Key("throttle.copy_id")
	// InFlightAttr (string) says what became of the in-flight slot of an
	// admitted task (WithInFlight): one of the InFlight constants. It is
	// not set without an in-flight limiter.
	InFlightAttr = attribute.Key("throttle.in_flight")
	// BackoffMsAttr (int) is the delay of a Backoff the wrapped handler
	// returned, in milliseconds.
	BackoffMsAttr = attribute.Key("throttle.backoff_ms")
)

// Values of InFlightAttr.
const (
	// InFlightAcquired: the task got its slot and the handler ran.
	InFlightAcquired = "acquired"
	// InFlightRejected: every slot of the key was held; the task was
	// returned as a *RateLimitError like a rate rejection.
	InFlightRejected = "rejected"
	// InFlightError: the in-flight limiter failed; the Gate's failure
	// policy decided.
	InFlightError = "error"
)

// Values of DispositionAttr.
const (
	// DispositionHandled: admitted and passed to the wrapped handler,
	// whatever the handler returned.
	DispositionHandled = "handled"
	// DispositionRetry: rejected and returned as a *RateLimitError, for
	// asynq to retry after the retry-after without counting a failure.
	DispositionRetry = "retry"
	// DispositionRequeued: rejected on its last attempt; a copy was
	// enqueued to run after the retry-after and the original completes.
	DispositionRequeued = "requeued"
	// DispositionDeferred: sent back by the fair shares, to come back
	// when its key's share of the handlers reaches it (a *RateLimitError,
	// retried without counting a failure).
	DispositionDeferred = "deferred"
	// DispositionArchive: never admissible (key or cost function error, or
	// a usage error from the Gate); returned wrapping asynq.SkipRetry, so
	// asynq archives it.
	DispositionArchive = "archive"
	// DispositionWait: turned away, it waits in the handler for a slot a
	// moment ahead, counted once however often it asks again
	// (throttle.DispositionsMetric); not a span disposition.
	DispositionWait = "wait"
)
