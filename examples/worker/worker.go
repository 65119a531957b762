package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	natsthrottle "github.com/queuethrottle/queuethrottle/consumers/nats"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Names of what the worker creates on the NATS server. On an external
// server (-nats) a stream of this name is deleted at start and at the end.
const (
	streamName    = "QT_EXAMPLE_JOBS"
	subjectPrefix = "jobs."
	durableName   = "worker"
	scopeName     = "github.com/queuethrottle/queuethrottle/examples/worker"
)

// consumerConfig is the durable pull consumer of the worker (with -faults,
// MaxDeliver is faultMaxDeliver). natsthrottle reads its config
// (WithConsumer), so the throttle knows MaxDeliver and AckWait: it never
// NAKs a message into its last delivery but holds it instead.
func consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:    durableName,
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    5 * time.Second,
		MaxDeliver: 5,
		// Messages NAKed to a reserved slot stay pending until they come
		// back: with the default of 1,000, a flood of one tenant would
		// fill MaxAckPending and stop the deliveries of every other.
		MaxAckPending: -1,
		FilterSubject: subjectPrefix + ">",
	}
}

// keyedConfig is the template of the per-tenant consumers of
// natsthrottle.ConsumeByKey (-fair): cc for the subjects jobs.<tenant>,
// one consumer "worker_<tenant>" each.
func keyedConfig(cc jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	cc.FilterSubject = subjectPrefix + "*"
	return cc
}

// tenantOf is the throttle key of a message: the tenant in jobs.<tenant>.
func tenantOf(subject string) (string, error) {
	t, ok := strings.CutPrefix(subject, subjectPrefix)
	if !ok || t == "" || strings.Contains(t, ".") {
		return "", fmt.Errorf("subject %q is not %s<tenant>", subject, subjectPrefix)
	}
	return t, nil
}

