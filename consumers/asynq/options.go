package asynqthrottle

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Option configures Middleware and NewHandler. Options that get a nil value
// keep the default.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	keyFunc        func(context.Context, *asynq.Task) (string, error)
	costFunc       func(context.Context, *asynq.Task) (int, error)
	client         *asynq.Client
	inspector      *asynq.Inspector
	checkInterval  time.Duration // the server's DelayedTaskCheckInterval
	taskCheck      time.Duration // the server's TaskCheckInterval
	maxWait        time.Duration // < 0: checkInterval + 1 s
	tracerProvider trace.TracerProvider
	propagators    propagation.TextMapPropagator
	inFlight       throttle.InFlightLimiter // nil: no in-flight limit
	lease          time.Duration
	handlers       int                  // WithHandlers; 0: the server's Concurrency, if known
	serverWorkers  int                  // the server's Concurrency (WithServerConfig); 0: unknown
	noFair         bool                 // WithFair(false)
	weights        func(string) float64 // nil: every key 1
	onError        func(context.Context, *asynq.Task, error)
	err            error // first invalid option
}

func taskTypeKey(_ context.Context, t *asynq.Task) (string, error) { return t.Type(), nil }

func newConfig(opts []Option) config {
	c := config{keyFunc: taskTypeKey, checkInterval: defaultCheckInterval, taskCheck: defaultTaskCheck, maxWait: -1}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.maxWait < 0 {
		c.maxWait = c.checkInterval + time.Second
	}
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
	}
	if c.propagators == nil {
		c.propagators = globalPropagator{}
	}
	return c
}

// WithKeyFunc sets how a task's limiter key is derived. The default is the
// task type. A key function that returns an error marks the task as one
// that can never be admitted: it is archived (see the package
// documentation). Nil keeps the default.
func WithKeyFunc(f func(ctx context.Context, t *asynq.Task) (string, error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.keyFunc = f
		}
	})
}

// WithCostFunc sets the cost n charged for a task. The default charges 1
// per task. An error, like a cost the limiter refuses (n < 1 or more than
// its limit), marks the task as never admissible: it is archived. Nil keeps
// the default.
func WithCostFunc(f func(ctx context.Context, t *asynq.Task) (int, error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.costFunc = f
		}
	})
}

// WithClient gives the middleware a client of the server's Redis, with
// which it re-enqueues a copy of a task rejected on its last attempt (when
// asynq would archive it if it returned an error): see the package
// documentation. Without it, such a task waits in the handler for its
// retry-after instead. Nil keeps the default (no client).
func WithClient(c *asynq.Client) Option {
	return optionFunc(func(cfg *config) {
		if c != nil {
			cfg.client = c
		}
	})
}

// WithInspector gives the middleware an inspector of the server's Redis,
// with which the fair shares bring deferred tasks back sooner
// (Inspector.RunTask, in the order they were deferred) when their key's
// share of the handlers grew after they were deferred (other keys went
// quiet) and handlers would otherwise idle while they wait in the retry
// set: a task is deferred to when its key's share at that moment reaches
// it. Tasks are brought back as handlers end, at most every 50 ms, again
// once a key with deferred tasks is no longer blocked by its rate, and
// the server's TaskCheckInterval after a recall (when another server's
// workers took the tasks it moved), as long as handlers are free.
// Without it, such tasks come back when they were told to. Nil keeps the
// default (none).
func WithInspector(i *asynq.Inspector) Option {
	return optionFunc(func(c *config) {
		if i != nil {
			c.inspector = i
		}
	})
}

// defaultCheckInterval and defaultTaskCheck are asynq's defaults of
// Config.DelayedTaskCheckInterval and Config.TaskCheckInterval.
const (
	defaultCheckInterval = 5 * time.Second
	defaultTaskCheck     = time.Second
)

// WithServerConfig tells the middleware the asynq.Config of the server it
// runs in: it reads DelayedTaskCheckInterval (0 means asynq's default,
// 5 s), how often asynq moves due retries back to pending. A task whose
// reserved slot (see throttle.WithReservations) is further away than
// WithMaxWait is retried to come back that much before its slot, and
// waits in the handler for the rest, so asynq's whole seconds and its
// check interval never make it late for its slot.
//
// It also reads Concurrency (0 means asynq's default, the number of
// CPUs): the handlers the fair shares share, unless WithHandlers says
// otherwise; and TaskCheckInterval (0: asynq's default, 1 s), how long a
// task moved to pending may take to reach a worker (see WithInspector).
func WithServerConfig(cfg asynq.Config) Option {
	return optionFunc(func(c *config) {
		c.checkInterval = defaultCheckInterval
		if cfg.DelayedTaskCheckInterval > 0 {
			c.checkInterval = cfg.DelayedTaskCheckInterval
		}
		c.taskCheck = defaultTaskCheck
		if cfg.TaskCheckInterval > 0 {
			c.taskCheck = cfg.TaskCheckInterval
		}
		c.serverWorkers = cfg.Concurrency
		if c.serverWorkers < 1 {
			c.serverWorkers = runtime.NumCPU()
		}
	})
}

