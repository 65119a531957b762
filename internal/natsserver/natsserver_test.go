package natsserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/internal/natsserver"
)

func TestRun(t *testing.T) {
	s := natsserver.Run(t)
	if !s.JetStreamEnabled() {
		t.Fatal("JetStream not enabled")
	}
	_, js := natsserver.Connect(t, s)
	natsserver.Stream(t, js, "T", "t.>")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := js.Publish(ctx, "t.a", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != "T" || ack.Sequence != 1 {
		t.Fatalf("PubAck = %+v, want stream T seq 1", ack)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "T", jetstream.ConsumerConfig{Durable: "c"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data()) != "x" {
		t.Fatalf("data = %q", m.Data())
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
}

func TestStartEmptyDir(t *testing.T) {
	if _, err := natsserver.Start(""); err == nil {
		t.Fatal("Start(\"\") succeeded, want error")
	}
}

func TestStartShutdown(t *testing.T) {
	s, err := natsserver.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if s.ClientURL() == "" {
		t.Fatal("no client URL")
	}
	s.Shutdown()
	s.WaitForShutdown()
}
