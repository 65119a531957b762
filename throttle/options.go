package throttle

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// FailurePolicy says what a Gate decides when its limiter cannot (the store
// erred or timed out). Either way the decision has Source SourceDegraded and
// the error is recorded on the span and counted.
type FailurePolicy int

const (
	// FailClosed rejects with the Gate's degraded retry-after (default 1s,
	// see WithDegradedRetryAfter): the downstream is never flooded while the
	// store is down, and messages come back later.
	FailClosed FailurePolicy = iota
	// FailOpen admits: work goes on unthrottled while the store is down.
	FailOpen
)

// String returns "fail_closed" or "fail_open".
func (p FailurePolicy) String() string {
	if p == FailOpen {
		return "fail_open"
	}
	return "fail_closed"
}

// Option configures a Gate.
type Option interface{ apply(*gateConfig) error }

type optionFunc func(*gateConfig) error

func (f optionFunc) apply(c *gateConfig) error { return f(c) }

type gateConfig struct {
	tracerProvider    trace.TracerProvider
	meterProvider     metric.MeterProvider
	policy            FailurePolicy
	quotaPolicy       FailurePolicy
	degradedRetry     time.Duration
	algorithmOverride string
	horizon           time.Duration
	logger            *slog.Logger
	aimd              *AIMD
	keyMetrics        *keyMetrics // WithKeyMetrics
}

// WithTracerProvider sets the provider of the decision spans. Nil means the
// global provider (otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *gateConfig) error {
		if tp != nil {
			c.tracerProvider = tp
		}
		return nil
	})
}

// WithMeterProvider sets the provider of the decision metrics. Nil means the
// global provider (otel.GetMeterProvider()).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *gateConfig) error {
		if mp != nil {
			c.meterProvider = mp
		}
		return nil
	})
}

// WithFailurePolicy sets what the Gate decides when the limiter errs.
// Default FailClosed.
func WithFailurePolicy(p FailurePolicy) Option {
	return optionFunc(func(c *gateConfig) error {
		if p != FailClosed && p != FailOpen {
			return &OptionError{Field: "WithFailurePolicy", Reason: fmt.Sprintf("unknown policy %d", int(p))}
		}
		c.policy = p
		return nil
	})
}

// WithQuotaFailurePolicy sets what the Gate decides when a key's quota
// cannot be enforced: its QuotaFunc returned a quota that is not a valid
// limit (the limiter's error wraps ErrInvalidQuota). Default FailClosed,
// whatever WithFailurePolicy says: a store outage may be ridden through
// unthrottled, a broken quota is no reason to lift the limit. Choose
// FailOpen only if a bad quota should mean no limit. A blocked quota
// (Blocked, "0/1s") is a rejection, not a failure, and no policy applies.
func WithQuotaFailurePolicy(p FailurePolicy) Option {
	return optionFunc(func(c *gateConfig) error {
		if p != FailClosed && p != FailOpen {
			return &OptionError{Field: "WithQuotaFailurePolicy", Reason: fmt.Sprintf("unknown policy %d", int(p))}
		}
		c.quotaPolicy = p
		return nil
	})
}

// WithDegradedRetryAfter sets the RetryAfter of a FailClosed rejection,
// after which the message is presented again. Default 1s; must be > 0.
func WithDegradedRetryAfter(d time.Duration) Option {
	return optionFunc(func(c *gateConfig) error {
		if d <= 0 {
			return &OptionError{Field: "WithDegradedRetryAfter", Reason: fmt.Sprintf("must be > 0, got %v", d)}
		}
		c.degradedRetry = CeilMillisecond(d)
		return nil
	})
}

// WithAlgorithm sets the throttle.algorithm attribute when the limiter does
// not implement Algorithmer (or to override it).
func WithAlgorithm(name string) Option {
	return optionFunc(func(c *gateConfig) error {
		c.algorithmOverride = name
		return nil
	})
}

// WithReservations makes Gate.AdmitID reserve, for a rejected request
// that carries an id, its own future slot up to horizon ahead (see
// IDLimiter): the message then goes back to the broker once, with exactly
// the delay to its slot, and is admitted on its reservation when it comes
// back. 0 (the default) reserves nothing; AdmitID is then still
// idempotent. It must be >= 0, and NewGate refuses a horizon > 0 over a
// limiter that does not implement IDLimiter (bucket.Hybrid, or All with
// a part that is not a SlotLimiter), naming both: it could reserve
// nothing.
func WithReservations(horizon time.Duration) Option {
	return optionFunc(func(c *gateConfig) error {
		if horizon < 0 {
			return &OptionError{Field: "WithReservations", Reason: fmt.Sprintf("horizon must be >= 0, got %v", horizon)}
		}
		c.horizon = horizon
		return nil
	})
}
