package natsthrottle_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsthrottle "github.com/queuethrottle/queuethrottle/consumers/nats"
	"github.com/queuethrottle/queuethrottle/internal/natsserver"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// A JetStream quick start like the README's (there the key is the
// subject, here a Tenant header), against an embedded nats-server and
// with a limit of 2 per second so the third message waits for its
// reserved slot. The README connects to nats.DefaultURL and runs until
// interrupted; here the example publishes three messages and stops once
// they are handled.
func Example_quickStart() {
	dir, err := os.MkdirTemp("", "natsthrottle-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := natsserver.Start(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	ctx := context.Background()

	// From here on, the quick start (but the limit and the URL).
	lim, err := window.NewMemory(throttle.PerSecond(2))
	if err != nil {
		log.Fatal(err)
	}
	gate, err := throttle.NewGate(lim, throttle.WithReservations(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"jobs.>"}})
	if err != nil {
		log.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       "payments",
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxDeliver:    5,
		AckWait:       30 * time.Second,
		MaxAckPending: -1, // messages NAKed to a reserved slot stay pending
	})
	if err != nil {
		log.Fatal(err)
	}
	var handled sync.WaitGroup
	handled.Add(3)
	h, err := natsthrottle.New(func(msg jetstream.Msg) {
		fmt.Printf("charged %s\n", msg.Data()) // runs only for admitted messages
		_ = msg.Ack()
		handled.Done()
	}, gate,
		natsthrottle.WithKeyFunc(func(m jetstream.Msg) (string, error) {
			if t := m.Headers().Get("Tenant"); t != "" {
				return t, nil
			}
			return "", errors.New("no Tenant header")
		}),
		natsthrottle.WithConsumer(cons),
		natsthrottle.WithConcurrency(16),
	)
	if err != nil {
		log.Fatal(err)
	}
	cc, err := h.Consume(cons) // buffers no more than the 16 it runs at once
	if err != nil {
		log.Fatal(err)
	}

	start := time.Now()
	for i := 1; i <= 3; i++ {
		msg := nats.NewMsg("jobs.charge")
		msg.Header.Set("Tenant", "acme")
		msg.Data = fmt.Appendf(nil, "acme order %d", i)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			log.Fatal(err)
		}
	}
	handled.Wait()
	fmt.Println("the third waited for its slot:", time.Since(start) >= 900*time.Millisecond)

	cc.Drain()
	<-cc.Closed()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Close(sctx); err != nil {
		log.Print(err)
	}
	// Unordered output:
	// charged acme order 1
	// charged acme order 2
	// charged acme order 3
	// the third waited for its slot: true
}
