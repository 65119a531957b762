package asynqthrottle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// The producer's trace context rides in the task headers: every process
// span of the task (the rejected attempt and the admitted one) is a child
// of the producer's span, the Gate's decision span is a child of the
// process span, and the wrapped handler runs in the process span. A task
// without headers still runs, under a root span.
func TestTraceContextFromHeaders(t *testing.T) {
	e := newEnv(t)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	lim := newScripted(map[string][]time.Duration{"traced": {100 * time.Millisecond}})
	var mu sync.Mutex
	handlerSpans := make(map[string]trace.SpanContext)
	h := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		handlerSpans[string(task.Payload())] = trace.SpanContextFromContext(ctx)
		mu.Unlock()
		return nil
	})
	e.serve(t, asynq.Config{}, NewHandler(h, newGate(t, lim, throttle.WithTracerProvider(tp)),
		WithKeyFunc(payloadKey), WithTracerProvider(tp)))

	ctx, producer := tp.Tracer("producer").Start(context.Background(), "send default")
	in := map[string]string{"tenant": "acme"}
	headers := InjectTraceContext(ctx, in)
	producer.End()
	if len(in) != 1 || headers["traceparent"] == "" || headers["tenant"] != "acme" {
		t.Fatalf("InjectTraceContext: input now %v, output %v; want input unchanged and traceparent added", in, headers)
	}
	traced := e.enqueue(t, asynq.NewTaskWithHeaders("job", []byte("traced"), headers))
	plain := e.enqueue(t, asynq.NewTask("job", []byte("plain")))

	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		n := len(handlerSpans)
		mu.Unlock()
		if n == 2 && len(processSpans(sr)) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("handler runs %d, process spans %d; want 2 and 3", n, len(processSpans(sr)))
		}
		time.Sleep(20 * time.Millisecond)
	}

	byID := make(map[string][]sdktrace.ReadOnlySpan)
	for _, s := range processSpans(sr) {
		id := attr(s, semconv.MessagingMessageIDKey).AsString()
		byID[id] = append(byID[id], s)
		if s.Name() != "process default" || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %q kind %v; want %q, consumer", s.Name(), s.SpanKind(), "process default")
		}
		for k, want := range map[attribute.Key]attribute.Value{
			semconv.MessagingSystemKey:          attribute.StringValue("asynq"),
			semconv.MessagingDestinationNameKey: attribute.StringValue("default"),
			semconv.MessagingOperationTypeKey:   attribute.StringValue("process"),
			semconv.MessagingOperationNameKey:   attribute.StringValue("process"),
			TaskTypeAttr:                        attribute.StringValue("job"),
			RetryCountAttr:                      attribute.IntValue(0),
			MaxRetryAttr:                        attribute.IntValue(25),
		} {
			if got := attr(s, k); got != want {
				t.Errorf("span %s: %s = %v, want %v", id, k, got.String(), want.String())
			}
		}
	}

	tracedSpans := byID[traced.ID]
	if len(tracedSpans) != 2 {
		t.Fatalf("%d process spans for the traced task, want 2", len(tracedSpans))
	}
	wantDisp := []string{DispositionRetry, DispositionHandled}
	for i, s := range tracedSpans {
		if s.Parent().TraceID() != producer.SpanContext().TraceID() || s.Parent().SpanID() != producer.SpanContext().SpanID() {
			t.Errorf("process span %d: parent %v, want the producer span %v", i, s.Parent(), producer.SpanContext())
		}
		if got := attr(s, DispositionAttr).AsString(); got != wantDisp[i] {
			t.Errorf("process span %d: disposition %q, want %q", i, got, wantDisp[i])
		}
		if n := len(childrenOf(sr, s, throttle.SpanName)); n != 1 {
			t.Errorf("process span %d: %d %s children, want 1", i, n, throttle.SpanName)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := handlerSpans["traced"]; got.SpanID() != tracedSpans[1].SpanContext().SpanID() {
		t.Errorf("handler ran in span %v, want the process span %v", got.SpanID(), tracedSpans[1].SpanContext().SpanID())
	}
	plainSpans := byID[plain.ID]
	if len(plainSpans) != 1 || plainSpans[0].Parent().IsValid() {
		t.Errorf("task without headers: %d process spans; want 1, a root", len(plainSpans))
	}
}

func processSpans(sr *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.InstrumentationScope().Name == ScopeName {
			out = append(out, s)
		}
	}
	return out
}

func childrenOf(sr *tracetest.SpanRecorder, parent sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name && s.Parent().SpanID() == parent.SpanContext().SpanID() {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}