// work runs the whole example and returns the report; run turns a failed
// check into an error. Everything it starts is stopped before it returns,
// and before the summary is printed (spans go to out and are flushed
// first).
func work(ctx context.Context, cfg config, stdout io.Writer) (report, error) {
	out := &syncWriter{w: stdout}
	jf, err := loadJobs(cfg.JobsPath)
	if err != nil {
		return report{}, err
	}
	spec, err := parseLimiterSpec(cfg.Limiter, cfg.Burst, cfg.RedisURL)
	if err != nil {
		return report{}, err
	}
	q, err := loadQuotas(cfg, jf)
	if err != nil {
		return report{}, err
	}
	rateOf := q.rate
	spec.Bursts = q.bursts()
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultConfig().Timeout
	}
	if cfg.Progress <= 0 {
		cfg.Progress = defaultConfig().Progress
	}
	if err := checkWork(cfg.Work); err != nil {
		return report{}, err
	}
	if cfg.InFlight < 0 {
		return report{}, fmt.Errorf("-inflight: must be >= 0, got %d", cfg.InFlight)
	}
	if cfg.Handlers < 1 || cfg.Handlers > maxHandlers {
		return report{}, fmt.Errorf("-handlers: must be from 1 to %d, got %d", maxHandlers, cfg.Handlers)
	}
	if cfg.Instances < 1 || cfg.Instances > maxInstances {
		return report{}, fmt.Errorf("-instances: must be from 1 to %d (each is a worker process), got %d", maxInstances, cfg.Instances)
	}
	fs := faultSetup{}
	if fs.kinds, err = parseFaults(cfg.Faults); err != nil {
		return report{}, err
	}
	if err := checkFaults(fs.kinds, cfg); err != nil {
		return report{}, err
	}
	if cfg.RedisURL == redisLocal {
		if fs.redis, err = startLocalRedis(slices.Contains(fs.kinds, faultKillRedis)); err != nil {
			return report{}, err
		}
		defer fs.redis.stop() // after everything that uses it
		cfg.RedisURL = fs.redis.url()
		fmt.Fprintln(out, fs.redis.describe())
		if losesRedisData(fs.kinds) && cfg.Instances == 1 {
			// asynq keeps its queues in Redis: a fault that loses the
			// limiters' data must not lose the jobs.
			broker, err := startLocalRedis(true)
			if err != nil {
				return report{}, err
			}
			defer broker.stop()
			cfg.BrokerURL = broker.url()
			fmt.Fprintln(out, "asynq's queues on a redis-server of their own, which the faults leave alone: "+broker.describe())
		}
	}
	if cfg.RedisLatency > 0 {
		proxy, url, err := slowRedis(cfg)
		if err != nil {
			return report{}, err
		}
		defer proxy.Stop()
		if cfg.BrokerURL == "" {
			cfg.BrokerURL = cfg.RedisURL // asynq's queues stay direct
		}
		cfg.RedisURL = url
		fmt.Fprintf(out, "the limiters reach Redis through a proxy at %s that delays each way by %v (a round trip %v longer); their per-call timeout is %v\n",
			proxy.Addr(), cfg.RedisLatency, 2*cfg.RedisLatency, cfg.RedisTimeout)
	}
	spec.Timeout = cfg.RedisTimeout
	if cfg.Linger < 0 || (cfg.Linger > 0 && cfg.Metrics == "") {
		return report{}, fmt.Errorf("-linger %v: needs -metrics ADDR and a duration >= 0 (it keeps the metrics endpoint serving after the summary)", cfg.Linger)
	}
	ps, err := parsePartner(cfg.Partner, cfg.PartnerQuota, cfg.PartnerQuotaAfter)
	if err != nil {
		return report{}, err
	}
	ps.MaxCost = jf.maxCost()
	if err := checkCore(cfg); err != nil {
		return report{}, err
	}
	if cfg.Instances > 1 {
		return workInstances(ctx, cfg, stdout, jf, q, spec, fs, ps)
	}

	var cl closers
	defer cl.run()
	tp, err := tracing(cfg.Trace, out, &cl)
	if err != nil {
		return report{}, err
	}
	var metricsCl closers // the metrics endpoint outlives the summary by -linger
	defer metricsCl.run()
	mp, metricsAddr, err := serveMetrics(cfg.Metrics, &metricsCl)
	if err != nil {
		return report{}, err
	}
	spec.Meters = mp
	rc, err := dialRedis(ctx, cfg.RedisURL, &cl)
	if err != nil {
		return report{}, err
	}
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "queuethrottle:example:" + runID + ":"
	q.hashKey = prefix + "quotas"
	if spec.Partner, ps.adapt, err = newPartnerLimit(ps, rc, prefix, spec.timeout()); err != nil {
		return report{}, err
	}
	lim, limName, err := newLimiter(ctx, spec, rc, prefix, q, &cl)
	if err != nil {
		return report{}, err
	}
	gate, err := throttle.NewGate(lim, throttle.WithTracerProvider(tp), throttle.WithMeterProvider(mp), throttle.WithKeyMetrics(nil, maxTenantSeries), throttle.WithReservations(cfg.Reservations))
	if err != nil {
		return report{}, err
	}
	ns, err := openNATS(ctx, cfg, len(jf.Jobs), &cl)
	if err != nil {
		return report{}, err
	}
	nc, natsName, js, start, rec := ns.nc, ns.name, ns.js, ns.start, ns.rec
	// The limit is checked at the admissions, not at handler starts: a
	// handler may start a little after its admission (a held message runs
	// on its own goroutine), which can bunch handler starts beyond the
	// limit while the admissions respect it.
	lim.admitted, lim.refunded = rec.admitted, rec.refunded
	rec.rateOf = rateOf
	rec.weightOf = jf.weight
	rec.horizon = cfg.Reservations
	var partner *partnerServer
	if ps.Quota.Count > 0 {
		if partner, err = startPartner(ps, start, &cl); err != nil {
			return report{}, err
		}
		ps.client = newPartnerClient(partner.url, cfg.Handlers, ps.adapt)
	}

	// With -redis, an asynq server on the same Redis gets the same jobs,
	// gated by a limiter of its own (keys under a prefix of their own).
	var as *asynqSide
	if rc != nil {
		alim, _, err := newLimiter(ctx, spec, rc, prefix+"asynq:", q, &cl)
		if err != nil {
			return report{}, err
		}
		arec := newRecorder(start, len(jf.Jobs))
		arec.consumer = consumerAsynq
		arec.rateOf = rateOf
		arec.weightOf = jf.weight
		arec.horizon = cfg.Reservations
		ainf, err := newInFlight(cfg.InFlight, rc, prefix+"asynq:inflight:", cfg.RedisTimeout)
		if err != nil {
			return report{}, err
		}
		if as, err = startAsynq(ctx, cfg, "qt-example-"+runID, jf.tenants(), jf.weight, alim, ainf, arec, ps.client, tp, mp, &cl); err != nil {
			return report{}, err
		}
	}

	// The worker: the job handler gated by the throttle, and by the
	// in-flight limit with -inflight.
	inf, err := newInFlight(cfg.InFlight, rc, prefix+"inflight:", cfg.RedisTimeout)
	if err != nil {
		return report{}, err
	}
	tracer := tp.Tracer(scopeName)
	w := &worker{rec: rec, tracer: tracer, reserved: newReservedIDs(), work: cfg.Work, partner: ps.client}
	lim.rejected = w.reserved.set
	stopConsumer := func() {}
	var core *coreSender
	if cfg.Core {
		if _, err := consumeCore(nc, cfg, jf.weight, gate, inf, w, &cl); err != nil {
			return report{}, err
		}
		core = &coreSender{nc: nc, requests: jf.Requests, timeout: cfg.CoreMaxWait + 5*time.Second, answers: &coreRequests{}}
	} else {
		if stopConsumer, err = consume(ns.source, cfg, jf.weight, gate, inf, w, tp); err != nil {
			return report{}, err
		}
		cl.add(stopConsumer)
	}

	fmt.Fprintf(out, "replaying %s from %s over %.1fs into NATS %s (%s); %s, %s%s%s\n",
		plural(len(jf.Jobs), "job"), plural(len(jf.tenants()), "tenant"), jf.Jobs[len(jf.Jobs)-1].at().Seconds(), natsName, nc.ConnectedUrl(), limName, q.text(),
		describeInFlight(cfg.InFlight, rc), describeWork(cfg.Work))
	fmt.Fprint(out, drainNote(jf, cfg, 1), spec.costNote(jf, q.rate))
	if metricsAddr != "" {
		fmt.Fprintf(out, "serving the throttle's metrics for Prometheus at http://%s/metrics\n", metricsAddr)
	}
	if as != nil {
		fmt.Fprintf(out, "and into asynq %s (one per tenant, up to %d) on the same Redis, gated by a limiter of its own (same limits), tasks with MaxRetry %d\n", queueNames(as.queues), maxAsynqQueues, asynqMaxRetry)
	}

	// Publish the jobs at their arrival offsets, and wait.
	var complete <-chan struct{} = rec.complete
	progress := rec.progressLine
	var enqueue func(context.Context, job, bool) error
	if as != nil {
		complete = allClosed(rec.complete, as.rec.complete)
		progress = func() string { return rec.progressLine() + "\n" + as.rec.progressLine() }
		enqueue = as.enqueue
	}
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	pubDone := make(chan error, 1)
	go func() {
		pubDone <- publish(pctx, js, core, tracer, propagation.TraceContext{}, jf.Jobs, start, rec, enqueue, out)
	}()
	var abort <-chan error
	stopFaults := func() {}
	if len(fs.kinds) > 0 {
		fi := startFaults(ctx, fs.kinds, faultTargets{redis: fs.redis, nats: ns.server}, start, jf.span(), func(m faultMark) {
			rec.addFault(m)
			if as != nil {
				as.rec.addFault(m)
			}
		}, out)
		stopFaults = fi.stop
		defer fi.stop()
		complete, abort = allClosed(complete, fi.settled), fi.errs
	}
	stopReason, pubErr, pubReturned := wait(ctx, cfg, complete, progress, pubDone, abort, out)
	stopFaults() // a fault under way recovers first
	pubErr = stopPublisher(stopReason, pubErr, pubReturned, pubDone, pcancel)

	stopConsumer()
	if as != nil {
		as.stop()
	}
	info, deliveries, ok := consumerInfo(ns.source.stream)
	if !ok {
		deliveries = int(w.delivered.Load()) // the server did not answer: what this process saw
	}
	if cfg.Core {
		info = "" // the stream's consumers had nothing to deliver
	}
	partnerFinal := ps.finalLimit(ctx)
	cl.run()
	printStop(out, stopReason, info)
	w.handlerErrs.print(out, "handler error")
	w.throttleErrs.print(out, "throttle error")
	rep := rec.summarize(jf.Jobs, rateOf, spec)
	rep.Deliveries = deliveries
	rep.InFlight = cfg.InFlight
	rep.timeline.Handlers = cfg.Handlers
	rep.natsConsumers = consumersName(cfg.Fair)
	if core != nil {
		core.answers.wg.Wait()
		rep.Core, rep.Requests = true, core.answers
	}
	if hs, ok := lim.hybridStats(); ok {
		rep.Hybrid = &hs
	}
	if rc != nil {
		rep.Longest, rep.Timeout = lim.longestDecision(), spec.timeout()
	}
	if as != nil {
		as.handlerErrs.print(out, "asynq handler error")
		as.throttleErrs.print(out, "asynq throttle error")
		arep := as.rec.summarize(jf.Jobs, rateOf, spec)
		arep.Queues, arep.Archived, arep.Failed, arep.MaxRetry = as.queues, as.archived, as.failed, asynqMaxRetry
		arep.Deliveries = int(as.deliveries.Load())
		arep.timeline.Handlers = cfg.Handlers
		arep.InFlight = cfg.InFlight
		if hs, ok := as.lim.hybridStats(); ok {
			arep.Hybrid = &hs
		}
		arep.Longest, arep.Timeout = as.lim.longestDecision(), spec.timeout()
		rep.Asynq = &arep
	}
	if partner != nil {
		admits := rec.charged()
		if as != nil {
			admits = append(admits, as.rec.charged()...)
		}
		pr := partner.report(ps, partnerFinal, admits)
		rep.Partner = &pr
	}
	rep.print(out)
	linger(ctx, cfg.Linger, metricsAddr, out)
	if pubErr != nil {
		return rep, fmt.Errorf("publish: %w", pubErr)
	}
	return rep, nil
}

