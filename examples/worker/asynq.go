package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	asynqthrottle "github.com/queuethrottle/queuethrottle/consumers/asynq"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// The asynq side of a run with -redis: the same jobs, enqueued as tasks of
// taskType on queues of their own for the run (one per tenant, up to
// maxAsynqQueues), consumed by an asynq server whose handler is gated by
// a limiter of its own.
const (
	taskType = "job"
	// asynqMaxRetry is every task's MaxRetry: small, so that a task
	// rejected more often than that and still handled shows that
	// throttling never uses up retries.
	asynqMaxRetry = 2
	// asynqCheckInterval is how often asynq moves due retries to pending.
	// asynq keeps retry times in whole seconds, so a rejected task comes
	// back between its retry-after and about a second plus this later.
	asynqCheckInterval = 200 * time.Millisecond
	// asynqRetention is how long a handled task stays in its queue (see
	// enqueue); the queues and their keys are deleted at the end of the run.
	asynqRetention = 10 * time.Minute
	// maxAsynqQueues bounds the queues of a run: tenants share them
	// round-robin beyond it. A queue per tenant keeps a flood of one from
	// delaying the others: asynq takes pending tasks of one queue first in,
	// first out, but picks the queue of each dequeue at random among the
	// non-empty ones (Config.Queues, equal weights, no StrictPriority).
	// Each dequeue costs a Redis call per empty queue it tries first, so
	// their number is bounded.
	maxAsynqQueues = 16
	// asynqPollInterval is Config.TaskCheckInterval: how long asynq sleeps
	// (half to one and a half times it) when every queue is empty, so
	// about the wait of a task that arrives then. asynq's default is 1 s.
	asynqPollInterval = 20 * time.Millisecond
)

// asynqSide is the asynq producer and consumer of a run.
type asynqSide struct {
	queues  []string          // the run's, named after startAsynq's queue: "-0", "-1", ...
	queueOf map[string]string // tenant -> its queue
	rc      *redis.Client
	client  *asynq.Client
	srv     *asynq.Server
	insp    *asynq.Inspector
	lim     *recordingLimiter
	rec     *recorder
	tracer  trace.Tracer
	work    time.Duration  // -work: how long every handler takes
	partner *partnerClient // -partner-quota: called once per job

	handlerErrs, throttleErrs errorLog

	stopOnce   sync.Once
	archived   int // after stop; -1 when unknown
	failed     int
	deliveries atomic.Int64 // tasks handed to the handler (countDeliveries)
}

