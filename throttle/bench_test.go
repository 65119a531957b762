package throttle_test

import (
	"context"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// The Gate's overhead is BenchmarkGate* minus BenchmarkBareLimiter, all on
// the same in-memory window and one key, admitting every call.
func newBenchLimiter(b *testing.B) *window.Memory {
	b.Helper()
	lim, err := window.NewMemory(throttle.Rate{Count: 1 << 40, Per: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	return lim
}

func BenchmarkBareLimiter(b *testing.B) {
	lim := newBenchLimiter(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := lim.AllowN(ctx, "k", 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGateNoop(b *testing.B) {
	g, err := throttle.NewGate(newBenchLimiter(b),
		throttle.WithTracerProvider(tracenoop.NewTracerProvider()),
		throttle.WithMeterProvider(metricnoop.NewMeterProvider()))
	if err != nil {
		b.Fatal(err)
	}
	benchGate(b, g)
}

func BenchmarkGateSDK(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) }()
	g, err := throttle.NewGate(newBenchLimiter(b), throttle.WithTracerProvider(tp), throttle.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	benchGate(b, g)
}

func benchGate(b *testing.B, g *throttle.Gate) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Admit(ctx, "k", 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGateGlobal uses the OpenTelemetry globals as left unset: their
// spans and instruments record nothing, but the Gate cannot tell.
func BenchmarkGateGlobal(b *testing.B) {
	g, err := throttle.NewGate(newBenchLimiter(b))
	if err != nil {
		b.Fatal(err)
	}
	benchGate(b, g)
}