// linger keeps the -metrics endpoint at addr serving for d after the
// summary (-linger), so that a scrape every 15 s or so still sees the run;
// ctx ending cuts it short.
func linger(ctx context.Context, d time.Duration, addr string, out io.Writer) {
	if d <= 0 || addr == "" {
		return
	}
	fmt.Fprintf(out, "serving the metrics at http://%s/metrics for %v more (-linger)\n", addr, d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// natsRun is the NATS side of a run: the connection (and the server's
// name for the header), the stream and durable consumer, and the recorder
// that counts from start; server is the embedded server (nil with -nats).
type natsRun struct {
	server *embeddedNATS
	nc     *nats.Conn
	name   string
	js     jetstream.JetStream
	source natsSource
	start  time.Time
	rec    *recorder
}

// natsSource is where a worker process consumes: the stream, and its
// consumer config (cc; a consumer of its own per tenant with -fair, the
// durable cons of the whole stream without).
type natsSource struct {
	stream jetstream.Stream
	cons   jetstream.Consumer // nil with -fair
	cc     jetstream.ConsumerConfig
	fair   bool
}

// openNATS connects, sets up the stream and consumer, starts the recorder
// for jobs jobs, and watches for messages the server stops delivering
// (MaxDeliver reached): they are lost to this consumer, so they are
// counted and no longer waited for.
//
// Without -nats, it starts an embedded server with JetStream whose store
// is in a new temporary directory; cl shuts it down and removes the
// directory after the connection is drained.
func openNATS(ctx context.Context, cfg config, jobs int, cl *closers) (natsRun, error) {
	url, name := cfg.NATSURL, "external"
	var srv *embeddedNATS
	if url == "" {
		var err error
		if srv, err = startEmbeddedNATS(); err != nil {
			return natsRun{}, err
		}
		cl.add(srv.close)
		url, name = srv.url(), "embedded"
	}
	nc, err := connect(url, cl)
	if err != nil {
		return natsRun{}, err
	}
	cc := consumerConfig()
	if cfg.Faults != "" {
		cc.MaxDeliver = faultMaxDeliver
	}
	js, src, err := setUpStream(ctx, nc, cfg.NATSURL != "", cc, cfg.Fair, cl)
	if err != nil {
		return natsRun{}, err
	}
	start := time.Now()
	rec := newRecorder(start, jobs)
	if err := watchMaxDeliveries(nc, rec, cl); err != nil {
		return natsRun{}, err
	}
	return natsRun{server: srv, nc: nc, name: name, js: js, source: src, start: start, rec: rec}, nil
}

// watchMaxDeliveries counts, in rec, the messages the server gives up on
// (MAX_DELIVERIES advisories of the worker's consumers: the durable, or
// one per tenant with -fair). cl unsubscribes.
func watchMaxDeliveries(nc *nats.Conn, rec *recorder, cl *closers) error {
	advSub, err := nc.Subscribe(jetstream.DefaultAPIPrefix+"EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+streamName+".*", func(m *nats.Msg) {
		var adv struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		if json.Unmarshal(m.Data, &adv) == nil {
			rec.maxDelivered(adv.StreamSeq)
		}
	})
	if err != nil {
		return err
	}
	cl.add(func() { advSub.Unsubscribe() })
	return nil
}

// maxHandlers bounds -handlers: each is a goroutine, and a waiting message
// of each tenant is held in process with -fair.
const maxHandlers = 1024

// maxInstances bounds -instances: each is a process of its own, and a
// typo (100000) would start processes until the machine gave out.
const maxInstances = 64

// The NATS handler decides and handles cfg.Handlers messages at once
// (natsthrottle.WithConcurrency), shared fairly across tenants with -fair.
// Without -fair, Handler.Consume pulls at most as many at a time, in pull
// requests of a second, so that a message waits about a -work for its
// decision (nats.go's Consume buffers 500 by default, whose AckWait runs
// while they wait: redelivered while the stale copies are still
// buffered, they were handled twice), and a pull request the server no
// longer holds ends within a second (with nats.go's Consume and
// PullMaxMessages(16), 2 of about 200 runs of TestRunReservations under
// load got no delivery for 30 s, until its missed heartbeats: the stream
// still held hundreds of jobs, and of those delivered only NAKed ones
// were unacknowledged: no pull request was being served). A wait for a
// slot restarts its AckWait (natsthrottle sends InProgress).
// With -fair each tenant's consumer is pulled one message at a time,
// when it can start.

// consume runs w's handler on src, gated by gate and, when not nil, by the
// in-flight limit inf, with cfg.Handlers handlers: with -fair through
// natsthrottle.ConsumeByKey (a consumer per tenant, pulled in the order of
// the fair shares, weighted by weight), else through Handler.Consume. The
// returned function stops pulling, then waits for the messages the
// throttle holds; it is safe to call more than once.
func consume(src natsSource, cfg config, weight func(string) float64, gate *throttle.Gate, inf throttle.InFlightLimiter, w *worker, tp trace.TracerProvider) (func(), error) {
	throttled, err := natsthrottle.New(w.handle, gate,
		natsthrottle.WithKeyFunc(func(m jetstream.Msg) (string, error) { return tenantOf(m.Subject()) }),
		natsthrottle.WithCostFunc(jobCost),
		natsthrottle.WithConsumerConfig(src.cc), // MaxDeliver and AckWait, as created
		// Decisions are Redis round trips with -redis: 16 at once keep up
		// with a burst of thousands, so the slots of messages that come
		// back meanwhile are claimed on time.
		natsthrottle.WithConcurrency(cfg.Handlers),
		natsthrottle.WithFair(cfg.Fair),
		natsthrottle.WithWeights(weight),
		// At most -inflight handlers of a tenant at once (nil: no limit).
		natsthrottle.WithInFlight(inf, inFlightLease),
		natsthrottle.WithTracerProvider(tp),
		natsthrottle.WithPropagators(propagation.TraceContext{}),
		natsthrottle.WithErrorHandler(func(m jetstream.Msg, err error) {
			subject := "consumer"
			if m != nil {
				subject = m.Subject()
			}
			w.throttleErrs.add(subject, err)
		}),
	)
	if err != nil {
		return nil, err
	}
	maxDeliver := src.cc.MaxDeliver
	observe := func(m jetstream.Msg) jetstream.Msg {
		w.receivedNow(m)
		tenant, _ := tenantOf(m.Subject())
		return observedMsg{Msg: m, rec: w.rec, tenant: tenant, reserved: w.reserved, maxDeliver: maxDeliver}
	}
	closeThrottled := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		throttled.Close(cctx)
	}
	if src.fair {
		kc, err := throttled.ConsumeByKey(src.stream, keyedConfig(src.cc), natsthrottle.WrapPulled(observe))
		if err != nil {
			return nil, fmt.Errorf("consume: %w", err)
		}
		return sync.OnceFunc(func() {
			kc.Stop()
			closeThrottled()
		}), nil
	}
	cc, err := throttled.Consume(observedConsumer{Consumer: src.cons, observe: observe})
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	return sync.OnceFunc(func() {
		cc.Stop()
		select {
		case <-cc.Closed():
		case <-time.After(10 * time.Second):
		}
		closeThrottled()
	}), nil
}

