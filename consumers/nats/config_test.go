package natsthrottle

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
		{"nil consumer ignored", next, g, []Option{WithConsumer(nil)}, ""},
		{"consumer without cached info", next, g, []Option{WithConsumer(fakeConsumer{})}, "WithConsumer"},
		{"consumer MaxDeliver < -1", next, g, []Option{WithConsumer(fakeConsumer{info: &jetstream.ConsumerInfo{
			Config: jetstream.ConsumerConfig{MaxDeliver: -2}}})}, "WithConsumer.MaxDeliver"},
		{"decision timeout 0", next, g, []Option{WithDecisionTimeout(0)}, "WithDecisionTimeout"},
		{"decision timeout below AckWait", next, g, []Option{WithDecisionTimeout(time.Second),
			WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 1500 * time.Millisecond})}, ""},
		{"decision timeout = AckWait", next, g, []Option{WithDecisionTimeout(time.Second),
			WithConsumerConfig(jetstream.ConsumerConfig{AckWait: time.Second})}, "WithDecisionTimeout"},
		{"decision timeout above BackOff, option order ignored", next, g, []Option{
			WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 30 * time.Second, BackOff: []time.Duration{time.Second, 10 * time.Second}}),
			WithDecisionTimeout(2 * time.Second)}, "WithDecisionTimeout"},
		{"decision timeout above the default AckWait", next, g, []Option{WithDecisionTimeout(DefaultAckWait)}, "WithDecisionTimeout"},
		{"max wait < 0", next, g, []Option{WithMaxWait(-time.Millisecond)}, "WithMaxWait"},
		{"max wait 0", next, g, []Option{WithMaxWait(0)}, ""},
		{"max wait at half the AckWait", next, g, []Option{WithMaxWait(time.Second),
			WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 2 * time.Second})}, "WithMaxWait"},
		{"concurrency 0", next, g, []Option{WithConcurrency(0)}, "WithConcurrency"},
		{"concurrency 16", next, g, []Option{WithConcurrency(16)}, ""},
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