// startAsynq starts the asynq server of a run on the Redis at redisURL
// (with a client of its own), on queues named after queue, one per tenant
// of tenants (up to maxAsynqQueues), gated by a Gate over lim (whose
// Redis client honours context deadlines). Admissions and handler runs go
// to rec; the Gate's metrics to mp; every handler calls partner, if set. cl stops the server, deletes the
// queues and closes the client.
//
// inf, when not nil, limits the handlers of a tenant running at once; each
// takes cfg.Work. cfg.Handlers handlers run at once, shared fairly across
// tenants by weight with cfg.Fair.
func startAsynq(ctx context.Context, cfg config, queue string, tenants []string, weight func(string) float64, lim *recordingLimiter, inf throttle.InFlightLimiter, rec *recorder, partner *partnerClient, tp trace.TracerProvider, mp metric.MeterProvider, cl *closers) (*asynqSide, error) {
	redisURL, reservations, work := cfg.RedisURL, cfg.Reservations, cfg.Work
	if cfg.BrokerURL != "" {
		redisURL = cfg.BrokerURL
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("-redis: %w", err)
	}
	rc := redis.NewClient(opt)
	cl.add(func() { rc.Close() })

	a := &asynqSide{
		rc:       rc,
		client:   asynq.NewClientFromRedisClient(rc),
		insp:     asynq.NewInspectorFromRedisClient(rc),
		lim:      lim,
		rec:      rec,
		tracer:   tp.Tracer(scopeName),
		work:     work,
		partner:  partner,
		archived: -1,
		queueOf:  map[string]string{},
	}
	weights := map[string]int{}
	for i := range max(min(len(tenants), maxAsynqQueues), 1) {
		q := fmt.Sprintf("%s-%d", queue, i)
		a.queues = append(a.queues, q)
		weights[q] = 1
	}
	for i, t := range tenants {
		a.queueOf[t] = a.queues[i%len(a.queues)]
	}
	lim.admitted, lim.refunded = rec.admitted, rec.refunded
	gate, err := throttle.NewGate(lim, throttle.WithTracerProvider(tp), throttle.WithMeterProvider(mp), throttle.WithKeyMetrics(nil, maxTenantSeries), throttle.WithReservations(reservations))
	if err != nil {
		return nil, err
	}
	// cfg.Handlers run the job at once: with fair shares
	// (asynqthrottle.WithHandlers) the rest of asynq's workers are room
	// for the tasks that wait in the handler for one, or for a reserved
	// slot at most DelayedTaskCheckInterval + 1 s ahead; first come, first
	// served, asynq's workers are the handlers.
	concurrency := cfg.Handlers
	if cfg.Fair {
		concurrency = max(300, 5*cfg.Handlers)
	}
	scfg := asynq.Config{
		Concurrency: concurrency,
		Queues:      weights,
		// Throttling is not a failure: the retry count stays, and the
		// task is neither counted as failed nor archived. (Compose your
		// own: func(err error) bool { return asynqthrottle.IsFailure(err) && mine(err) }.)
		IsFailure: asynqthrottle.IsFailure,
		// A rejected task comes back after its retry-after (rounded up to
		// asynq's whole seconds); genuine failures get asynq's backoff,
		// except a task recovered after its lease expired (failureRetryDelay).
		RetryDelayFunc:           asynqthrottle.RetryDelayFunc(failureRetryDelay),
		DelayedTaskCheckInterval: asynqCheckInterval,
		TaskCheckInterval:        asynqPollInterval,
		ShutdownTimeout:          5 * time.Second,
		ErrorHandler:             asynq.ErrorHandlerFunc(a.handleError),
		LogLevel:                 asynq.WarnLevel,
	}
	a.srv = asynq.NewServerFromRedisClient(rc, scfg)
	mux := asynq.NewServeMux()
	mux.Use(a.countDeliveries, asynqthrottle.Middleware(gate,
		asynqthrottle.WithHandlers(cfg.Handlers),
		asynqthrottle.WithFair(cfg.Fair),
		asynqthrottle.WithWeights(weight),
		asynqthrottle.WithClient(a.client), // re-enqueue instead of archiving on a last attempt
		// Bring deferred tasks back sooner when their tenant's share grew.
		asynqthrottle.WithInspector(a.insp),
		// A reserved slot further than DelayedTaskCheckInterval + 1 s is
		// a retry that comes back before it; a nearer one is waited for.
		asynqthrottle.WithServerConfig(scfg),
		asynqthrottle.WithKeyFunc(func(_ context.Context, t *asynq.Task) (string, error) {
			j, err := taskJob(t)
			return j.Tenant, err
		}),
		asynqthrottle.WithCostFunc(func(_ context.Context, t *asynq.Task) (int, error) {
			j, err := taskJob(t)
			return max(j.Cost, 1), err
		}),
		asynqthrottle.WithTracerProvider(tp),
		asynqthrottle.WithPropagators(propagation.TraceContext{}),
		// At most -inflight handlers of a tenant at once (nil: no limit).
		asynqthrottle.WithInFlight(inf, inFlightLease),
		asynqthrottle.WithErrorHandler(func(_ context.Context, t *asynq.Task, err error) { a.throttleErrs.add(taskType, err) }),
	))
	mux.HandleFunc(taskType, a.handle)
	if err := a.srv.Start(mux); err != nil {
		return nil, fmt.Errorf("asynq server: %w", err)
	}
	cl.add(a.stop)
	return a, nil
}

// countDeliveries counts every task asynq hands to the handler: its
// deliveries, retries and the copies of last attempts included.
func (a *asynqSide) countDeliveries(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		a.deliveries.Add(1)
		return next.ProcessTask(ctx, t)
	})
}

// taskJob decodes the job of a task.
func taskJob(t *asynq.Task) (job, error) {
	var j job
	if err := json.Unmarshal(t.Payload(), &j); err != nil {
		return job{}, fmt.Errorf("job payload: %w", err)
	}
	return j, nil
}

// enqueue enqueues job j as a task with the job id as task ID (so a resend
// is refused as a duplicate), MaxRetry asynqMaxRetry, and the trace context
// of a producer span in its headers. retried reports that an earlier
// attempt failed: a conflict then means that attempt's task got in (its
// reply was lost), and it counts as enqueued. Tasks are kept for
// asynqRetention once handled, so that such a resend finds the task even
// when it has already run.
func (a *asynqSide) enqueue(ctx context.Context, j job, retried bool) error {
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	queue := a.queueOf[j.Tenant] // every tenant of the trace has one
	sctx, span := a.tracer.Start(ctx, "send "+queue, trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	task := asynq.NewTaskWithHeaders(taskType, data, asynqthrottle.InjectTraceContext(sctx, nil))
	ectx, cancel := context.WithTimeout(sctx, 5*time.Second)
	defer cancel()
	_, err = a.client.EnqueueContext(ectx, task, asynq.Queue(queue), asynq.TaskID(j.ID), asynq.MaxRetry(asynqMaxRetry), asynq.Retention(asynqRetention))
	switch {
	case (errors.Is(err, asynq.ErrTaskIDConflict) || errors.Is(err, asynq.ErrDuplicateTask)) && !retried:
		return nil
	case err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) && !errors.Is(err, asynq.ErrDuplicateTask):
		return err
	}
	a.rec.published(j.Tenant, j.ID, 0)
	return nil
}