// faultSetup is what the faults of a run need from its start: the kinds
// of -faults and the redis-server of -redis local (nil without).
type faultSetup struct {
	kinds []string
	redis *localRedis
}

// firstErr returns a channel that gets the first error sent on any of
// errs (nil channels are ignored).
func firstErr(errs ...<-chan error) <-chan error {
	out := make(chan error, len(errs))
	for _, c := range errs {
		if c != nil {
			go func() { out <- <-c }()
		}
	}
	return out
}

// allClosed returns a channel closed once every one of chans is closed.
func allClosed(chans ...<-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for _, c := range chans {
			<-c
		}
		close(done)
	}()
	return done
}

// wait prints a progress line every cfg.Progress until complete is closed
// (every job handled or lost), publishing fails, something arrives on
// abort (a worker process ended early), cfg.Timeout passes or ctx is done.
// It returns why it stopped early ("" when every job was handled or lost),
// the publishing error, and whether it received the publisher's result.
func wait(ctx context.Context, cfg config, complete <-chan struct{}, progressLine func() string, pubDone, abort <-chan error, out io.Writer) (stopReason string, pubErr error, pubReturned bool) {
	progress := time.NewTicker(cfg.Progress)
	defer progress.Stop()
	timeout := time.NewTimer(cfg.Timeout)
	defer timeout.Stop()
	for {
		select {
		case <-complete:
			return "", nil, pubReturned
		case err := <-pubDone:
			pubDone, pubReturned = nil, true
			if err != nil {
				return "publishing failed: " + err.Error(), err, true
			}
		case err := <-abort:
			return err.Error(), nil, pubReturned
		case <-progress.C:
			fmt.Fprintln(out, progressLine())
		case <-timeout.C:
			return fmt.Sprintf("timed out after %v", cfg.Timeout), nil, pubReturned
		case <-ctx.Done():
			return "interrupted", nil, pubReturned
		}
	}
}

