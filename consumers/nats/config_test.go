package natsthrottle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestNewValidates(t *testing.T) {
	g := newGate(t, throttle.PerSecond(1), nil)
	next := func(jetstream.Msg) {}
	tests := []struct {
		name  string
		next  jetstream.MessageHandler
		gate  *throttle.Gate
		opts  []Option
		field string // "" means valid
	}{
		{"valid", next, g, nil, ""},
		{"nil options ignored", next, g, []Option{nil, WithKeyFunc(nil), WithCostFunc(nil), WithTracerProvider(nil),
			WithPropagators(nil), WithErrorHandler(nil), WithLogger(nil)}, ""},
		{"nil handler", nil, g, nil, "handler"},
		{"nil gate", next, nil, nil, "Gate"},
		{"jitter fraction > 1", next, g, []Option{WithJitter(1.5, 0)}, "WithJitter.fraction"},
		{"jitter fraction NaN", next, g, []Option{WithJitter(nan(), 0)}, "WithJitter.fraction"},
		{"jitter max < 0", next, g, []Option{WithJitter(0.1, -time.Millisecond)}, "WithJitter.maxJitter"},
		{"AckWait < 0", next, g, []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: -1})}, "WithConsumerConfig.AckWait"},
		{"MaxDeliver < -1", next, g, []Option{WithConsumerConfig(jetstream.ConsumerConfig{MaxDeliver: -2})}, "WithConsumerConfig.MaxDeliver"},
		{"BackOff entry 0", next, g, []Option{WithConsumerConfig(jetstream.ConsumerConfig{BackOff: []time.Duration{time.Second, 0}})}, "WithConsumerConfig.BackOff"},
		{"heartbeat 0", next, g, []Option{WithHeartbeatInterval(0)}, "WithHeartbeatInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := New(tt.next, tt.gate, tt.opts...)
			if tt.field == "" {
				if err != nil || h == nil {
					t.Fatalf("New = %v, %v", h, err)
				}
				return
			}
			if !errors.Is(err, throttle.ErrInvalidOption) {
				t.Fatalf("New error = %v, want ErrInvalidOption", err)
			}
			var oe *throttle.OptionError
			if !errors.As(err, &oe) || oe.Field != tt.field {
				t.Errorf("error %v, want field %q", err, tt.field)
			}
			if h != nil {
				t.Error("New returned a Handler with an error")
			}
		})
	}
}

func nan() float64 { var z float64; return z / z }

// TestNewHandlerBadConfig: a handler built from a bad configuration NAKs
// every message with a delay and reports the configuration error; the
// zero Handler does the same.
func TestNewHandlerBadConfig(t *testing.T) {
	g := newGate(t, throttle.PerSecond(100), nil)
	rec := newRecorder()
	tests := []struct {
		name  string
		build func(onErr func(jetstream.Msg, error)) jetstream.MessageHandler
	}{
		{"nil handler", func(onErr func(jetstream.Msg, error)) jetstream.MessageHandler {
			return NewHandler(nil, g, WithErrorHandler(onErr))
		}},
		{"nil gate", func(onErr func(jetstream.Msg, error)) jetstream.MessageHandler {
			return NewHandler(rec.handle, nil, WithErrorHandler(onErr))
		}},
		{"bad option before the error handler", func(onErr func(jetstream.Msg, error)) jetstream.MessageHandler {
			return NewHandler(rec.handle, g, WithJitter(-1, 0), WithErrorHandler(onErr))
		}},
		{"zero Handler", func(func(jetstream.Msg, error)) jetstream.MessageHandler {
			var h Handler // has no error handler: only the NAK is checked
			return h.Handle
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			naks := e.watch(t, nakAdvisory)
			c := e.consumer(t, jetstream.ConsumerConfig{})
			var reported errs
			e.publish(t, "jobs.cfg", "x", nil)
			consume(t, c, tt.build(reported.handle))
			waitFor(t, 5*time.Second, "a NAK advisory", func() bool { return len(naks.all()) > 0 })
			if n := reported.matching(throttle.ErrInvalidOption); n != 1 && tt.name != "zero Handler" {
				t.Errorf("errors = %v, want one ErrInvalidOption", reported.all())
			}
			if rec.len() != 0 {
				t.Error("handler ran")
			}
			if got := ackPending(t, c); got != 1 {
				t.Errorf("NumAckPending = %d, want 1 (NAKed with delay)", got)
			}
		})
	}
	var zero Handler
	if err := zero.Close(context.Background()); err != nil {
		t.Errorf("zero Handler Close = %v", err)
	}
}

