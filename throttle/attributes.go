package throttle

import "go.opentelemetry.io/otel/attribute"

// Span attributes that the Gate sets on every decision span.
const (
	KeyAttr          = attribute.Key("throttle.key")            // string: the limiter key (spans; metrics with WithKeyMetrics: its label)
	AlgorithmAttr    = attribute.Key("throttle.algorithm")      // string: e.g. "sliding_window_log"
	CostAttr         = attribute.Key("throttle.cost")           // int: n
	LimitAttr        = attribute.Key("throttle.limit")          // int: Decision.Limit
	AllowedAttr      = attribute.Key("throttle.allowed")        // bool: Decision.Allowed
	RemainingAttr    = attribute.Key("throttle.remaining")      // int: Decision.Remaining
	RetryAfterMsAttr = attribute.Key("throttle.retry_after_ms") // int: Decision.RetryAfter in milliseconds
	SourceAttr       = attribute.Key("throttle.source")         // string: Decision.Source
	ReservedAttr     = attribute.Key("throttle.reserved")       // bool: Decision.Reserved, on decisions of Gate.AdmitID
	OutcomeAttr      = attribute.Key("throttle.outcome")        // string: "admitted", "rejected" or "reserved" (a rejection holding a slot) (metrics)
	PolicyAttr       = attribute.Key("throttle.failure_policy") // string: set when the policy decided
	DispositionAttr  = attribute.Key("throttle.disposition")    // string: what a consumer did with the message (DispositionsMetric)
)

// Names of the instruments and span the Gate records.
const (
	// SpanName is the name of the span the Gate starts for each decision.
	SpanName = "throttle.admit"
	// DecisionsMetric counts decisions, labelled by throttle.outcome and
	// throttle.source, and with WithKeyMetrics by throttle.key (bounded).
	// Unit: {decision}. Prometheus: throttle_decisions_total.
	DecisionsMetric = "throttle.decisions"
	// DurationMetric is the latency of a decision in seconds, labelled like
	// DecisionsMetric.
	DurationMetric = "throttle.decision.duration"
	// StoreErrorsMetric counts limiter errors other than bad requests (store
	// failures and timeouts), labelled by throttle.algorithm.
	StoreErrorsMetric = "throttle.store.errors"
	// KeysRefusedMetric counts decisions refused because an in-process
	// limiter holds its most keys, all live (ErrTooManyKeys), labelled by
	// throttle.algorithm.
	KeysRefusedMetric = "throttle.keys.refused"
	// SlowStoreMetric counts store failures that are timeouts while the
	// store's round trip is longer than the limiter's WithTimeout
	// (ErrSlowStore; each is in StoreErrorsMetric too), labelled by
	// throttle.algorithm.
	SlowStoreMetric = "throttle.store.slow"
	// DispositionsMetric counts what the consumers did with messages
	// their decisions did not run at once (Gate.CountDisposition),
	// labelled by throttle.disposition (such as "nak", "wait", "hold",
	// "deferred", "retry") and, with WithKeyMetrics, throttle.key. A
	// message that waits in process is one "wait" however often it asks
	// again, unlike the "reserved" decisions. Unit: {message}.
	// Prometheus: throttle_dispositions_total.
	DispositionsMetric = "throttle.dispositions"
)
