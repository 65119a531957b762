// Package asynqthrottle gates asynq task handlers with a throttle.Gate:
// every task is decided before its handler runs; admitted tasks run,
// rejected ones come back after their retry-after without using up a
// retry, and every decision is traced with OpenTelemetry.
//
// # Wiring
//
// Three pieces go together: the middleware, and two asynq.Config hooks.
//
//	cfg := asynq.Config{
//		Concurrency:              50,                                // room for tasks waiting for near slots
//		DelayedTaskCheckInterval: time.Second,                       // asynq's default is 5 s
//		IsFailure:                asynqthrottle.IsFailure,           // throttling is not a failure
//		RetryDelayFunc:           asynqthrottle.RetryDelayFunc(nil), // come back after the retry-after
//		ErrorHandler:             ...,                               // sees rejections too, see below
//	}
//	srv := asynq.NewServer(redisOpt, cfg)
//	mux := asynq.NewServeMux()
//	mux.Use(asynqthrottle.Middleware(gate, // throttle.WithReservations(time.Minute) on the Gate
//		asynqthrottle.WithClient(client), asynqthrottle.WithServerConfig(cfg)))
//
// NewHandler wraps a single asynq.Handler the same way. IsFailure composes
// with a function of your own (IsFailure(err) && mine(err)), and
// RetryDelayFunc takes the delay function for genuine failures (nil means
// asynq.DefaultRetryDelayFunc). Without IsFailure in the Config, every
// rejection counts as a failure and increments the retry count; without
// RetryDelayFunc, a rejected task waits asynq's default backoff (15 s and
// more) instead of its retry-after. A task asynq's recoverer finds with
// its lease expired (asynq.ErrLeaseExpired: the worker or Redis went away
// while it ran) reaches the fallback too; examples/worker passes one that
// returns 0 for it, so that it runs again at once.
//
// # What happens to each task
//
// The task's key (default: its type; WithKeyFunc) and cost (default 1;
// WithCostFunc) go to Gate.AdmitID with the task ID as its identity (a
// re-enqueued copy keeps its original's, in the IDHeader header; Gate.Admit
// outside an asynq.Server). Then:
//
//   - Admitted: the wrapped handler runs (with WithInFlight, once it has
//     an in-flight slot: see In-flight limits) and its result goes to asynq
//     unchanged. Genuine errors and panics keep asynq's semantics: the
//     retry count grows, RetryDelayFunc asks the fallback, and the task is
//     archived after MaxRetry.
//   - Rejected, with retries left: the wrapped handler does not run; the
//     handler returns a *RateLimitError carrying the Decision (RetryIn is
//     its RetryAfter). It matches throttle.ErrLimited with errors.Is, and
//     errors.As finds it as *RateLimitError and as *throttle.LimitedError.
//     IsFailure reports false for it, so asynq neither increments the retry
//     count nor counts the task in its processed and failed statistics,
//     and RetryDelayFunc schedules the retry no earlier than RetryIn.
//   - Rejected with a reserved slot (Decision.Reserved, with a Gate built
//     with throttle.WithReservations and a limiter that implements
//     throttle.IDLimiter): a slot at most WithMaxWait ahead is waited for
//     in the handler, holding its worker, and the task is then admitted on
//     its reservation. A further slot is a *RateLimitError whose retry
//     brings the task back a DelayedTaskCheckInterval before its slot
//     (WithServerConfig tells the middleware the interval; asynq keeps
//     retry times in whole seconds and moves due retries only every
//     interval, so the task arrives between one interval plus a second
//     before its slot and the slot itself), and it waits in the handler
//     for the rest. WithMaxWait defaults to the interval plus a second, so
//     every retried task is back in time. A task is so rejected back to
//     asynq at most once, however far its slot.
//   - Rejected on its last attempt: see the first trap below.
//   - Never admissible: a key or cost function error, or a request the Gate
//     refuses as a usage error (throttle.IsUsageError: a cost above the
//     limit, a key the limiter cannot use), or a rejection with RetryAfter
//     throttle.Never. Retrying cannot help and must not loop, so the
//     handler returns an error wrapping throttle.ErrInvalidKey or
//     throttle.ErrInvalidCost and asynq.SkipRetry: asynq archives the task
//     at once, where an operator sees it with its error.
//
// # Guarantees
//
// The wrapped handler never runs for a rejected task. A rejected task is
// decided again no earlier than its retry-after, with its retry count
// unchanged, and is never archived because of throttling, whatever its
// MaxRetry or retry count, with one exception each for the two ways of
// handling the last attempt (below). No task is lost or run twice because
// of throttling, except as noted for the re-enqueued copy.
//
// # Trap 1: the last attempt
//
// asynq archives a task whose retry count has reached its MaxRetry before
// it asks IsFailure: returning any error then archives the task, so the
// asynq documentation's rate-limit idiom archives a throttled task with
// MaxRetry(0), or on its last genuine attempt. The handler detects that
// case (asynq.GetRetryCount >= asynq.GetMaxRetry) and does not return the
// rejection:
//
// With WithClient, it enqueues a copy of the task to run once the
// retry-after has passed (asynq.ProcessAt the retry instant rounded up to a
// whole second, for the reason in trap 2), and returns nil only once the
// copy is enqueued, so asynq marks the original done (or completed, when
// it has a Retention) and counts it as processed. The copy keeps the type,
// payload, headers (so its trace context too), queue, and the remaining
// retry budget: MaxRetry is
// the original's MaxRetry minus its retry count, and its retry count starts
// at 0. It keeps the time limit as far as the handler can see it: asynq
// gives the handler only the absolute deadline of this run, computed as
// now + Timeout (whole seconds) or as the task's Deadline (a whole second),
// so a deadline on a whole second is kept as a Deadline, and any other
// becomes a Timeout of the time left when the handler started, rounded up
// to a whole second (the original Timeout, unless middleware before this
// one took a second or more). A task with both a Timeout and a Deadline
// keeps the one that applied to this run, as a Deadline. The copy does not
// keep a Unique lock (the original holds it until it is done), a
// Retention, or a Group. Its ID is CopyTaskID of the original's: if the
// original runs again after its copy was enqueued (asynq could not mark it
// done), the enqueue finds the copy by its ID (asynq.ErrTaskIDConflict)
// and the original completes without a second copy. If the enqueue fails,
// the handler returns the *RateLimitError with the enqueue error in its Err
// field: asynq's own path then archives the original, with that error as
// its last error, and the ErrorHandler sees it. This is the exception: a
// task is archived when the broker cannot take its copy.
//
// Without WithClient, the task waits in the handler, holding its worker,
// until its retry-after has passed, and is decided again, as often as it
// takes. The wait is bounded by the task's deadline: a task whose
// retry-after ends after its deadline is not kept waiting; the handler
// returns the *RateLimitError (its Err says why) and asynq archives it.
// This is the exception of this path; WithClient avoids it. A waiting task
// counts against Concurrency, and during Shutdown it holds its worker
// until ShutdownTimeout, when asynq puts it back in its queue (not
// archived) and cancels its context, which ends the wait.
//
// # Trap 2: whole-second retry times
//
// asynq stores the time of a retry as whole Unix seconds (processAt.Unix(),
// the score of the retry set) and moves a task back to pending once that
// score is <= the current Unix second, every DelayedTaskCheckInterval
// (default 5 s). A delay of exactly the retry-after can therefore bring a
// task back up to a second early. RetryDelayFunc returns the time until the
// decision instant plus the retry-after, rounded up to a whole second, so
// the truncated score is never before the retry-after; for a rejection
// without a decision instant (a *RateLimitError or *throttle.LimitedError
// built elsewhere) it returns the retry-after plus one second, since
// floor(now+d+1s) > now+d. A throttled task therefore comes back between
// its retry-after and about one second plus DelayedTaskCheckInterval
// later; set DelayedTaskCheckInterval low (for example 1 s) where that
// matters. The re-enqueued copy of trap 1 is scheduled the same way. A
// reserved slot (see above) is instead aimed a check interval early and
// waited for in the handler, so it is claimed on time.
//
// # Recommended Config
//
// DelayedTaskCheckInterval: time.Second, and Concurrency with room for the
// tasks that wait in the handler for their slots: about the sum of the
// keys' rates × (DelayedTaskCheckInterval + 1 s), on top of what the
// handlers need. With asynq's defaults (5 s, and Concurrency the number of
// CPUs) throttled tasks come back up to 6 s early and hold every worker
// while they wait.
//
// Keys that must not wait behind each other (a tenant under its limit
// beside a flooding one) need queues of their own: asynq dequeues one
// queue first in, first out, so a task enqueued behind a dump of
// thousands waits until each of them was dequeued (and rejected), while
// among queues of equal weight (Config.Queues, without StrictPriority)
// every dequeue picks a non-empty one at random. A dequeue costs a Redis
// call per empty queue it tries first, so keep them to tens.
// TaskCheckInterval (default 1 s) is about how long a task that arrives
// at an idle server waits before it is dequeued; tens of milliseconds
// cost a Redis call per queue that often.
//
// # Backoff on a 429
//
// When the partner a handler calls answers 429 with Retry-After: d, the
// handler returns [Backoff](d):
//
//	if resp.StatusCode == http.StatusTooManyRequests {
//		return asynqthrottle.Backoff(retryAfter(resp))
//	}
//
// The middleware then pauses the task's key in the Gate's limiter for d
// (throttle.Gate.Pause: in Redis, for every worker), so the key's other
// tasks are rejected until d has passed, and puts the task back as it puts
// back a rejected one: a *RateLimitError with RetryIn d (not a failure, no
// retry charged), re-enqueued or waited for on its last attempt, never
// archived. It comes back after d (rounded up to asynq's whole seconds)
// and is admitted on its id without a second charge.
//
// # Fair shares
//
// When handlers, not rates, are the bottleneck (a handler that calls a
// partner for a few hundred milliseconds), a key whose backlog is within
// its rate would fill every worker and hold every other key behind it.
// With the handlers known (WithHandlers(n), or the server's Concurrency
// through WithServerConfig) the middleware shares them across keys, on by
// default (WithFair(false) turns it off: first come, first served):
//
//   - Max-min fair, weighted (WithWeights; default 1 each): a key's share
//     is what it needs, up to its weight's part of what the keys needing
//     less leave over. A key that needs less than its share is served
//     first and never waits behind one that needs more; keys that need
//     more get the handlers in proportion to their weights (start-time
//     fair queuing by handler time). The heavy keys' starts are paced and
//     a handler is kept for the light ones when none is about to end, so
//     that handlers of equal length do not finish in lockstep with a
//     light task waiting for the next round (see internal/fair).
//   - A task that would wait longer than WithMaxWait for its handler, or
//     beyond its key's part of the waiting room (twice its share, and 4n
//     in all), is deferred once, not charged: a *RateLimitError
//     ("deferred", DispositionDeferred) that brings it back the check
//     interval before its key's share reaches it (the reservation idea
//     applied to handler time), when it waits here for the rest. With
//     WithInspector, deferred tasks are brought back sooner
//     (Inspector.RunTask) when their key's share grows meanwhile (other
//     keys went quiet), so that no handler idles while they wait. On its
//     last attempt a task is never deferred: it waits here.
//   - A task that waits here is decided by its rate at once (not once a
//     handler is free, which would push a key that sends at its rate
//     later with every wait), then by its in-flight slot once it has a
//     handler (refused, it waits for one of its key's handlers to end,
//     not charged again).
//
// Tasks waiting here hold asynq workers: set Concurrency to n plus the
// tasks that wait, about n + 4n + (DelayedTaskCheckInterval + 1 s) x the
// handler starts per second (examples/worker: 16 handlers, Concurrency
// 300). asynq's Dequeue picks among the non-empty queues at random, so a
// queue per key (or per group of keys) keeps a flood's returning tasks
// from filling the workers ahead of everyone else's.
//
// Measured with examples/worker, 3,000 tasks of one tenant at t=0 beside
// tenants at 10/s and 5/s, 16 handlers of 300 ms (testdata/fairshare.jsonl,
// -work 300ms -redis local): the calm tenants' p99 wait 337 ms and 221 ms,
// none of their tasks deferred, each of the flood's deferred at most once
// (2,977 for 2,850 that must wait by the rates alone; 1.76 deliveries per
// task), the run 1.03 times the handler time.
//
// # In-flight limits
//
// WithInFlight(l, lease) adds a limit on how many tasks of a key run at
// once, across every server that shares l's store (concurrency.NewRedis;
// concurrency.NewMemory for one process): the shape of a downstream that
// allows N requests at a time, whatever they take. l is any
// throttle.InFlightLimiter; this package does not import package
// concurrency. For each task the Gate admits, the middleware then
// acquires a slot of the same key in l, for lease, with the task's
// identity (its task ID, or the IDHeader of a re-enqueued copy; a random
// one outside an asynq.Server):
//
//   - Acquired: the wrapped handler runs with the slot (throttle.in_flight
//     "acquired" on the span), renewed every third of lease on a goroutine
//     of its own while the handler runs, and released when it returns or
//     panics. A server that dies leaves its slots to their leases: they
//     come back at most lease later.
//   - Refused (every slot held; "rejected"): the task goes back like a
//     rate rejection, a *RateLimitError whose RetryIn is the time until the
//     earliest lease of the key ends ("in-flight limit reached"): retried
//     without counting a failure, never archived for it; on its last
//     attempt it is re-enqueued (WithClient; the copy carries the task's
//     identity in IDHeader) or waits in the handler, as above. The Gate
//     has already admitted, and charged, the task; when it comes back
//     Gate.AdmitID admits the same identity again without a second charge
//     while its admission is still counted; one that comes back after that
//     is charged again, so under a backlog far beyond the in-flight limit
//     refusals use up rate (see the same section of natsthrottle): keep
//     the rate near what the slots can run. With fair shares (above) a
//     refused task does not go back: it waits here for one of its key's
//     handlers to end (or the earliest lease), charged once.
//   - The limiter fails ("error"): the error goes to WithErrorHandler and
//     the span, and the Gate's failure policy decides: FailOpen runs the
//     handler without a slot, FailClosed returns a *RateLimitError with the
//     Gate's degraded retry-after. A failed Renew or Release is reported
//     too; a Release that fails leaves the slot to its lease.
//
// Every call to l is bounded by lease. asynq brings a retried task back in
// whole seconds plus its DelayedTaskCheckInterval, so a refused task waits
// at least that; the lease bounds the rest: pick a short one (e.g. 1 s),
// the renewals keep the slots of long tasks.
//
// # ErrorHandler
//
// asynq calls Config.ErrorHandler for every error a handler returns,
// including each *RateLimitError of a rejected task. Filter rejections with
// errors.Is(err, throttle.ErrLimited) if they are not of interest; a
// *RateLimitError whose Err is set is worth reporting (the task is about to
// be archived). A task completed by re-enqueueing returns nil and is not
// reported.
//
// # Tracing
//
// The handler extracts the producer's trace context from the task headers
// (through a read-only map carrier that matches keys whatever their case;
// nil headers are fine) with the configured propagator (WithPropagators;
// default the global one, or W3C trace context while the global one
// propagates nothing), and starts a CONSUMER span named "process <queue>"
// ("process <task type>" outside an asynq.Server) as its child. Producers
// put their trace context in the headers with InjectTraceContext. The span
// carries the messaging attributes of semconv v1.43.0: messaging.system
// "asynq", messaging.destination.name (the queue), messaging.operation.type
// "process", messaging.operation.name "process", messaging.message.id (the
// task ID) and messaging.message.body.size; and asynq.task.type,
// asynq.retry_count, asynq.max_retry, throttle.disposition (handled, retry,
// requeued or archive), throttle.waits (waits on the last attempt) and
// throttle.copy_id (the re-enqueued copy's ID). The Gate's decision span,
// throttle.admit, is a child of the process span, and the wrapped handler
// runs with the process span in its context. A rejection is not an error
// status; a genuine failure, a panic, a never-admissible task and a task
// about to be archived are (RecordError, codes.Error).
//
// # Configuration errors
//
// Middleware and NewHandler have no error return and do not panic: with a
// nil Gate or handler, every task gets an error wrapping
// throttle.ErrInvalidOption, a genuine failure to asynq, and nothing runs.
//
// # Store failures
//
// A decision the Gate's failure policy made because the limiter failed (a
// Redis outage or timeout: Decision.Err) is not an error to asynq: the task
// goes on as the policy decided. WithErrorHandler receives these failures
// as *throttle.StoreError with the task, at most 3 at once and then 2 per
// second per handler, each counting the failures left unreported since the
// previous one; the Gate's span records every one, and throttle.WithLogger
// logs them.
package asynqthrottle
