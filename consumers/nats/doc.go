// Package natsthrottle gates JetStream message handlers with a
// throttle.Gate: every message a consumer delivers is decided before the
// handler runs; admitted messages run, rejected ones go back to the server
// with a delay, and every decision is traced with OpenTelemetry.
//
// Quick start:
//
//	lim, _ := window.NewMemory(throttle.PerSecond(20))
//	gate, _ := throttle.NewGate(lim, throttle.WithReservations(time.Minute))
//	h, err := natsthrottle.New(handle, gate, natsthrottle.WithConsumer(consumer))
//	cc, _ := h.Consume(consumer) // pulls no more than it runs
//	...
//	cc.Drain()
//	h.Close(ctx)
//
// NewHandler is the same without Close and without an error return.
//
// Where the key is a token of the subject (jobs.<tenant>), ConsumeByKey
// pulls each key from a consumer of its own, in the order of the fair
// shares of the handlers, so that a message is pulled only when it can
// start (or, for a key of mixed costs, the key's messages before it hold
// their reserved slots):
//
//	h, err := natsthrottle.New(handle, gate, natsthrottle.WithConcurrency(16),
//		natsthrottle.WithConsumerConfig(cfg)) // cfg.FilterSubject "jobs.*", the key the tenant
//	kc, err := h.ConsumeByKey(stream, cfg)
//	...
//	kc.Stop()
//	h.Close(ctx)
//
// # Each message
//
// The handler starts a CONSUMER span "process <subject>" (semconv
// messaging attributes, the producer's trace context from the headers;
// ContextFromMsg gives it to the wrapped handler). It asks Gate.AdmitID
// with the message's key (WithKeyFunc; default the subject), cost
// (WithCostFunc; default 1) and id (stream name ":" stream sequence, the
// same on every delivery), within the decision timeout. Then:
//
//   - Admitted: the wrapped handler runs and owns the acknowledgement. A
//     redelivery of an admitted message is not charged again.
//   - Rejected with a reserved slot (throttle.WithReservations): the
//     message goes back once, to its slot. A slot within WithMaxWait
//     (default 1 s) is waited for in process; a further one is NAKed to
//     come back just before it, then waits the rest.
//   - Rejected without a reservation: NAKed with RetryAfter plus jitter
//     (WithJitter).
//   - Not decided within the decision timeout (WithDecisionTimeout;
//     default a quarter of AckWait, at most 5 s): NAKed with the Gate's
//     degraded retry-after; the error is reported.
//   - Rejected or undecided on its last delivery (MaxDeliver): held, with
//     InProgress heartbeats, and decided again; never NAKed into loss.
//   - Never admissible (a key or cost error, throttle.IsUsageError):
//     terminated with TermWithReason, and reported.
//
// Errors go to WithErrorHandler, WithLogger and the span. Store failures
// decided by the Gate's failure policy are reported as
// *throttle.StoreError, rate limited.
//
// # What the handler must know
//
//   - Pass the consumer's settings (WithConsumer or WithConsumerConfig):
//     without MaxDeliver, AckWait and BackOff a message rejected on its
//     last delivery would be lost to this consumer.
//   - With reservations, set MaxAckPending above the backlog the horizon
//     allows, or -1: NAKed messages stay pending.
//   - WithConcurrency(n) decides and handles n messages at once. Consume
//     with Handler.Consume, which keeps the client's buffer at n: a
//     buffered message's AckWait runs while it waits.
//   - The wrapped handler may run on several goroutines at once: it must
//     be safe for concurrent use. One that can run longer than AckWait
//     calls msg.InProgress() more often than that.
//   - Close waits, up to its context, for the messages it holds; those
//     still held then are on their last delivery: give it enough time.
//
// # Fair shares
//
// With WithConcurrency(n) the n handlers are shared across keys, max-min
// fair and weighted (WithWeights; WithFair(false) for first come, first
// served): a key that needs less than its share never waits behind one
// that needs more. ConsumeByKey (the key a subject token) pulls each key
// from a consumer of its own, only when its message can start or, for a
// key of mixed costs, the key's messages before it hold their reserved
// slots (at most 64 waiting for them: its backlog keeps its exact
// schedule): nothing is NAKed. With Handle on one consumer, a message beyond its key's part of
// the waiting room is deferred once, NAKed to when its share reaches it.
//
// # Backoff and in-flight limits
//
// A handler whose partner answers 429 calls [Backoff](msg, d) and returns
// without acknowledging: the key is paused for d in the Gate's limiter
// (for every worker, in Redis) and the message comes back after d, with no
// retry budget spent. WithInFlight(l, lease) bounds how many messages of
// a key run at once across processes, each holding a slot under a lease
// renewed while its handler runs and released when it is done; a message
// refused a slot is never charged by the rate.
//
// # Core NATS
//
// Core wraps a nats.MsgHandler (plain subscriptions, queue groups,
// request-reply) with the same Gate, keys, costs and limits. Core NATS
// has no NAK and no redelivery: a refused message waits in process for its
// slot, bounded by WithCoreMaxWait and WithCoreMaxWaiting per key, and is
// otherwise given up, never silently: a request gets an error reply at once
// (Nats-Service-Error-Code 429, Nats-Service-Error, Retry-After), and
// every give-up goes to the error handler, the logger and a counter. The
// Core reports the messages NATS drops from a slow subscription;
// WithCoreInFlight adds an in-flight limit. WithCoreConcurrency(n) runs n
// handlers, shared among keys by the same fair shares as the JetStream
// Handler's, so that the subscription never waits for a handler and a
// calm key never waits behind a flood.
//
// # Configuration errors
//
// New returns errors wrapping throttle.ErrInvalidOption. NewHandler,
// which has no error return, holds every message unhandled with
// InProgress heartbeats and reports the error instead: a misconfigured
// consumer stalls, it never loses messages.
//
// The guide, docs/consumers.md in the repository ("JetStream in
// detail"), gives every rule, the measured figures and the reasons.
package natsthrottle