// TestNewHandlerBadConfig: a handler built from a bad configuration holds
// every message with InProgress instead of NAKing it, so it never uses a
// delivery: with MaxDeliver 2 and AckWait 500 ms the message is still
// pending after 2 s, delivered once, and never NAKed. It reports the
// configuration error once per message, and its goroutine ends when the
// connection closes. The zero Handler does the same.
func TestNewHandlerBadConfig(t *testing.T) {
	g := newGate(t, throttle.PerSecond(100), nil)
	rec := newRecorder()
	cfg := jetstream.ConsumerConfig{MaxDeliver: 2, AckWait: 500 * time.Millisecond}
	tests := []struct {
		name    string
		ackWait time.Duration // the consumer's; cfg.AckWait when 0
		build   func(opts ...Option) jetstream.MessageHandler
	}{
		{"nil handler", 0, func(opts ...Option) jetstream.MessageHandler {
			return NewHandler(nil, g, append(opts, WithConsumerConfig(cfg))...)
		}},
		{"nil gate, consumer from WithConsumer", 0, nil}, // built below, from the consumer
		{"bad option before the error handler", 0, func(opts ...Option) jetstream.MessageHandler {
			return NewHandler(rec.handle, g, append([]Option{WithJitter(-1, 0)}, append(opts, WithConsumerConfig(cfg))...)...)
		}},
		{"bad consumer config, explicit heartbeat", 0, func(opts ...Option) jetstream.MessageHandler {
			return NewHandler(rec.handle, g, append(opts, WithConsumerConfig(jetstream.ConsumerConfig{MaxDeliver: -5}),
				WithHeartbeatInterval(100*time.Millisecond))...)
		}},
		{"AckWait unknown: every second", 1500 * time.Millisecond, func(opts ...Option) jetstream.MessageHandler {
			return NewHandler(rec.handle, g, append(opts, WithDecisionTimeout(-1))...)
		}},
		{"zero Handler", 1500 * time.Millisecond, func(...Option) jetstream.MessageHandler {
			var h Handler // has no error handler or logger
			return h.Handle
		}},
	}
	t.Run("group", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel() // each waits 2 s on a server of its own
				e := newEnv(t)
				naks := e.watch(t, nakAdvisory)
				maxDeliveries := e.watch(t, maxDeliveriesAdvisory)
				ccfg := cfg
				if tt.ackWait > 0 {
					ccfg.AckWait = tt.ackWait
				}
				c := e.consumer(t, ccfg)
				var reported errs
				logs := &lockedBuffer{}
				opts := []Option{WithErrorHandler(reported.handle),
					WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))}
				var handler jetstream.MessageHandler
				if tt.build == nil {
					handler = NewHandler(rec.handle, nil, append(opts, WithConsumer(c))...)
				} else {
					handler = tt.build(opts...)
				}
				var mu sync.Mutex
				var delivered []uint64
				var msgs []*watchedMsg
				e.publish(t, "jobs.cfg", "x", nil)
				consume(t, c, func(m jetstream.Msg) {
					w := &watchedMsg{Msg: m}
					mu.Lock()
					if md, err := m.Metadata(); err == nil {
						delivered = append(delivered, md.NumDelivered)
					}
					msgs = append(msgs, w)
					mu.Unlock()
					handler(w)
				})
				time.Sleep(2 * time.Second)
				mu.Lock()
				if len(delivered) != 1 || delivered[0] != 1 {
					t.Errorf("deliveries seen %v, want one, the first", delivered)
				}
				mu.Unlock()
				info, err := c.Info(testCtx(t))
				if err != nil {
					t.Fatal(err)
				}
				if info.NumAckPending != 1 || info.NumRedelivered != 0 || info.Delivered.Consumer != 1 {
					t.Errorf("NumAckPending %d, NumRedelivered %d, delivered %d: want the message pending, delivered once",
						info.NumAckPending, info.NumRedelivered, info.Delivered.Consumer)
				}
				if a := naks.all(); len(a) > 0 {
					t.Errorf("NAK advisories: %v", a)
				}
				if a := maxDeliveries.all(); len(a) > 0 {
					t.Errorf("MAX_DELIVERIES advisories: %v", a)
				}
				if rec.len() != 0 {
					t.Error("handler ran")
				}
				if n := reported.matching(throttle.ErrInvalidOption); tt.name != "zero Handler" && (n != 1 || len(reported.all()) != 1) {
					t.Errorf("errors = %v, want one ErrInvalidOption", reported.all())
				}
				// Closing the connection ends the holding goroutine: its next
				// InProgress fails, and it returns.
				e.nc.Close()
				waitFor(t, 5*time.Second, "a failed InProgress", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return len(msgs) == 1 && msgs[0].failed.Load()
				})
				if tt.name != "zero Handler" {
					waitFor(t, time.Second, "the end of holding logged", func() bool {
						return strings.Contains(logs.String(), "stopped holding")
					})
				}
			})
		}
	})
	waitFor(t, 5*time.Second, "no holding goroutine", func() bool { return !stalling() })
	var zero Handler
	if err := zero.Close(context.Background()); err != nil {
		t.Errorf("zero Handler Close = %v", err)
	}
}

