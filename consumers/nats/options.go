package natsthrottle

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Defaults of the options.
const (
	// DefaultAckWait is the AckWait assumed when WithConsumerConfig is not
	// given or its AckWait is 0: the server's default.
	DefaultAckWait = 30 * time.Second
	// DefaultJitterFraction and DefaultJitterMax bound the random delay
	// added to every NAK delay and hold: up to 10% of the retry-after, at
	// most 100 ms.
	DefaultJitterFraction = 0.1
	DefaultJitterMax      = 100 * time.Millisecond
	// MaxDecisionTimeout caps the default decision timeout (see
	// WithDecisionTimeout): a quarter of the shortest ack wait, at most
	// 5 s.
	MaxDecisionTimeout = 5 * time.Second
	// configErrorHeartbeat is how often a handler built from a bad
	// configuration sends InProgress for the messages it holds when the
	// consumer's AckWait is not known (see NewHandler).
	configErrorHeartbeat = time.Second
	// DefaultMaxWait is how close a reserved slot must be for the message
	// to wait for it in process instead of a NAK (see WithMaxWait).
	DefaultMaxWait = time.Second
	// minHeartbeat is the shortest interval between InProgress heartbeats,
	// and the shortest default decision timeout.
	minHeartbeat = 10 * time.Millisecond
)

// Option configures a Handler. Options that get a nil value keep the
// default.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	keyFunc        func(jetstream.Msg) (string, error)
	costFunc       func(jetstream.Msg) (int, error)
	maxDeliver     int
	ackWait        time.Duration
	backOff        []time.Duration
	heartbeat      time.Duration // 0: derived from ackWait and backOff
	decision       time.Duration // 0: derived from ackWait and backOff
	consumerKnown  bool          // WithConsumerConfig or WithConsumer applied
	jitterFraction float64
	jitterMax      time.Duration
	maxWait        time.Duration // < 0: not set, the default applies
	concurrency    int
	noFair         bool                     // WithFair(false)
	weights        func(string) float64     // nil: every key 1
	inFlight       throttle.InFlightLimiter // nil: no in-flight limit
	lease          time.Duration            // of every in-flight slot
	tracerProvider trace.TracerProvider
	propagators    propagation.TextMapPropagator
	onError        func(jetstream.Msg, error)
	logger         *slog.Logger
}

func subjectKey(m jetstream.Msg) (string, error) { return m.Subject(), nil }

// newConfig applies opts over the defaults. It applies every option even
// after one fails, so that the error handler, logger and tracer of a bad
// configuration can still report it; the first error is returned.
func newConfig(opts []Option) (config, error) {
	c := config{
		keyFunc:        subjectKey,
		ackWait:        DefaultAckWait,
		jitterFraction: DefaultJitterFraction,
		jitterMax:      DefaultJitterMax,
		maxWait:        -1,
	}
	var first error
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&c); err != nil && first == nil {
			first = err
		}
	}
	if first == nil && c.decision >= c.shortestAckWait() {
		first = &throttle.OptionError{Field: "WithDecisionTimeout",
			Reason: fmt.Sprintf("%v must be below the consumer's shortest ack wait %v (AckWait and BackOff)", c.decision, c.shortestAckWait())}
	}
	if c.maxWait < 0 {
		c.maxWait = min(DefaultMaxWait, c.shortestAckWait()/4)
	} else if first == nil && c.maxWait >= c.shortestAckWait()/2 {
		first = &throttle.OptionError{Field: "WithMaxWait",
			Reason: fmt.Sprintf("%v must be below half the consumer's shortest ack wait %v", c.maxWait, c.shortestAckWait())}
	}
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
	}
	if c.propagators == nil {
		c.propagators = otel.GetTextMapPropagator()
	}
	return c, first
}

// heartbeatInterval is how often a held message is sent InProgress: a third
// of the shortest time the server may wait for an ack (AckWait, or the
// shortest BackOff entry when BackOff is set), and at least 10 ms.
func (c *config) heartbeatInterval() time.Duration {
	if c.heartbeat > 0 {
		return c.heartbeat
	}
	return max(c.shortestAckWait()/3, minHeartbeat)
}

// decisionTimeout bounds every Gate.Admit: by default a quarter of the
// shortest ack wait, at most MaxDecisionTimeout and at least 10 ms.
func (c *config) decisionTimeout() time.Duration {
	if c.decision > 0 {
		return c.decision
	}
	return max(min(c.shortestAckWait()/4, MaxDecisionTimeout), minHeartbeat)
}