func TestDelay(t *testing.T) {
	tests := []struct {
		name       string
		opts       []Option
		retryAfter time.Duration
		maxJitter  time.Duration
	}{
		{"default 10%", nil, 300 * time.Millisecond, 30 * time.Millisecond},
		{"default capped at 100ms", nil, 10 * time.Second, 100 * time.Millisecond},
		{"off", []Option{WithJitter(0, 0)}, time.Second, 0},
		{"zero retry", nil, 0, 0},
		{"custom", []Option{WithJitter(0.5, time.Second)}, time.Second, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := New(func(jetstream.Msg) {}, newGate(t, throttle.PerSecond(1), nil), tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			var maxSeen time.Duration
			for range 2000 {
				d := h.delay(tt.retryAfter)
				if d < tt.retryAfter || d > tt.retryAfter+tt.maxJitter {
					t.Fatalf("delay(%v) = %v, want in [%v, %v]", tt.retryAfter, d, tt.retryAfter, tt.retryAfter+tt.maxJitter)
				}
				maxSeen = max(maxSeen, d-tt.retryAfter)
			}
			if tt.maxJitter > 0 && maxSeen < tt.maxJitter/2 {
				t.Errorf("largest jitter %v of 2000, want some near %v", maxSeen, tt.maxJitter)
			}
		})
	}
}

func TestHeartbeatInterval(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{"default AckWait 30s", nil, 10 * time.Second},
		{"AckWait 0 is 30s", []Option{WithConsumerConfig(jetstream.ConsumerConfig{MaxDeliver: 3})}, 10 * time.Second},
		{"AckWait 3s", []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 3 * time.Second})}, time.Second},
		{"shortest BackOff", []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 30 * time.Second,
			BackOff: []time.Duration{600 * time.Millisecond, 6 * time.Second}})}, 200 * time.Millisecond},
		{"floor 10ms", []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 9 * time.Millisecond})}, 10 * time.Millisecond},
		{"explicit", []Option{WithHeartbeatInterval(time.Second)}, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := newConfig(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.heartbeatInterval(); got != tt.want {
				t.Errorf("heartbeat = %v, want %v", got, tt.want)
			}
		})
	}
}

// plainMsg is a message that is not from JetStream: Metadata fails. It
// records the acknowledgements asked of it.
type plainMsg struct {
	subject string
	naks    []time.Duration
	acks    int
}

func (m *plainMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, jetstream.ErrNotJSMessage }
func (m *plainMsg) Data() []byte                              { return nil }
func (m *plainMsg) Headers() nats.Header                      { return nil }
func (m *plainMsg) Subject() string                           { return m.subject }
func (m *plainMsg) Reply() string                             { return "" }
func (m *plainMsg) Ack() error                                { m.acks++; return nil }
func (m *plainMsg) DoubleAck(context.Context) error           { return m.Ack() }
func (m *plainMsg) Nak() error                                { return m.NakWithDelay(0) }
func (m *plainMsg) NakWithDelay(d time.Duration) error        { m.naks = append(m.naks, d); return nil }
func (m *plainMsg) InProgress() error                         { return nil }
func (m *plainMsg) Term() error                               { return nil }
func (m *plainMsg) TermWithReason(string) error               { return nil }

// TestNoMetadata: a message without JetStream metadata is still decided;
// its delivery count being unknown, it is NAKed, never held.
func TestNoMetadata(t *testing.T) {
	var handled int
	var reported errs
	cfg := jetstream.ConsumerConfig{MaxDeliver: 1}
	h := newHandler(t, func(m jetstream.Msg) { handled++; _ = m.Ack() }, newGate(t, throttle.PerHour(1), nil),
		WithConsumerConfig(cfg), WithErrorHandler(reported.handle))
	first, second := &plainMsg{subject: "core.x"}, &plainMsg{subject: "core.x"}
	h.Handle(first)
	h.Handle(second)
	h.Handle(nil)
	if handled != 1 || first.acks != 1 {
		t.Errorf("handled %d (first acked %d), want 1", handled, first.acks)
	}
	if len(second.naks) != 1 || second.naks[0] < 59*time.Minute {
		t.Errorf("second NAKs = %v, want one of about an hour", second.naks)
	}
	if h.Held() != 0 {
		t.Error("held a message without metadata")
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}
