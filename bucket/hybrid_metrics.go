package bucket

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// hybridScopeName is the instrumentation scope of a Hybrid's meter.
const hybridScopeName = "github.com/queuethrottle/queuethrottle/bucket"

// Names of the instruments a Hybrid records, through the meter provider of
// WithMeterProvider (default the global one).
const (
	// HybridDecisionsMetric counts a Hybrid's decisions, labelled by
	// throttle.source ("local", "redis" or "degraded") and throttle.outcome
	// ("admitted" or "rejected"). Unit: {decision}.
	HybridDecisionsMetric = "throttle.hybrid.decisions"
	// HybridRedisDurationMetric is the latency of a Hybrid's Redis calls in
	// seconds, labelled by HybridOpAttr, whether they succeeded or not.
	HybridRedisDurationMetric = "throttle.hybrid.redis.duration"
	// HybridRedisErrorsMetric counts a Hybrid's failed Redis calls (errors
	// and timeouts, not calls the open circuit breaker refused), labelled by
	// HybridOpAttr. Unit: {error}.
	HybridRedisErrorsMetric = "throttle.hybrid.redis.errors"
	// HybridBreakerTransitionsMetric counts the state changes of a Hybrid's
	// circuit breaker, labelled by HybridBreakerFromAttr and
	// HybridBreakerToAttr. Unit: {transition}.
	HybridBreakerTransitionsMetric = "throttle.hybrid.breaker.transitions"
)

// Attributes of a Hybrid's metrics, besides throttle.SourceAttr and
// throttle.OutcomeAttr.
const (
	// HybridOpAttr is the Redis operation: "lease" (take tokens) or
	// "give_back" (return unused tokens).
	HybridOpAttr = attribute.Key("throttle.hybrid.op")
	// HybridBreakerFromAttr and HybridBreakerToAttr are the circuit breaker
	// states of a transition: "closed", "half-open" or "open".
	HybridBreakerFromAttr = attribute.Key("throttle.hybrid.breaker.from")
	HybridBreakerToAttr   = attribute.Key("throttle.hybrid.breaker.to")
)

// Redis operations, indexes of durationOpts and errorOpts.
const (
	opLease = iota
	opGiveBack
)

func (h *Hybrid) initMetrics(mp metric.MeterProvider) error {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(hybridScopeName, metric.WithInstrumentationVersion(throttle.Version))
	var err error
	if h.decisions, err = meter.Int64Counter(HybridDecisionsMetric,
		metric.WithUnit("{decision}"),
		metric.WithDescription("Hybrid token bucket decisions by source (local, redis, degraded) and outcome.")); err != nil {
		return err
	}
	if h.redisDuration, err = meter.Float64Histogram(HybridRedisDurationMetric,
		metric.WithUnit("s"),
		metric.WithDescription("Latency of the hybrid token bucket's Redis calls."),
		metric.WithExplicitBucketBoundaries(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)); err != nil {
		return err
	}
	if h.redisErrors, err = meter.Int64Counter(HybridRedisErrorsMetric,
		metric.WithUnit("{error}"),
		metric.WithDescription("Failed Redis calls (errors and timeouts) of the hybrid token bucket.")); err != nil {
		return err
	}
	if h.breakerChanges, err = meter.Int64Counter(HybridBreakerTransitionsMetric,
		metric.WithUnit("{transition}"),
		metric.WithDescription("State changes of the hybrid token bucket's circuit breaker.")); err != nil {
		return err
	}
	for allowed, outcome := range []string{"rejected", "admitted"} {
		for s := throttle.SourceUnknown; s <= throttle.SourceDegraded; s++ {
			set := attribute.NewSet(throttle.OutcomeAttr.String(outcome), throttle.SourceAttr.String(s.String()))
			h.decisionOpts[allowed][s] = []metric.AddOption{metric.WithAttributeSet(set)}
		}
	}
	for op, name := range []string{"lease", "give_back"} {
		set := attribute.NewSet(HybridOpAttr.String(name))
		h.durationOpts[op] = []metric.RecordOption{metric.WithAttributeSet(set)}
		h.errorOpts[op] = []metric.AddOption{metric.WithAttributeSet(set)}
	}
	return nil
}

// HybridStats counts a Hybrid's decisions since it was created.
type HybridStats struct {
	Local    int64 // decided from the local stock or the local view of Redis, without a call
	Redis    int64 // decided by (or after waiting for) a Redis call
	Degraded int64 // decided by the local share while Redis was unreachable
	Errors   int64 // AllowN returned a store error (Redis unreachable, no local share)
}

// Stats returns the decision counts so far. Decisions without a Redis
// round trip are Local, the share of them at steady state is
// Local/(Local+Redis).
func (h *Hybrid) Stats() HybridStats {
	st := HybridStats{Degraded: h.degradedN.Load(), Errors: h.errorsN.Load()}
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		st.Local += s.local
		st.Redis += s.redis
		s.mu.Unlock()
	}
	return st
}