// stopPublisher ends the publisher of a run that wait stopped (pubDone
// gets its result; pubReturned: already got) and returns the run's
// publishing error. When every job was handled (no stopReason), every one
// was published and the last acknowledgements may still be on their way:
// it waits for them (up to a publish attempt's timeout) before it cancels,
// else the summary would show a job handled that was never published.
func stopPublisher(stopReason string, pubErr error, pubReturned bool, pubDone <-chan error, cancel func()) error {
	if !pubReturned && stopReason == "" {
		select {
		case err := <-pubDone:
			pubReturned = true
			if err != nil && pubErr == nil {
				pubErr = err
			}
		case <-time.After(publishAttemptTimeout):
		}
	}
	cancel()
	if !pubReturned {
		if err := <-pubDone; err != nil && pubErr == nil && !errors.Is(err, context.Canceled) {
			pubErr = err
		}
	}
	return pubErr
}

// closers are cleanup functions, run last in, first out.
type closers struct{ fs []func() }

func (c *closers) add(f func()) { c.fs = append(c.fs, f) }

// run runs the functions added so far, once.
func (c *closers) run() {
	for i := len(c.fs) - 1; i >= 0; i-- {
		c.fs[i]()
	}
	c.fs = nil
}

// tracing returns the tracer provider for -trace: a no-op provider, or one
// that prints spans to out with the stdout exporter and is flushed and shut
// down by cl.
func tracing(mode string, out io.Writer, cl *closers) (trace.TracerProvider, error) {
	switch mode {
	case "":
		return noop.NewTracerProvider(), nil
	case "stdout":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(out))
		if err != nil {
			return nil, fmt.Errorf("trace exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
		cl.add(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(ctx); err != nil {
				fmt.Fprintln(out, "trace shutdown:", err)
			}
		})
		return tp, nil
	default:
		return nil, fmt.Errorf(`-trace: %q is not supported (use "stdout")`, mode)
	}
}

// dialRedis connects to the Redis at url, or returns nil for an empty
// url. The client honours context deadlines (ContextTimeoutEnabled), as
// the hybrid bucket requires. cl closes it.
func dialRedis(ctx context.Context, url string, cl *closers) (*redis.Client, error) {
	if url == "" {
		return nil, nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("-redis: %w", err)
	}
	opt.ContextTimeoutEnabled = true
	rc := redis.NewClient(opt)
	cl.add(func() { rc.Close() })
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rc.Ping(pctx).Err(); err != nil {
		return nil, fmt.Errorf("-redis: ping %s: %w", opt.Addr, err)
	}
	return rc, nil
}

// newLimiter returns the limiter of spec with the per-tenant quotas q, and
// a description of it: in process when rc is nil, otherwise in Redis with
// keys under prefix (a prefix of their own for this run), its quotas in
// the Redis hash q.hashKey. cl closes a hybrid, returning its unused
// tokens, before it closes rc.
func newLimiter(ctx context.Context, spec limiterSpec, rc *redis.Client, prefix string, q *quotas, cl *closers) (*recordingLimiter, string, error) {
	f, err := q.source(ctx, rc, cl)
	if err != nil {
		return nil, "", err
	}
	lim, err := newFamilyLimiter(spec, rc, prefix, q.def.Rate, f)
	if err != nil {
		return nil, "", err
	}
	cl.add(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lim.close(ctx)
	})
	addr := ""
	if rc != nil {
		addr = rc.Options().Addr
	}
	return lim, spec.describe(addr), nil
}

