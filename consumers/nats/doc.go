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
//	cc, _ := h.Consume(consumer) // consumer.Consume(h.Handle), buffering no more than it runs
//	...
//	cc.Drain()
//	h.Close(ctx)
//
// NewHandler is the same without Close and without an error return.
//
// Where the key is a token of the subject (jobs.<tenant>), ConsumeByKey
// pulls each key from a consumer of its own, in the order of the fair
// shares of the handlers, so that a message is pulled only when it can
// start:
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
// The handler extracts the producer's trace context from the message
// headers with the configured propagator (default the global one) through
// a HeaderCarrier, which matches `traceparent` whatever its case, and
// starts a CONSUMER span named "process <subject>" as its child. The span
// carries the messaging attributes of semconv v1.43.0: messaging.system
// "nats", messaging.destination.name (the subject), messaging.operation.type
// "process", messaging.operation.name "process", messaging.message.body.size,
// and, for a JetStream message, messaging.message.id (the stream sequence),
// messaging.consumer.group.name (the consumer) and nats.num_delivered (the
// delivery count, NumDeliveredAttr). It also carries throttle.disposition
// (DispositionAttr) and, for a held message, throttle.held. The Gate's
// decision span, throttle.admit, is a child of the process span. The
// wrapped handler can get the span's context with ContextFromMsg.
//
// The key (default: the subject; WithKeyFunc) and cost (default 1;
// WithCostFunc) of the message go to Gate.AdmitID with the message's
// identity, its stream name and stream sequence ("JOBS:42", the same on
// every delivery and for every consumer; Gate.Admit for a message without
// metadata), under a context deadline: the decision timeout (see below).
// Then:
//
//   - Admitted: the wrapped handler runs and owns the acknowledgement
//     (with WithInFlight, once it has an in-flight slot: see In-flight
//     limits). A redelivery of a message already admitted (AckWait passed, another
//     worker) is admitted again without a second charge while the limiter
//     still counts it.
//   - Rejected with a reserved slot (Decision.Reserved, with a Gate built
//     with throttle.WithReservations and a limiter that implements
//     throttle.IDLimiter): the message goes back once, to its own slot.
//     A slot at most WithMaxWait ahead (default 1 s, at most a quarter of
//     AckWait) is waited for in process, on a goroutine of its own; a
//     further one is NAKed to come back half of WithMaxWait before the
//     slot, without jitter, and then waits in process for the rest: the
//     server redelivers late when many messages are pending (it checks a
//     long pending list only between acks), and a late claim would push
//     the slots after it. On the redelivery the message is admitted on
//     its reservation. A delivery is never kept in process for more than
//     half its AckWait: a message whose slot keeps moving goes back to the
//     server instead. A wait restarts the message's AckWait as it starts
//     (InProgress), since the time the message sat in the client's
//     buffer before Handle is not known. When the server delivers the message again while a
//     delivery of it waits here (a restarted server redelivers what it had
//     pending), only the newest delivery runs the wrapped handler: the
//     earlier one is dropped when its wait ends or, if the newer one
//     comes while it is being decided, before it would run; neither
//     acknowledged nor NAKed (DispositionSuperseded), as both would be
//     admitted at the slot, the second for free.
//   - Rejected without a reservation: the message is NAKed with the
//     decision's RetryAfter plus a jitter (WithJitter; default up to 10% of
//     RetryAfter, at most 100 ms), and the wrapped handler does not run. A
//     rejection is not an error: the span status stays unset.
//   - Not decided within the decision timeout (the Gate returns the
//     context's error, context.DeadlineExceeded): NAKed like a rejection,
//     with the Gate's degraded retry-after (throttle.WithDegradedRetryAfter)
//     plus jitter, and the error is reported (see below).
//   - Rejected, or not decided, on its last delivery: held, see below.
//   - Never admissible: a key or cost function error, or a request the
//     Gate refuses as a usage error (throttle.IsUsageError: a cost above the
//     limit, a key the limiter cannot use). Retrying cannot help, so the
//     message is terminated with TermWithReason (the reason shows in the
//     server's MSG_TERMINATED advisory) and the error, wrapping
//     throttle.ErrInvalidKey or throttle.ErrInvalidCost, goes to the error
//     handler. Note that Term counts as an acknowledgement: on a WorkQueue
//     or Interest stream the message may be removed.
//
// Errors (a failed Nak, InProgress or Term, the errors above, a decision
// timeout, ErrClosed) go to the error handler (WithErrorHandler; default
// none), to the logger (WithLogger; default none) and to the span
// (RecordError, status Error). So do store failures, rate limited: a
// decision the Gate's failure policy made because the limiter failed
// (Decision.Err) is reported as a *throttle.StoreError, at most 3 at once
// and then 2 per second per Handler, each counting the failures left
// unreported since the previous one (the Gate's span records every one).
//
// A message whose Metadata fails (not a JetStream message) is still
// decided; its delivery count is unknown, so it is never held.
//
// # Reservations and MaxAckPending
//
// A message NAKed to its slot stays pending on the server until it comes
// back, so it counts against the consumer's MaxAckPending (default 1,000):
// with reservations, a flood of one key would fill it and stop the
// deliveries of every other key. Set MaxAckPending above the backlog the
// horizon allows (up to Count × horizon / Per messages per key), or -1.
//
// # Concurrency
//
// By default the Consume callback decides one message at a time (see the
// decision timeout below). WithConcurrency(n) decides and handles up to n
// messages at once, each on a goroutine of its own: with a Redis limiter
// every decision is a round trip, and one at a time falls behind a burst
// of thousands of messages, while the messages that come back to their
// slots meanwhile wait in the client's buffer and claim late. The
// messages the client buffers (jetstream.PullMaxMessages, default 500)
// wait while the n run, and their AckWait runs meanwhile: with handlers
// that take long, keep PullMaxMessages at about n (Handler.Consume does),
// so that each is decided well within AckWait. Otherwise the server redelivers a message whose
// first copy is still buffered, and both copies are handled (the worker
// example, at 16 at once and a 1 s handler, handled 113 of 368 jobs twice
// with the default, none with PullMaxMessages(16)).
//
// The throttle restarts a message's AckWait (InProgress) only while the
// message waits for its slot; once the handler runs, the message is the
// handler's. A handler that can run longer than AckWait must call
// msg.InProgress() more often than AckWait itself, or the server
// redelivers the message while it runs and it is handled twice.
//
// # Fair shares
//
// When handlers, not rates, are the bottleneck (a handler that calls a
// partner for a few hundred milliseconds), a key whose backlog is within
// its rate fills every handler and every other key waits behind it in the
// stream. With WithConcurrency(n) the n handlers are shared across keys,
// on by default (WithFair(false) turns it off: first come, first served,
// as before):
//
//   - Max-min fair, weighted (WithWeights; default 1 each): a key's share
//     is what it needs, up to its weight's part of what the keys needing
//     less leave over. A key that needs less than its share is served
//     first and never waits behind one that needs more; keys that need
//     more get the handlers in proportion to their weights (start-time
//     fair queuing by handler time). The heavy keys' starts are paced and
//     a handler is kept for the light ones when none is about to end, so
//     that handlers of equal length do not finish in lockstep with a
//     light message waiting for the next round (see internal/fair).
//   - A message's rate decides as it starts waiting for its handler (not
//     once it has one, which would push a key that sends at its rate
//     later with every wait), and its in-flight slot (WithInFlight) once
//     it has a handler: a message refused a slot waits for one of its
//     key's handlers to end, charged once, never NAKed in a loop.
//
// How messages reach the handlers decides what the flood costs:
//
//   - ConsumeByKey (the key is a subject token): each key has a consumer
//     of its own, and its next message is pulled only while fewer than two
//     of it wait here. A message its rate refuses waits in process with
//     InProgress heartbeats, its key's others in the stream. Nothing is
//     NAKed: each message is delivered once. A new key is found within
//     DiscoverInterval (20 ms) by listing the stream's subjects.
//   - Handle, with one consumer for every key (a key from a header, or
//     keys that are not subject tokens): messages come in stream order,
//     so the flood's must be moved out of the way to reach the others. A
//     message waits here for its handler up to WithMaxWait (and half its
//     AckWait), within its key's part of the waiting room (twice its
//     share; 4n in all); beyond that it is deferred once: NAKed, not
//     charged, to come back half of WithMaxWait before its key's share
//     reaches it (the reservation idea applied to handler time,
//     throttle.deferred on the span). Its delay is planned at the share
//     its key has then: if other keys go quiet before it comes back, the
//     key's larger share goes unused until it does (the server cannot be
//     asked for a NAKed message sooner). Handle does not block the
//     Consume callback, except before any handler has ended, while the
//     waiting room is full (nothing can be deferred yet).
//
// Messages held in process: with ConsumeByKey at most two per key waiting
// for a handler (and one per key waiting for its rate); with Handle at
// most 4n waiting for a handler, and those that came back from a deferral
// or wait for a near reserved slot.
//
// Measured with examples/worker (16 handlers of 300 ms, -work 300ms, in
// memory; ConsumeByKey): 3,000 jobs of one tenant at t=0 beside tenants
// sending 10/s and 5/s exactly at their rates (testdata/fairshare.jsonl):
// the calm tenants' p99 waits 98-109 ms and 100-124 ms, 0 NAKs, 3,900
// deliveries for 3,900 jobs, the run 1.02 times the handler time; first
// come, first served (-fair=false), the calm tenant waited 55.8 s at the
// median (p99 56.6 s) behind the flood and was NAKed 576 times, 4,764
// deliveries, the run 1.59 times the handler time. Two floods weighted 3 and 1 beside a calm
// tenant (testdata/weights.jsonl): starts in ratio 2.96-3.04 in every 5
// s, Jain's index of the weight-normalized starts per second at least
// 0.998. With -inflight 8 the flood ran 1.006 times as long as 8 slots
// allow it, with 0 NAKs.
//
// # Decision timeout
//
// The Consume callback decides one message at a time, and the messages the
// client has buffered wait behind it while their AckWait runs: a limiter
// that hangs (a store that does not answer) would otherwise hold them all
// past AckWait, and the server would redeliver them while the stale copies
// are still waiting, so that a message could be handled twice. So every
// Gate.Admit, in the Consume callback and for held messages, gets a
// deadline: by default a quarter of the shortest of AckWait and the
// BackOff entries, at most MaxDecisionTimeout (5 s, which is the default
// for the default AckWait of 30 s); WithDecisionTimeout sets it. When it passes the
// message is NAKed (or held, on its last delivery) as above. The limiter
// must honour its context (the limiters of this module do). While the
// limiter hangs, a message buffered behind k others waits up to k decision
// timeouts before its own decision starts: with a short AckWait, keep
// jetstream.PullMaxMessages small enough that the buffer is decided within
// AckWait.
//
// # MaxDeliver, AckWait and holding
//
// Every NAK, with or without a delay, uses one of the consumer's
// MaxDeliver deliveries, and a message NAKed on its last delivery is not
// delivered to the consumer again (the server emits a MAX_DELIVERIES
// advisory; the message stays in the stream). Throttling alone must never
// do that, so the handler needs the consumer's MaxDeliver, AckWait and
// BackOff: pass them with WithConsumer (from the consumer's cached info)
// or WithConsumerConfig. One of the two is required for the guarantee:
// without either, MaxDeliver is taken as unlimited, a message is never
// held, and one rejected on its last delivery is NAKed and not delivered
// to the consumer again.
//
// A rejected (or undecided) message whose NumDelivered has reached
// MaxDeliver is not NAKed but held: a goroutine of its own keeps it from redelivery with
// InProgress heartbeats (by default every third of the shortest of
// AckWait, default 30 s, and the BackOff entries; WithHeartbeatInterval),
// which reset the server's ack timer without using a delivery, and asks
// the Gate again each time the retry-after (plus jitter) has passed, until
// the message is admitted. Each of these decisions is bounded by the
// decision timeout too, and a heartbeat is sent before one that could
// otherwise delay the next heartbeat. Then the wrapped handler runs on
// that goroutine, after one more InProgress so it has a full AckWait. Set MaxDeliver high
// enough for real failures: throttling uses the deliveries below the last
// one, and holds messages on the last. A message admitted after being held
// is on its last delivery: if the wrapped handler NAKs it or lets AckWait
// pass, the server will not deliver it to the consumer again.
//
// So the wrapped handler may run on the Consume callback goroutine, on
// held-message goroutines and on goroutines that waited for a slot at the
// same time: it must be safe for concurrent use. The Consume callback itself never waits for a retry-after: a held
// message does not delay the decisions on the messages behind it. Held
// messages count against the consumer's MaxAckPending.
//
// Close stops holding: it waits, up to its context, for the held messages
// to be admitted and handled; those still held when the context ends are
// left unacknowledged and reported with ErrClosed. Being on their last
// delivery, the server will not deliver them to this consumer again after
// AckWait (they stay in the stream). Give Close enough time.
//
// # Backoff on a 429
//
// When the partner a handler calls answers 429 with Retry-After: d, the
// handler calls [Backoff](msg, d) and returns without acknowledging msg:
//
//	func handle(msg jetstream.Msg) {
//		resp, err := callPartner(msg.Data())
//		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
//			_ = natsthrottle.Backoff(msg, retryAfter(resp))
//			return
//		}
//		...
//		_ = msg.Ack()
//	}
//
// Backoff pauses the message's key in the Gate's limiter for d
// (throttle.Gate.Pause: in Redis, for every worker), so the key's other
// messages are rejected and NAKed until d has passed, and puts msg back
// once the handler has returned: waiting in process when d is within
// WithMaxWait (no delivery used), else NakWithDelay(d plus jitter), which
// uses one delivery like any NAK, or, on the last delivery, held with
// InProgress heartbeats (no delivery used), so Backoff alone never makes
// the server drop a message at MaxDeliver. It comes back after d and is
// admitted on its id without a second charge.
//
// # In-flight limits
//
// WithInFlight(l, lease) adds a limit on how many messages of a key the
// wrapped handler has at once, across every process that shares l's store
// (concurrency.NewRedis; concurrency.NewMemory for one process): the shape
// of a downstream that allows N requests at a time, whatever they take.
// l is any throttle.InFlightLimiter; this package does not import package
// concurrency. For each message the handler acquires a slot of the same
// key in l, for lease, with the message's id (stream name + ":" + stream
// sequence, the id of Gate.AdmitID; a random one for a message without
// metadata), bounded by the decision timeout: without fair shares before
// the Gate decides, so that a message refused a slot is never charged by
// the rate; with them once the message has its handler, its rate having
// decided as it started waiting (see Fair shares):
//
//   - Acquired: the wrapped handler runs with the slot (throttle.in_flight
//     "acquired" on the span). The slot is renewed every third of lease on
//     a goroutine of its own while the handler runs, and with every
//     InProgress the handler sends; it is released at the first of: the
//     handler returning (or panicking), or an Ack, DoubleAck, Nak,
//     NakWithDelay, Term or TermWithReason of the message succeeding. So a
//     slot is never held after the handler is done with its message,
//     except by a process that died, whose slots come back when their
//     leases end (at most lease later). A handler that hands its message
//     to another goroutine and returns has released the slot: the limit
//     counts the handler's run. A slot taken for a message the Gate then
//     rejects is released at once.
//   - Refused (every slot held; "rejected"): with fair shares the message
//     waits in process for one of its key's handlers to end here (or for
//     the refusal's RetryAfter, the time until the earliest lease of the
//     key ends, when the slots are held elsewhere), admitted and charged
//     once, and runs then. Without them it goes back like a rate
//     rejection, uncharged: NAKed with the refusal's RetryAfter plus
//     jitter (WithJitter), or, on its last delivery, held with InProgress
//     and asked again (slot, then Gate) each time that has passed, so
//     refusals never use up MaxDeliver. (Before this order, under a
//     backlog far beyond the in-flight limit, refusals used up rate: the
//     worker example, 3,000 jobs of 300 ms at up to 150/s and 8 at once,
//     took 11,019 NAKs where the rate alone kept 2,863 jobs from starting
//     on arrival; with fair shares, 0.)
//   - The limiter fails ("error"): the error goes to the error handler, and
//     the Gate's failure policy decides: FailOpen runs the handler without
//     a slot, FailClosed NAKs (or holds) the message with the Gate's
//     degraded retry-after (throttle.WithDegradedRetryAfter). A failed
//     Renew or Release is reported too; a Release that fails leaves the
//     slot to its lease.
//
// The RetryAfter of a refusal is an upper bound (a slot may be released
// sooner), and the refused messages of a key come back about once a lease:
// pick a short lease, a few renewal round trips long (renewals keep long
// jobs' slots), e.g. 500 ms to 1 s, well below AckWait. Each in-flight
// call is a store round trip: an acquisition, a renewal every lease/3 and
// a release per message.
//
// # Configuration errors
//
// New validates and returns errors wrapping throttle.ErrInvalidOption, so
// a bad configuration is caught at start-up. NewHandler has no error
// return and does not panic: with a bad configuration (a nil handler or
// Gate, an invalid option) it returns a handler that never runs the
// wrapped handler and never uses up a delivery. A NAK would use one, so it
// holds every message instead, unhandled, on a goroutine of its own with
// InProgress heartbeats (every second, or a third of the AckWait when
// WithConsumer or WithConsumerConfig was read, or WithHeartbeatInterval),
// and reports the configuration error once per message to the error
// handler, the logger and the span (throttle.disposition "stalled"). Each
// message is held until an InProgress fails: the connection is closed or
// the message was acknowledged through the same jetstream.Msg. So a
// misconfigured consumer stalls, up to MaxAckPending messages, instead of
// losing messages; once the process is fixed and restarted they come back
// after AckWait, each on its next delivery. If the AckWait is below a
// second and not configured, the heartbeats come too late and every
// AckWait uses a delivery.
package natsthrottle