// handle is the job handler: it runs only for admitted tasks, works on
// the job for -work and records it (start and end of the work).
func (a *asynqSide) handle(ctx context.Context, t *asynq.Task) error {
	j, err := taskJob(t)
	if err != nil {
		a.handlerErrs.add("task "+t.Type(), err)
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	id, _ := asynq.GetTaskID(ctx)
	// The job's span is a child of the middleware's process span.
	_, span := a.tracer.Start(ctx, "handle "+j.ID)
	defer span.End()
	start := time.Now()
	if a.work > 0 {
		time.Sleep(a.work)
	}
	if a.partner != nil {
		if ok, retry, err := a.partner.call(ctx); !ok {
			if err != nil {
				a.handlerErrs.add("partner "+j.ID, err)
				retry = time.Second
			}
			// Answered 429: back later, no retry spent; not a handler run.
			return asynqthrottle.Backoff(retry)
		}
	}
	retried, _ := asynq.GetRetryCount(ctx)
	a.rec.handle(handled{Tenant: j.Tenant, JobID: j.ID, Ref: id, At: start.UnixNano(), End: time.Now().UnixNano(), Delivery: uint64(retried) + 1})
	return nil
}

// handleError sees every error a task returns: rejections (counted), and
// what asynq is about to archive (reported, and the job counted lost).
func (a *asynqSide) handleError(_ context.Context, t *asynq.Task, err error) {
	j, jerr := taskJob(t)
	if jerr != nil {
		return // reported by handle
	}
	var rl *asynqthrottle.RateLimitError
	switch {
	case errors.As(err, &rl):
		a.rec.rejected(j.Tenant, j.ID, time.Now(), rl.Decision.Reserved)
		if rl.Err != nil { // could not be kept from asynq's archive
			a.throttleErrs.add(taskType+" "+j.ID, err)
			a.rec.term(j.Tenant)
		}
	case errors.Is(err, asynq.SkipRetry): // never admissible: archived at once
		a.throttleErrs.add(taskType+" "+j.ID, err)
		a.rec.term(j.Tenant)
	default:
		a.handlerErrs.add(taskType+" "+j.ID, err)
	}
}

// stop shuts the server down, then reads how many tasks the queues
// archived and counted failed, and deletes the queues and their
// statistics. A queue that never got a task does not exist and counts 0.
// It is safe to call more than once.
func (a *asynqSide) stop() {
	a.stopOnce.Do(func() {
		a.srv.Shutdown()
		defer a.client.Close()
		existing, err := a.insp.Queues()
		if err != nil {
			a.archived = -1
			a.handlerErrs.add("list the queues", err)
			return
		}
		a.archived = 0
		for _, q := range a.queues {
			if !slices.Contains(existing, q) {
				continue
			}
			if qi, err := a.insp.GetQueueInfo(q); err == nil {
				if a.archived >= 0 {
					a.archived += qi.Archived
				}
				a.failed += qi.Failed
			} else {
				a.archived = -1
				a.handlerErrs.add("inspect queue "+q, err)
			}
			a.deleteQueue(q)
		}
	})
}

// queueNames names queues for the summary: "queue q" or "queues q-0 to
// q-N".
func queueNames(queues []string) string {
	if len(queues) == 1 {
		return "queue " + queues[0]
	}
	return "queues " + queues[0] + " to " + queues[len(queues)-1]
}

// deleteQueue deletes queue q and its statistics.
func (a *asynqSide) deleteQueue(q string) {
	if err := a.insp.DeleteQueue(q, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
		a.handlerErrs.add("delete queue "+q, err)
	}
	// DeleteQueue leaves the processed and failed counters (asynq's keys
	// of a queue are "asynq:{<queue>}:...").
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var keys []string
	iter := a.rc.Scan(ctx, 0, "asynq:{"+q+"}:*", 100).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	err := iter.Err()
	if err == nil && len(keys) > 0 {
		err = a.rc.Del(ctx, keys...).Err()
	}
	if err != nil {
		a.handlerErrs.add("delete the statistics of queue "+q, err)
	}
}

// failureRetryDelay is the worker's delay for genuine failures: asynq's backoff
// (asynq.DefaultRetryDelayFunc: 15 s and more), except for a task that
// asynq's recoverer found still active after its lease expired
// (asynq.ErrLeaseExpired: the worker, or its Redis, went away while the
// task ran; kill-redis). That is not the handler failing: it comes back
// at once, not after the backoff on top of the recoverer's minute.
func failureRetryDelay(n int, err error, t *asynq.Task) time.Duration {
	if errors.Is(err, asynq.ErrLeaseExpired) {
		return 0
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}