// connect connects to the NATS server at url; cl drains the connection.
// The connection reconnects without end, a tenth of a second apart, so a
// restarted server (restart-nats) is found again at once.
func connect(url string, cl *closers) (*nats.Conn, error) {
	closed := make(chan struct{})
	nc, err := nats.Connect(url, nats.Name("queuethrottle example worker"),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	cl.add(func() {
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			nc.Close()
		}
	})
	return nc, nil
}

// setUpStream creates the jobs stream and, without fair shares, the
// worker's durable consumer with config cc (with them, natsthrottle's
// ConsumeByKey creates a consumer per tenant from cc).
// On an external server, a stream left by an earlier run is deleted first,
// and the stream is deleted again by cl.
func setUpStream(ctx context.Context, nc *nats.Conn, external bool, cc jetstream.ConsumerConfig, fair bool, cl *closers) (jetstream.JetStream, natsSource, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, natsSource{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if external {
		if err := js.DeleteStream(ctx, streamName); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, natsSource{}, fmt.Errorf("delete the stream %s of an earlier run: %w", streamName, err)
		}
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       streamName,
		Subjects:   []string{subjectPrefix + ">"},
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return nil, natsSource{}, fmt.Errorf("create stream %s: %w", streamName, err)
	}
	if external {
		cl.add(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			js.DeleteStream(ctx, streamName)
		})
	}
	src := natsSource{stream: stream, cc: cc, fair: fair}
	if fair {
		return js, src, nil
	}
	if src.cons, err = stream.CreateOrUpdateConsumer(ctx, cc); err != nil {
		return nil, natsSource{}, fmt.Errorf("create consumer %s: %w", durableName, err)
	}
	return js, src, nil
}

// findSource looks up the stream, and its durable consumer without fair
// shares, that the main process set up (for a worker process).
func findSource(ctx context.Context, js jetstream.JetStream, cfg config) (natsSource, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		return natsSource{}, fmt.Errorf("stream %s: %w", streamName, err)
	}
	cc := consumerConfig()
	if cfg.Faults != "" {
		cc.MaxDeliver = faultMaxDeliver
	}
	src := natsSource{stream: stream, cc: cc, fair: cfg.Fair}
	if cfg.Fair {
		return src, nil
	}
	if src.cons, err = stream.Consumer(ctx, durableName); err != nil {
		return natsSource{}, fmt.Errorf("consumer %s of stream %s: %w", durableName, streamName, err)
	}
	return src, nil
}

// worker is the job handler. It runs only for admitted messages, on the
// Consume goroutine or, for a message held on its last delivery, on the
// throttle's goroutine for it.
type worker struct {
	rec      events
	tracer   trace.Tracer
	proc     int            // worker process, with -instances
	reserved *reservedIDs   // the rejections of the Gate's limiter that reserved a slot
	work     time.Duration  // -work: how long every handler takes
	partner  *partnerClient // -partner-quota: called once per job

	handlerErrs, throttleErrs errorLog

	received  sync.Map     // deliveryKey -> time.Time: when the delivery reached the worker
	delivered atomic.Int64 // deliveries that reached the worker
}

// deliveryKey names one delivery of a message: "SEQ:NUMDELIVERED".
func deliveryKey(m jetstream.Msg) (string, bool) {
	md, err := m.Metadata()
	if err != nil {
		return "", false
	}
	return strconv.FormatUint(md.Sequence.Stream, 10) + ":" + strconv.FormatUint(md.NumDelivered, 10), true
}

// receivedNow notes when the delivery m reached the worker, for its run's
// record (handled.Received).
func (w *worker) receivedNow(m jetstream.Msg) {
	w.delivered.Add(1)
	if k, ok := deliveryKey(m); ok {
		w.received.Store(k, time.Now())
	}
}

// ackTimeout bounds the wait for the server's confirmation of an ack.
const ackTimeout = 5 * time.Second

// handle works on the job for -work, records it (start and end of the
// work) and acks it, waiting for the server's confirmation, which it
// records too.
func (w *worker) handle(m jetstream.Msg) {
	var j job
	if err := json.Unmarshal(m.Data(), &j); err != nil {
		w.handlerErrs.add("bad payload on "+m.Subject(), err)
		m.Term()
		return
	}
	var seq, delivery uint64
	if md, err := m.Metadata(); err == nil {
		seq, delivery = md.Sequence.Stream, md.NumDelivered
	}
	// The job's span is a child of the throttle's process span.
	ctx, span := w.tracer.Start(natsthrottle.ContextFromMsg(m), "handle "+j.ID)
	defer span.End()
	start := time.Now()
	received := start
	if k, ok := deliveryKey(m); ok {
		if t, ok := w.received.LoadAndDelete(k); ok {
			received = t.(time.Time)
		}
	}
	if w.work > 0 {
		time.Sleep(w.work)
	}
	if w.partner != nil {
		if ok, retry, err := w.partner.call(ctx); !ok {
			if err != nil {
				w.handlerErrs.add("partner "+j.ID, err)
				retry = time.Second
			}
			// Answered 429: back later (natsthrottle.Backoff pauses the
			// partner's key too), no delivery lost; not a handler run.
			if err := natsthrottle.Backoff(m, retry); err != nil {
				w.handlerErrs.add("backoff "+j.ID, err)
			}
			return
		}
	}
	w.rec.handle(handled{Tenant: j.Tenant, JobID: j.ID, Ref: strconv.FormatUint(seq, 10), Proc: w.proc, At: start.UnixNano(), End: time.Now().UnixNano(),
		Delivery: delivery, Received: received.UnixNano()})
	ctx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	if err := m.DoubleAck(ctx); err != nil {
		w.handlerErrs.add("ack "+j.ID, err)
		return
	}
	// A duplicate run is put down to a fault only if the ack of the run
	// before it was never confirmed (see explainDuplicates).
	w.rec.acked(j.ID, w.proc, delivery, time.Now())
}