// shortestAckWait is the shortest time the server may wait for an ack
// before it redelivers: AckWait, or the shortest BackOff entry when
// BackOff is set.
func (c *config) shortestAckWait() time.Duration {
	d := c.ackWait
	for _, b := range c.backOff {
		d = min(d, b)
	}
	return d
}

// configErrorHeartbeat is how often a handler built from a bad
// configuration sends InProgress for each message it holds: the
// heartbeat interval when the consumer's AckWait or the interval itself
// was configured, otherwise every second.
func (c *config) configErrorHeartbeat() time.Duration {
	if c.heartbeat > 0 || c.consumerKnown {
		return c.heartbeatInterval()
	}
	return configErrorHeartbeat
}

// WithKeyFunc sets how a message's limiter key is derived. The default is
// the message subject. A key function that returns an error marks the
// message as one that can never be admitted: it is terminated (see the
// package documentation). Nil keeps the default.
func WithKeyFunc(f func(jetstream.Msg) (string, error)) Option {
	return optionFunc(func(c *config) error {
		if f != nil {
			c.keyFunc = f
		}
		return nil
	})
}

// WithCostFunc sets the cost n charged for a message. The default charges
// 1 per message. An error, like a cost the limiter refuses (n < 1 or more
// than its limit), terminates the message. Nil keeps the default.
func WithCostFunc(f func(jetstream.Msg) (int, error)) Option {
	return optionFunc(func(c *config) error {
		if f != nil {
			c.costFunc = f
		}
		return nil
	})
}

// WithConsumerConfig tells the handler the consumer's MaxDeliver, AckWait
// and BackOff, which it needs to keep throttling from using up deliveries:
// pass the config the consumer was created with (or use WithConsumer).
// Other fields are ignored. Without this option or WithConsumer the handler
// assumes an unlimited MaxDeliver, so it never holds a message, and a
// message rejected on its last delivery is NAKed and not delivered to the
// consumer again: the guarantee that throttling never uses up MaxDeliver
// needs one of the two. When both are given, the last one wins.
//
// MaxDeliver <= 0 means unlimited (the server's default, -1); AckWait 0
// means the server default of 30 s. AckWait < 0, MaxDeliver < -1 or a
// BackOff entry <= 0 is an error wrapping throttle.ErrInvalidOption.
func WithConsumerConfig(cfg jetstream.ConsumerConfig) Option {
	return optionFunc(func(c *config) error { return c.setConsumer("WithConsumerConfig", cfg) })
}

// WithConsumer is WithConsumerConfig(c.CachedInfo().Config): it takes the
// consumer's MaxDeliver, AckWait and BackOff from the info cached when c
// was created or looked up (as the server filled in its defaults). Nil
// keeps the default. A consumer without cached info is an error wrapping
// throttle.ErrInvalidOption.
func WithConsumer(cons jetstream.Consumer) Option {
	return optionFunc(func(c *config) error {
		if cons == nil {
			return nil
		}
		info := cons.CachedInfo()
		if info == nil {
			return &throttle.OptionError{Field: "WithConsumer", Reason: "consumer has no cached info"}
		}
		return c.setConsumer("WithConsumer", info.Config)
	})
}

// setConsumer validates and keeps what the handler needs of cfg; field
// names the option in errors.
func (c *config) setConsumer(field string, cfg jetstream.ConsumerConfig) error {
	if cfg.AckWait < 0 {
		return &throttle.OptionError{Field: field + ".AckWait", Reason: fmt.Sprintf("must be >= 0, got %v", cfg.AckWait)}
	}
	if cfg.MaxDeliver < -1 {
		return &throttle.OptionError{Field: field + ".MaxDeliver", Reason: fmt.Sprintf("must be >= -1, got %d", cfg.MaxDeliver)}
	}
	for i, b := range cfg.BackOff {
		if b <= 0 {
			return &throttle.OptionError{Field: field + ".BackOff", Reason: fmt.Sprintf("entry %d must be > 0, got %v", i, b)}
		}
	}
	c.maxDeliver = max(cfg.MaxDeliver, 0)
	c.ackWait = cfg.AckWait
	if c.ackWait == 0 {
		c.ackWait = DefaultAckWait
	}
	c.backOff = append([]time.Duration(nil), cfg.BackOff...)
	c.consumerKnown = true
	return nil
}

