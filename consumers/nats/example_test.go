package natsthrottle_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	natsthrottle "github.com/queuethrottle/queuethrottle/consumers/nats"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// At most 20 messages per second per subject reach the handler; the
// others come back later without using up MaxDeliver. Not run: it needs a
// NATS server with a stream JOBS at nats.DefaultURL and runs for a minute;
// Example_quickStart runs the same against an embedded server.
func ExampleNewHandler() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{Durable: "workers", MaxDeliver: 5, AckWait: 30 * time.Second}
	consumer, err := js.CreateOrUpdateConsumer(ctx, "JOBS", cfg)
	if err != nil {
		log.Fatal(err)
	}

	lim, err := window.NewMemory(throttle.PerSecond(20))
	if err != nil {
		log.Fatal(err)
	}
	gate, err := throttle.NewGate(lim)
	if err != nil {
		log.Fatal(err)
	}
	handle := func(msg jetstream.Msg) {
		// Runs only for admitted messages, possibly on several goroutines
		// at once; it owns the ack.
		fmt.Printf("%s: %s\n", msg.Subject(), msg.Data())
		_ = msg.Ack()
	}
	cc, err := consumer.Consume(natsthrottle.NewHandler(handle, gate,
		natsthrottle.WithConsumer(consumer), // MaxDeliver, AckWait and BackOff
		natsthrottle.WithDecisionTimeout(2*time.Second),
		natsthrottle.WithErrorHandler(func(msg jetstream.Msg, err error) {
			log.Printf("natsthrottle: %s: %v", msg.Subject(), err)
		})))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
	time.Sleep(time.Minute)
}

// New gives the configuration errors at start-up and a Close for shutdown.
// Not run: the consumer and the Gate come from elsewhere (see
// Example_quickStart, which runs).
func ExampleNew() {
	var consumer jetstream.Consumer // from js.CreateOrUpdateConsumer
	var gate *throttle.Gate         // from throttle.NewGate
	cfg := jetstream.ConsumerConfig{Durable: "workers", MaxDeliver: 5}

	h, err := natsthrottle.New(func(msg jetstream.Msg) {
		ctx := natsthrottle.ContextFromMsg(msg) // carries the process span
		_ = ctx
		_ = msg.Ack()
	}, gate, natsthrottle.WithConsumerConfig(cfg))
	if err != nil {
		log.Fatal(err) // e.g. a nil gate: throttle.ErrInvalidOption
	}
	cc, err := consumer.Consume(h.Handle)
	if err != nil {
		log.Fatal(err)
	}
	// ... on shutdown:
	cc.Drain()
	<-cc.Closed()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Close(ctx); err != nil {
		log.Printf("held messages given up: %v", err)
	}
}

// A producer injects its trace context into the headers with HeaderCarrier,
// which keeps the key's case; the handler finds it whatever the case.
func ExampleHeaderCarrier() {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled,
	}))
	msg := nats.NewMsg("jobs.email")
	propagation.TraceContext{}.Inject(ctx, natsthrottle.HeaderCarrier(msg.Header))
	fmt.Println(msg.Header["traceparent"][0])

	// On the consumer side, a canonical-case key is found too.
	hdr := nats.Header{"Traceparent": msg.Header["traceparent"]}
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), natsthrottle.HeaderCarrier(hdr)))
	fmt.Println(got.TraceID(), got.SpanID())
	// Output:
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// 4bf92f3577b34da6a3ce929d0e0e4736 00f067aa0ba902b7
}