// jobCost is the cost the throttle charges for a message: the job's cost.
func jobCost(m jetstream.Msg) (int, error) {
	var j job
	if err := json.Unmarshal(m.Data(), &j); err != nil {
		return 0, fmt.Errorf("job payload: %w", err)
	}
	return max(j.Cost, 1), nil
}

// publishAttemptTimeout bounds one attempt to publish a job.
const publishAttemptTimeout = 5 * time.Second

// publish sends each job to jobs.<tenant> at start + its arrival offset,
// with the job id as Nats-Msg-Id so a resend is deduplicated, and the trace
// context of a producer span in the headers. A failed publish is retried
// (see retry) until it succeeds or ctx is done, and so is enqueue; each
// job that needed retries gets a line on out.
//
// With enqueue, each job is also handed to it right after it is
// published; enqueue's second argument reports whether an earlier
// attempt failed (the task may be there already).
//
// Each tenant's jobs go out in their order from a goroutine of their own,
// as from producers of their own: a tenant that dumps thousands of jobs at
// once delays only its own. One publisher for all would hold the other
// tenants' jobs back behind the dump and release them in a clump, over
// their limits, which is not the trace. The first error stops every
// tenant's publishing and is returned.
func publish(ctx context.Context, js jetstream.JetStream, core *coreSender, tracer trace.Tracer, prop propagation.TextMapPropagator, jobs []job, start time.Time, rec *recorder, enqueue func(context.Context, job, bool) error, out io.Writer) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, tenantJobs := range jobsByTenant(jobs) {
		wg.Go(func() {
			if err := publishInOrder(ctx, js, core, tracer, prop, tenantJobs, start, rec, enqueue, out); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// jobsByTenant splits jobs by tenant, each tenant's in their order in jobs.
func jobsByTenant(jobs []job) [][]job {
	var split [][]job
	index := map[string]int{}
	for _, j := range jobs {
		i, ok := index[j.Tenant]
		if !ok {
			i = len(split)
			index[j.Tenant] = i
			split = append(split, nil)
		}
		split[i] = append(split[i], j)
	}
	return split
}

// publishInOrder is publish for jobs one after another, in their order.
func publishInOrder(ctx context.Context, js jetstream.JetStream, core *coreSender, tracer trace.Tracer, prop propagation.TextMapPropagator, jobs []job, start time.Time, rec *recorder, enqueue func(context.Context, job, bool) error, out io.Writer) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for _, j := range jobs {
		if d := time.Until(start.Add(j.at())); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		data, err := json.Marshal(j)
		if err != nil {
			return err
		}
		subject := subjectPrefix + j.Tenant
		sctx, span := tracer.Start(ctx, "send "+subject, trace.WithSpanKind(trace.SpanKindProducer))
		msg := nats.NewMsg(subject)
		msg.Data = data
		msg.Header.Set(jetstream.MsgIDHeader, j.ID)
		prop.Inject(sctx, natsthrottle.HeaderCarrier(msg.Header))
		if core != nil { // -core: no retries, no acks (core NATS has neither)
			err = core.send(msg, j.Tenant)
			span.End()
			if err != nil {
				return fmt.Errorf("job %s: %w", j.ID, err)
			}
			rec.published(j.Tenant, j.ID, 0)
		} else if err := publishJetStream(ctx, js, msg, j, rec, span, out); err != nil {
			return err
		}
		if enqueue != nil {
			failures, err := retry(ctx, func(ctx context.Context, n int) error { return enqueue(ctx, j, n > 1) }, retryLine(out, "enqueue job "+j.ID))
			if err != nil {
				return fmt.Errorf("enqueue job %s: %w", j.ID, err)
			}
			if failures > 0 {
				fmt.Fprintf(out, "enqueued job %s after %s\n", j.ID, plural(failures, "failed attempt"))
			}
		}
	}
	return nil
}

// publishJetStream publishes j's msg to the stream, retried, and records
// it; span is the send's, ended here.
func publishJetStream(ctx context.Context, js jetstream.JetStream, msg *nats.Msg, j job, rec *recorder, span trace.Span, out io.Writer) error {
	failures, err := retry(ctx, func(ctx context.Context, n int) error {
		pctx, cancel := context.WithTimeout(ctx, publishAttemptTimeout)
		defer cancel()
		ack, err := js.PublishMsg(pctx, msg)
		if err != nil {
			return err
		}
		// A duplicate after a failed attempt is that attempt's copy:
		// the stream is new, so nothing else has this id.
		if !ack.Duplicate || n > 1 {
			rec.published(j.Tenant, j.ID, ack.Sequence)
		}
		return nil
	}, retryLine(out, "publish job "+j.ID))
	span.End()
	if err != nil {
		return fmt.Errorf("job %s: %w", j.ID, err)
	}
	if failures > 0 {
		fmt.Fprintf(out, "published job %s after %s\n", j.ID, plural(failures, "failed attempt"))
	}
	return nil
}

// retryLine returns a function for retry's failures that prints the first
// one of what to out.
func retryLine(out io.Writer, what string) func(int, error) {
	return func(n int, err error) {
		if n == 1 {
			fmt.Fprintf(out, "%s: %v; retrying\n", what, err)
		}
	}
}

// observedConsumer is a consumer whose fetched messages pass through
// observe before Handler.Consume hands them to the throttle (as
// natsthrottle.WrapPulled does for ConsumeByKey).
type observedConsumer struct {
	jetstream.Consumer
	observe func(jetstream.Msg) jetstream.Msg
}

func (c observedConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(n, opts...)
	if err != nil {
		return nil, err
	}
	msgs := make(chan jetstream.Msg)
	go func() {
		defer close(msgs)
		for m := range b.Messages() {
			msgs <- c.observe(m)
		}
	}()
	return observedBatch{MessageBatch: b, msgs: msgs}, nil
}

// observedBatch is a fetched batch whose messages were observed; its
// Error is final once Messages is closed, as the batch's own.
type observedBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b observedBatch) Messages() <-chan jetstream.Msg { return b.msgs }

// observedMsg counts, per tenant, the NAKs and Terms the throttle sends and
// the messages it holds (keeps with InProgress on their last delivery),
// with their instants; a NAK is marked reserved when the rejection before
// it reserved the message's slot (reserved, filled by the tenantLimiter).
type observedMsg struct {
	jetstream.Msg
	rec        events
	tenant     string
	reserved   *reservedIDs
	maxDeliver int // the consumer's MaxDeliver (<= 0: none, so no holds)
}

func (m observedMsg) Nak() error {
	err := m.Msg.Nak()
	if err == nil {
		m.rec.nak(m.tenant, time.Now(), m.wasReserved())
	}
	return err
}

func (m observedMsg) NakWithDelay(d time.Duration) error {
	err := m.Msg.NakWithDelay(d)
	if err == nil {
		m.rec.nak(m.tenant, time.Now(), m.wasReserved())
	}
	return err
}

// wasReserved reports whether the last decision on this message reserved
// its slot. natsthrottle decides a message by its stream and stream
// sequence, "STREAM:SEQ".
func (m observedMsg) wasReserved() bool {
	md, err := m.Metadata()
	if err != nil || m.reserved == nil {
		return false
	}
	return m.reserved.take(md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10))
}