// WithDecisionTimeout bounds every Gate.Admit call, in the Consume
// callback and for held messages, with a context deadline of d: a limiter
// that hangs (a store that does not answer) can then delay a message by at
// most d before the handler gives up on the decision, reports it and NAKs
// the message with the Gate's degraded retry-after (or holds it on its last
// delivery). The default is a quarter of the shortest of AckWait and the
// BackOff entries, at most MaxDecisionTimeout (5 s) and at least 10 ms:
// 5 s for the default AckWait of 30 s. d must be > 0 and below the
// shortest ack wait; otherwise the error wraps throttle.ErrInvalidOption.
// The limiter must honour its context for the bound to hold.
func WithDecisionTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return &throttle.OptionError{Field: "WithDecisionTimeout", Reason: fmt.Sprintf("must be > 0, got %v", d)}
		}
		c.decision = d
		return nil
	})
}

// WithHeartbeatInterval sets how often a held message is reported
// InProgress. The default is a third of the shortest of AckWait and the
// BackOff entries, and at least 10 ms. d must be > 0 and should be well
// below AckWait; otherwise the error wraps throttle.ErrInvalidOption.
func WithHeartbeatInterval(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return &throttle.OptionError{Field: "WithHeartbeatInterval", Reason: fmt.Sprintf("must be > 0, got %v", d)}
		}
		c.heartbeat = d
		return nil
	})
}

// WithJitter sets the random delay added to the retry-after of every NAK
// and hold, so that messages rejected together do not come back together:
// uniform in [0, min(fraction*RetryAfter, maxJitter)]. The default is 0.1
// and 100 ms; WithJitter(0, 0) turns jitter off. fraction must be in
// [0, 1] and maxJitter >= 0; otherwise the error wraps
// throttle.ErrInvalidOption.
func WithJitter(fraction float64, maxJitter time.Duration) Option {
	return optionFunc(func(c *config) error {
		if !(fraction >= 0 && fraction <= 1) {
			return &throttle.OptionError{Field: "WithJitter.fraction", Reason: fmt.Sprintf("must be in [0, 1], got %v", fraction)}
		}
		if maxJitter < 0 {
			return &throttle.OptionError{Field: "WithJitter.maxJitter", Reason: fmt.Sprintf("must be >= 0, got %v", maxJitter)}
		}
		c.jitterFraction, c.jitterMax = fraction, maxJitter
		return nil
	})
}

// WithMaxWait sets how close a reserved slot (a rejection with
// Decision.Reserved, see throttle.WithReservations) must be for the message
// to wait for it in process, on a goroutine of its own, instead of being
// NAKed to it: a NAK costs a delivery and a round trip through the server.
// A message whose slot is further away is NAKed to come back half of
// this before its slot, and waits in process for the rest: the server
// redelivers late by up to 100 ms when many messages are pending, and a
// late claim would push the slots after it. Default DefaultMaxWait
// (1 s), or a quarter of the consumer's shortest ack wait if that is
// shorter; 0 NAKs every reserved rejection to its exact slot; it must be
// >= 0 and below half the consumer's shortest ack wait.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 0 {
			return &throttle.OptionError{Field: "WithMaxWait", Reason: fmt.Sprintf("must be >= 0, got %v", d)}
		}
		c.maxWait = d
		return nil
	})
}

// WithConcurrency makes Handle decide (and run the wrapped handler for) up
// to n messages at once, each on a goroutine of its own; Handle then
// returns once the message is handed to one, and waits while n are busy,
// which holds back the Consume callback. Default 1: every decision on the
// Consume callback's goroutine, one at a time. With a Redis limiter the
// decisions are round trips, so one at a time can fall behind a burst of
// thousands of messages, and the reserved slots of the messages that come
// back meanwhile are then claimed late; 8 to 32 keeps up. The wrapped
// handler must be safe for concurrent use either way (see the package
// documentation); messages are decided in about the order they arrive,
// not strictly. Consume with jetstream.PullMaxMessages(n) or so: the
// messages the client buffers behind the n wait with their AckWait
// running, and a slow handler would let it pass (see Concurrency in the
// package documentation). n must be >= 1.
func WithConcurrency(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return &throttle.OptionError{Field: "WithConcurrency", Reason: fmt.Sprintf("must be >= 1, got %d", n)}
		}
		c.concurrency = n
		return nil
	})
}