func TestConfigErrorHeartbeat(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{"AckWait unknown", nil, time.Second},
		{"AckWait known", []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 600 * time.Millisecond})}, 200 * time.Millisecond},
		{"default AckWait read", []Option{WithConsumerConfig(jetstream.ConsumerConfig{MaxDeliver: 3})}, 10 * time.Second},
		{"explicit", []Option{WithHeartbeatInterval(50 * time.Millisecond)}, 50 * time.Millisecond},
		{"bad consumer config not read", []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: -1})}, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _ := newConfig(tt.opts)
			if got := cfg.configErrorHeartbeat(); got != tt.want {
				t.Errorf("heartbeat = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDecisionTimeoutDefault(t *testing.T) {
	tests := []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{"default AckWait 30s: capped", nil, MaxDecisionTimeout},
		{"AckWait 1s", []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: time.Second})}, 250 * time.Millisecond},
		{"shortest BackOff", []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 30 * time.Second,
			BackOff: []time.Duration{400 * time.Millisecond, 6 * time.Second}})}, 100 * time.Millisecond},
		{"floor 10ms", []Option{WithConsumerConfig(jetstream.ConsumerConfig{AckWait: 20 * time.Millisecond})}, 10 * time.Millisecond},
		{"explicit", []Option{WithDecisionTimeout(2 * time.Second)}, 2 * time.Second},
		{"from WithConsumer", []Option{WithConsumer(fakeConsumer{info: &jetstream.ConsumerInfo{
			Config: jetstream.ConsumerConfig{AckWait: 2 * time.Second}}})}, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := newConfig(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.decisionTimeout(); got != tt.want {
				t.Errorf("decision timeout = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestWithConsumer: WithConsumer reads MaxDeliver, AckWait and BackOff from
// the consumer's cached info, as WithConsumerConfig would.
func TestWithConsumer(t *testing.T) {
	backOff := []time.Duration{time.Second, 5 * time.Second}
	tests := []struct {
		name       string
		cons       jetstream.Consumer
		maxDeliver int
		ackWait    time.Duration
		backOff    []time.Duration
	}{
		{"nil keeps the defaults", nil, 0, DefaultAckWait, nil},
		{"server defaults", fakeConsumer{info: &jetstream.ConsumerInfo{
			Config: jetstream.ConsumerConfig{MaxDeliver: -1, AckWait: 30 * time.Second}}}, 0, 30 * time.Second, nil},
		{"all three", fakeConsumer{info: &jetstream.ConsumerInfo{
			Config: jetstream.ConsumerConfig{MaxDeliver: 4, AckWait: 10 * time.Second, BackOff: backOff}}}, 4, 10 * time.Second, backOff},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := newConfig([]Option{WithConsumer(tt.cons)})
			if err != nil {
				t.Fatal(err)
			}
			if cfg.maxDeliver != tt.maxDeliver || cfg.ackWait != tt.ackWait || !slices.Equal(cfg.backOff, tt.backOff) {
				t.Errorf("MaxDeliver %d, AckWait %v, BackOff %v; want %d, %v, %v",
					cfg.maxDeliver, cfg.ackWait, cfg.backOff, tt.maxDeliver, tt.ackWait, tt.backOff)
			}
			if cfg.consumerKnown != (tt.cons != nil) {
				t.Errorf("consumer known = %v", cfg.consumerKnown)
			}
		})
	}
}

// stalling reports whether a goroutine holds a message for a
// misconfigured handler.
func stalling() bool {
	buf := make([]byte, 1<<20)
	return bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("/consumers/nats.(*Handler).stall("))
}

// TestWithConsumerHolds: with MaxDeliver taken from the consumer by
// WithConsumer, a message rejected on its only delivery is held, not NAKed
// into MAX_DELIVERIES, and handled once.
func TestWithConsumerHolds(t *testing.T) {
	e := newEnv(t)
	maxDeliveries := e.watch(t, maxDeliveriesAdvisory)
	c := e.consumer(t, jetstream.ConsumerConfig{MaxDeliver: 1, AckWait: 500 * time.Millisecond})
	rec := newRecorder()
	var reported errs
	h := newHandler(t, rec.handle, newGate(t, throttle.Rate{Count: 1, Per: 600 * time.Millisecond}, nil),
		WithConsumer(c), WithErrorHandler(reported.handle))
	if h.cfg.maxDeliver != 1 || h.cfg.ackWait != 500*time.Millisecond {
		t.Fatalf("MaxDeliver %d, AckWait %v from the consumer, want 1, 500ms", h.cfg.maxDeliver, h.cfg.ackWait)
	}
	e.publish(t, "jobs.cons", "1", nil)
	e.publish(t, "jobs.cons", "2", nil)
	consume(t, c, h.Handle)
	maxHeld := 0
	waitFor(t, 5*time.Second, "2 handled messages", func() bool {
		maxHeld = max(maxHeld, h.Held())
		return rec.len() >= 2
	})
	time.Sleep(700 * time.Millisecond) // past AckWait
	if maxHeld != 1 {
		t.Errorf("at most %d held, want 1", maxHeld)
	}
	if n := rec.len(); n != 2 {
		t.Errorf("handled %d messages, want 2", n)
	}
	if a := maxDeliveries.all(); len(a) > 0 {
		t.Errorf("MAX_DELIVERIES advisories: %v", a)
	}
	if errs := reported.all(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}

// watchedMsg records whether an InProgress failed.
type watchedMsg struct {
	jetstream.Msg
	failed atomic.Bool
}

func (m *watchedMsg) InProgress() error {
	err := m.Msg.InProgress()
	if err != nil {
		m.failed.Store(true)
	}
	return err
}

// fakeConsumer is a jetstream.Consumer with only CachedInfo.
type fakeConsumer struct {
	jetstream.Consumer
	info *jetstream.ConsumerInfo
}

func (c fakeConsumer) CachedInfo() *jetstream.ConsumerInfo { return c.info }

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
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
