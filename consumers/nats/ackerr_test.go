package natsthrottle

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// failingMsg is a JetStream-looking message whose acknowledgements fail
// with err. It is safe for concurrent use (a held message is touched by
// its goroutine).
type failingMsg struct {
	md  jetstream.MsgMetadata
	err error

	mu    sync.Mutex
	calls []string
}

func (m *failingMsg) record(op string) error {
	m.mu.Lock()
	m.calls = append(m.calls, op)
	m.mu.Unlock()
	return m.err
}

func (m *failingMsg) count(op string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, c := range m.calls {
		if c == op {
			n++
		}
	}
	return n
}

func (m *failingMsg) Metadata() (*jetstream.MsgMetadata, error) { md := m.md; return &md, nil }
func (m *failingMsg) Data() []byte                              { return []byte("x") }
func (m *failingMsg) Headers() nats.Header                      { return nil }
func (m *failingMsg) Subject() string                           { return "jobs.fail" }
func (m *failingMsg) Reply() string                             { return "$JS.ACK.fake" }
func (m *failingMsg) Ack() error                                { return m.record("ack") }
func (m *failingMsg) DoubleAck(context.Context) error           { return m.record("ack") }
func (m *failingMsg) Nak() error                                { return m.record("nak") }
func (m *failingMsg) NakWithDelay(time.Duration) error          { return m.record("nak") }
func (m *failingMsg) InProgress() error                         { return m.record("wip") }
func (m *failingMsg) Term() error                               { return m.record("term") }
func (m *failingMsg) TermWithReason(string) error               { return m.record("term") }

// TestAckErrorsReported: failed InProgress and Term reach the error
// handler and the logger.
func TestAckErrorsReported(t *testing.T) {
	errBoom := errors.New("boom")
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	var reported errs
	var handled sync.WaitGroup
	g := newGate(t, throttle.Rate{Count: 1, Per: 200 * time.Millisecond}, nil)
	keyErr := errors.New("no key")
	h := newHandler(t, func(m jetstream.Msg) { handled.Done() }, g,
		WithConsumerConfig(jetstream.ConsumerConfig{MaxDeliver: 2}),
		WithHeartbeatInterval(20*time.Millisecond),
		WithKeyFunc(func(m jetstream.Msg) (string, error) {
			if m.Headers() != nil || m.Subject() != "jobs.fail" {
				return "", keyErr
			}
			return "k", nil
		}),
		WithErrorHandler(reported.handle), WithLogger(logger))

	// Admitted, then rejected on its last delivery: held, heartbeats fail.
	handled.Add(2)
	h.Handle(&failingMsg{md: jetstream.MsgMetadata{NumDelivered: 1, Sequence: jetstream.SequencePair{Stream: 1}}, err: errBoom})
	held := &failingMsg{md: jetstream.MsgMetadata{NumDelivered: 2, Sequence: jetstream.SequencePair{Stream: 2}}, err: errBoom}
	h.Handle(held)
	if h.Held() != 1 {
		t.Fatalf("Held() = %d, want 1", h.Held())
	}
	handled.Wait() // admitted after about 200 ms
	if n := held.count("wip"); n < 3 {
		t.Errorf("%d InProgress calls, want the first, heartbeats and one before the handler", n)
	}
	if n := held.count("nak"); n != 0 {
		t.Errorf("held message NAKed %d times", n)
	}
	if n := reported.matching(errBoom); n != held.count("wip") {
		t.Errorf("%d errors matching boom for %d failed InProgress", n, held.count("wip"))
	}

	// Term fails: both the cause and the Term error are reported.
	before := len(reported.all())
	term := &failingMsg{md: jetstream.MsgMetadata{NumDelivered: 1}, err: errBoom}
	h.Handle(&plainKeyErr{failingMsg: term})
	errs := reported.all()[before:]
	if len(errs) != 2 || !errors.Is(errs[0], keyErr) || !errors.Is(errs[1], errBoom) {
		t.Errorf("reported %v, want the key error then the failed term", errs)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "natsthrottle: message error") || !strings.Contains(logs.String(), "boom") {
		t.Errorf("log = %q", logs.String())
	}
}

// plainKeyErr makes the key function of TestAckErrorsReported fail.
type plainKeyErr struct{ *failingMsg }

func (plainKeyErr) Subject() string { return "jobs.nokey" }

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