// InProgress counts a hold when the message is on its last delivery: the
// throttle also restarts the AckWait of a delivery as it starts waiting in
// process for its near slot.
func (m observedMsg) InProgress() error {
	err := m.Msg.InProgress()
	md, merr := m.Metadata()
	if err != nil || merr != nil || m.maxDeliver <= 0 || md.NumDelivered < uint64(m.maxDeliver) {
		return err
	}
	m.rec.hold(m.tenant, md.Sequence.Stream, time.Now())
	return err
}

func (m observedMsg) Term() error {
	err := m.Msg.Term()
	if err == nil {
		m.rec.term(m.tenant)
	}
	return err
}

func (m observedMsg) TermWithReason(reason string) error {
	err := m.Msg.TermWithReason(reason)
	if err == nil {
		m.rec.term(m.tenant)
	}
	return err
}

// errorLog keeps the first few errors of a kind and counts the rest. It is
// safe for concurrent use.
type errorLog struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (l *errorLog) add(what string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.first) < 5 {
		l.first = append(l.first, what+": "+err.Error())
	}
}

func (l *errorLog) print(w io.Writer, kind string) {
	for _, line := range l.lines(kind) {
		fmt.Fprintln(w, line)
	}
}

// lines returns the lines print writes.
func (l *errorLog) lines(kind string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lines []string
	for _, e := range l.first {
		lines = append(lines, kind+": "+e)
	}
	if l.n > len(l.first) {
		lines = append(lines, fmt.Sprintf("%s: ... %d more", kind, l.n-len(l.first)))
	}
	return lines
}

// plural returns "1 job", "2 jobs", "2 deliveries".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if stem, ok := strings.CutSuffix(noun, "y"); ok && stem != "" && !strings.ContainsAny(stem[len(stem)-1:], "aeiou") {
		return strconv.Itoa(n) + " " + stem + "ies" // delivery: deliveries
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// syncWriter serializes writes from the progress loop and the span
// exporter.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// consumersName names the JetStream consumers of a run.
func consumersName(fair bool) string {
	if fair {
		return "consumers " + durableName + "_<tenant>"
	}
	return "consumer " + durableName
}

// consumerInfo returns a line on the deliveries of the stream's consumers
// (the durable, or one per tenant with -fair) and their number, summed;
// or "" and ok false if the server does not answer.
func consumerInfo(stream jetstream.Stream) (line string, deliveries int, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n, delivered, ackPending int
	var pending uint64
	consumers := stream.ListConsumers(ctx)
	for ci := range consumers.Info() {
		n++
		delivered += int(ci.Delivered.Consumer)
		ackPending += ci.NumAckPending
		pending += ci.NumPending
	}
	if consumers.Err() != nil || n == 0 {
		return "", 0, false
	}
	which := "consumer " + durableName
	if n > 1 {
		which = fmt.Sprintf("%s (%s_<tenant>)", plural(n, "consumer"), durableName)
	}
	return fmt.Sprintf("%s: %s, %d unacknowledged, %d undelivered", which, plural(delivered, "delivery"), ackPending, pending), delivered, true
}

// printStop prints why the run stopped early, if it did, and the consumer
// line.
func printStop(out io.Writer, stopReason, info string) {
	if stopReason != "" {
		fmt.Fprintln(out, "stopped early:", stopReason)
	}
	if info != "" {
		fmt.Fprintln(out, info)
	}
}