// WithHandlers sets how many tasks the wrapped handler runs at once, n,
// shared fairly across keys (see Fair shares in the package
// documentation); tasks beyond them wait in the middleware, holding an
// asynq worker, or are deferred. Default: the server's Concurrency
// (WithServerConfig); without either, there are no fair shares. Set
// Config.Concurrency above n for tasks to wait in (the waits for a near
// reserved slot too): n handlers and up to 4n waiting for one need 5n. n
// must be >= 1; otherwise every task fails with an error wrapping
// throttle.ErrInvalidOption, as for a nil Gate.
func WithHandlers(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			if c.err == nil {
				c.err = &throttle.OptionError{Field: "WithHandlers", Reason: fmt.Sprintf("must be >= 1, got %d", n)}
			}
			return
		}
		c.handlers = n
	})
}

// WithFair turns the fair shares of the handlers across keys on (the
// default, wherever the handlers are known: WithHandlers or
// WithServerConfig) or off (first come, first served, as asynq hands the
// tasks over).
func WithFair(on bool) Option {
	return optionFunc(func(c *config) { c.noFair = !on })
}

// WithWeights sets the weight of each key in the fair shares: a key of
// weight 3 gets three times the handler starts of a key of weight 1 while
// both have more tasks than their shares. f is asked for a key when it is
// first seen and again once its answer is a second old, so a changed
// weight applies within a second; a weight that is not > 0 and finite
// counts as 1. f must be safe for concurrent use and quick. Nil keeps the
// default: every key 1.
func WithWeights(f func(key string) float64) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.weights = f
		}
	})
}

// fairHandlers is the handlers the fair shares share; 0: none.
func (c *config) fairHandlers() int {
	switch {
	case c.noFair:
		return 0
	case c.handlers > 0:
		return c.handlers
	}
	return c.serverWorkers
}

// WithMaxWait sets how near a reserved slot must be for the task to wait
// for it in the handler (holding its worker) instead of being retried.
// Default: the server's DelayedTaskCheckInterval plus one second (6 s with
// asynq's defaults; see WithServerConfig), the most a retried task can
// arrive before its slot. 0 never waits for a slot that is not due; a
// negative d keeps the default. A wait never runs past the task's
// deadline.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d >= 0 {
			c.maxWait = d
		}
	})
}

// WithTracerProvider sets the provider of the process spans. Nil means the
// global provider (otel.GetTracerProvider()). The Gate's decision spans come
// from the Gate's own provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tracerProvider = tp
		}
	})
}

// WithPropagators sets the propagator that extracts the producer's trace
// context from the task headers. Nil means the global propagator
// (otel.GetTextMapPropagator()), or W3C trace context
// (propagation.TraceContext) while the global one propagates nothing, the
// same rule as InjectTraceContext.
func WithPropagators(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) {
		if p != nil {
			c.propagators = p
		}
	})
}

// WithInFlight limits how many tasks of a key run at once, across every
// server sharing l's store (a concurrency.Redis): after the Gate admits a
// task, it acquires a slot of the same key in l with the task's identity
// (its task ID, or the IDHeader of a re-enqueued copy) for lease. The slot
// is renewed every third of lease while the wrapped handler runs and
// released when it returns (or panics). A task refused a slot goes back
// like a rate rejection: a *RateLimitError with the rejection's RetryAfter
// (the time until the earliest lease of the key ends), retried without
// counting a failure and never archived for it (the last-attempt path of
// the package documentation applies). When l errs, the Gate's failure
// policy applies (FailOpen runs the handler without a slot, FailClosed
// returns a *RateLimitError with the Gate's degraded retry-after) and the
// error goes to the error handler (WithErrorHandler) and the span.
//
// lease bounds how long the slot of a server that died stays taken, and
// is the longest a refused task is kept away: e.g. 1 s (asynq retries in
// whole seconds anyway). lease must be > 0; otherwise every task fails
// with an error wrapping throttle.ErrInvalidOption, as for a nil Gate. A
// nil l keeps the default: no in-flight limit.
func WithInFlight(l throttle.InFlightLimiter, lease time.Duration) Option {
	return optionFunc(func(c *config) {
		if l == nil {
			return
		}
		if lease <= 0 {
			if c.err == nil {
				c.err = &throttle.OptionError{Field: "WithInFlight.lease", Reason: fmt.Sprintf("must be > 0, got %v", lease)}
			}
			return
		}
		c.inFlight, c.lease = l, lease
	})
}

// WithErrorHandler sets a function called with the errors the handler
// meets that asynq never sees: store failures, a decision the Gate's
// failure policy made because the limiter failed (a Redis outage or
// timeout, a script Redis refuses: a *throttle.StoreError, matching
// throttle.ErrStore, passed with the task whose decision it was; at most 3
// at once and then 2 per second per handler, each with the number of
// failures left unreported since the previous one), and the errors of the
// in-flight limiter (WithInFlight): a failed Acquire, Renew or Release,
// when the task then runs (FailOpen) or succeeds. The task itself goes on
// as the policy decided. Every other error (a key or cost function error,
// a bad configuration, a done context) is returned to asynq, whose
// Config.ErrorHandler sees it. f may be called from many workers at once.
// The default does nothing. Nil keeps the default.
func WithErrorHandler(f func(ctx context.Context, t *asynq.Task, err error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.onError = f
		}
	})
}
