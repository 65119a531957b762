package natsthrottle

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// CoreOption configures a Core.
type CoreOption func(*coreConfig)

type coreConfig struct {
	key        func(*nats.Msg) (string, error)
	cost       func(*nats.Msg) (int, error)
	maxWait    time.Duration
	maxWaiting int
	maxTotal   int
	onError    func(*nats.Msg, error)
	logger     *slog.Logger
	inFlight   throttle.InFlightLimiter
	lease      time.Duration
	handlers   int                  // WithCoreConcurrency; 0: the subscription's goroutine
	noFair     bool                 // WithCoreFair(false)
	weights    func(string) float64 // nil: every key 1
}

// WithCoreKeyFunc sets the message's key (default: its subject).
func WithCoreKeyFunc(f func(*nats.Msg) (string, error)) CoreOption {
	return func(c *coreConfig) { c.key = f }
}

// WithCoreCostFunc sets the message's cost (default 1).
func WithCoreCostFunc(f func(*nats.Msg) (int, error)) CoreOption {
	return func(c *coreConfig) { c.cost = f }
}

// WithCoreMaxWait sets how long a message may wait in process, from its
// arrival, for its slot (default DefaultCoreMaxWait); a message whose slot
// lies beyond is given up at once. It must be >= 0 (0 gives up every
// message the limit refuses).
func WithCoreMaxWait(d time.Duration) CoreOption { return func(c *coreConfig) { c.maxWait = d } }

// WithCoreMaxWaiting sets how many messages of one key may wait at once
// for their slot (default DefaultCoreMaxWaiting): refused by the limit, or
// (WithCoreConcurrency) waiting for their key's share of the handlers;
// beyond, such a message is given up at once. It must be >= 0.
func WithCoreMaxWaiting(n int) CoreOption { return func(c *coreConfig) { c.maxWaiting = n } }

// WithCoreMaxWaitingTotal sets how many messages may wait in process at
// once over every key (default DefaultCoreMaxWaitingTotal), for their slot
// or (WithCoreConcurrency) a handler; beyond, a message that would wait
// is given up at once. Memory is bounded by it: each waiting message holds
// its *nats.Msg and a goroutine (a few KiB). It must be >= 0, and >= 1
// with WithCoreConcurrency (where every message waits for a handler in
// process, if only a moment).
func WithCoreMaxWaitingTotal(n int) CoreOption { return func(c *coreConfig) { c.maxTotal = n } }

// WithCoreErrorHandler sets what gets every give-up (a *GiveUpError) and
// every slow-consumer report (NATS dropped messages of the subscription,
// an error wrapping nats.ErrSlowConsumer).
func WithCoreErrorHandler(f func(*nats.Msg, error)) CoreOption {
	return func(c *coreConfig) { c.onError = f }
}

// WithCoreInFlight adds an in-flight limit (see WithInFlight): a message
// holds a slot of its key in l, under lease (renewed every third of it
// while the handler runs, released when it returns). Without
// WithCoreConcurrency it takes the slot before the Gate decides it, so a
// message refused a slot is never charged by the rate; refused, it waits
// for the refusal's RetryAfter like a rate rejection, within the same
// bounds. With WithCoreConcurrency it takes the slot once a handler is
// its (as the JetStream Handler does); refused, it keeps its admission
// and waits for one of its key's handlers to end (or the earliest lease). When l fails, the Gate's failure policy decides:
// FailOpen runs the handler without a slot, FailClosed waits. lease must
// be > 0.
func WithCoreInFlight(l throttle.InFlightLimiter, lease time.Duration) CoreOption {
	return func(c *coreConfig) { c.inFlight, c.lease = l, lease }
}

// WithCoreLogger logs the give-ups and slow-consumer reports.
func WithCoreLogger(l *slog.Logger) CoreOption { return func(c *coreConfig) { c.logger = l } }

// WithCoreConcurrency runs the handler for up to n messages at once, each
// on a goroutine of its own, and shares the n handlers among keys by fair
// shares (WithCoreFair): Handle then returns at once, so the subscription
// never waits for a handler, and a message waits in process for its
// handler as for its slot, within WithCoreMaxWait and WithCoreMaxWaiting
// (both count the wait for a handler too). The rate decides a message as
// it arrives; a message of a key above its share of the handlers waits
// uncharged until the share reaches it, and is given up at once when that
// lies beyond WithCoreMaxWait. n must be >= 1; 0 (the default) runs an
// admitted message's handler on the subscription's goroutine and a
// waiting one's on its own, without a bound on how many run at once.
func WithCoreConcurrency(n int) CoreOption { return func(c *coreConfig) { c.handlers = n } }

// WithCoreFair turns the fair shares of the WithCoreConcurrency handlers
// on (the default) or off: max-min fair shares, weighted (WithCoreWeights),
// so that a key using less than its share never waits behind one using
// more (see Fair shares in the package documentation, and WithFair). Off,
// the handlers go to the messages the rate admitted, first come, first
// served.
func WithCoreFair(on bool) CoreOption { return func(c *coreConfig) { c.noFair = !on } }

// WithCoreWeights sets each key's weight in the fair shares, as
// WithWeights does for the JetStream Handler. Nil keeps every key at 1.
func WithCoreWeights(f func(key string) float64) CoreOption {
	return func(c *coreConfig) {
		if f != nil {
			c.weights = f
		}
	}
}
