package asynqthrottle

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// InjectTraceContext returns headers for asynq.NewTaskWithHeaders that carry
// the trace context of ctx: a copy of headers (which is not modified; nil
// is fine) with the propagator's fields added, for example "traceparent".
// The propagator is the global one (otel.GetTextMapPropagator()), or W3C
// trace context (propagation.TraceContext) while the global one propagates
// nothing (the OpenTelemetry default before otel.SetTextMapPropagator is
// called), so that a producer and the middleware agree without setup.
//
//	ctx, span := tracer.Start(ctx, "send orders")
//	task := asynq.NewTaskWithHeaders("order:ship", payload, asynqthrottle.InjectTraceContext(ctx, nil))
//	_, err := client.EnqueueContext(ctx, task)
//	span.End()
//
// Without a span in ctx the result is a copy of headers (an empty map for
// nil headers).
func InjectTraceContext(ctx context.Context, headers map[string]string) map[string]string {
	out := make(map[string]string, len(headers)+2)
	maps.Copy(out, headers)
	globalPropagator{}.Inject(ctx, propagation.MapCarrier(out))
	return out
}

// globalPropagator is the global TextMapPropagator, or TraceContext while
// the global one has no fields. It is looked up on every call, so a
// propagator set after the middleware was built is used.
type globalPropagator struct{}

func (globalPropagator) get() propagation.TextMapPropagator {
	p := otel.GetTextMapPropagator()
	if len(p.Fields()) == 0 {
		return propagation.TraceContext{}
	}
	return p
}

func (g globalPropagator) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	g.get().Inject(ctx, c)
}

func (g globalPropagator) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	return g.get().Extract(ctx, c)
}

func (g globalPropagator) Fields() []string { return g.get().Fields() }