// WithFair turns the fair sharing of the handlers across keys on (the
// default) or off. With WithConcurrency(n), the n handlers are shared by
// max-min fair shares, weighted (WithWeights), and a key that uses less
// than its share never waits behind one that uses more: see Fair shares in
// the package documentation. Off, messages are decided and run in about
// the order they arrive, as before (first come, first served), and
// ConsumeByKey refuses to start.
func WithFair(on bool) Option {
	return optionFunc(func(c *config) error {
		c.noFair = !on
		return nil
	})
}

// WithWeights sets the weight of each key in the fair shares: a key of
// weight 3 gets three times the handler starts of a key of weight 1 while
// both have more messages than their shares. f is asked for a key when it
// is first seen and again once its answer is a second old, so a changed
// weight applies within a second; a weight that is not > 0 and finite
// counts as 1. f must be safe for concurrent use and quick (it is called
// on the path of a message). Nil keeps the default: every key 1.
func WithWeights(f func(key string) float64) Option {
	return optionFunc(func(c *config) error {
		if f != nil {
			c.weights = f
		}
		return nil
	})
}

// WithInFlight limits how many messages of a key the wrapped handler has
// at once, across every process sharing l's store (a concurrency.Redis):
// after the Gate admits a message, it acquires a slot of the same key in l
// with the message's id (stream name + ":" + stream sequence, the id of
// Gate.AdmitID) for lease. The slot is renewed every third of lease while
// the wrapped handler runs and with every InProgress the handler sends,
// and released at the first of: the handler returning, or its Ack,
// DoubleAck, Nak, NakWithDelay, Term or TermWithReason succeeding. A
// message refused a slot goes back like a rate rejection: NAKed with the
// rejection's RetryAfter (the time until the earliest lease of the key
// ends) plus jitter, or held on its last delivery. When l errs, the Gate's
// failure policy applies (FailOpen runs the handler without a slot,
// FailClosed NAKs with the Gate's degraded retry-after) and the error goes
// to the error handler. See the package documentation.
//
// lease bounds how long the slot of a process that died stays taken, and
// is the longest a refused message waits: a few times the renewal round
// trip, well below AckWait, e.g. 1 s. lease must be > 0; otherwise the
// error wraps throttle.ErrInvalidOption. A nil l keeps the default: no
// in-flight limit.
func WithInFlight(l throttle.InFlightLimiter, lease time.Duration) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return nil
		}
		if lease <= 0 {
			return &throttle.OptionError{Field: "WithInFlight.lease", Reason: fmt.Sprintf("must be > 0, got %v", lease)}
		}
		c.inFlight, c.lease = l, lease
		return nil
	})
}

// WithTracerProvider sets the provider of the process spans. Nil means the
// global provider (otel.GetTracerProvider()). The Gate's decision spans
// come from the Gate's own provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) error {
		if tp != nil {
			c.tracerProvider = tp
		}
		return nil
	})
}

// WithPropagators sets the propagator that extracts the producer's trace
// context from the message headers. Nil means the global propagator
// (otel.GetTextMapPropagator()).
func WithPropagators(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) error {
		if p != nil {
			c.propagators = p
		}
		return nil
	})
}

// WithErrorHandler sets a function called with every error the handler
// meets for a message: a failed Nak, InProgress or Term, a key or cost
// function error, a request the Gate refuses as a usage error, a decision
// not made within the decision timeout (wrapping the context's error,
// context.DeadlineExceeded), a held message abandoned by Close
// (ErrClosed), a bad configuration (once per message), a failed Acquire,
// Renew or Release of the in-flight limiter (WithInFlight), and a decision
// the Gate's failure policy made because the limiter failed (a
// *throttle.StoreError, matching throttle.ErrStore, for the message whose
// decision it was; at most 3 at once and then 2 per second per Handler,
// each with the number of failures left unreported since the previous
// one: during an outage every decision fails). A rejection is not an
// error. f may be called from the Consume callback and from
// held-message goroutines at the same time. The default does nothing. Nil
// keeps the default.
func WithErrorHandler(f func(jetstream.Msg, error)) Option {
	return optionFunc(func(c *config) error {
		if f != nil {
			c.onError = f
		}
		return nil
	})
}

// WithLogger makes the handler log every error it reports (see
// WithErrorHandler) at level Error, and held messages at level Debug.
// By default it logs nothing. Nil keeps the default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l != nil {
			c.logger = l
		}
		return nil
	})
}
