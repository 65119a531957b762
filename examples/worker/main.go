// Command worker replays a trace of jobs from several tenants into a NATS
// JetStream stream and consumes it with a worker whose handler is gated per
// tenant by a limit. Rejected messages are NAKed with the retry-after and
// come back later; at the end it prints, per tenant, how many jobs were
// published, handled and NAKed, and the most admitted (so handled) in any
// window against the limit, and it checks that every job was handled
// exactly once.
//
// With no flags it needs no services: it starts an embedded nats-server
// with JetStream in a temporary directory and uses the in-memory window.
// Jobs are published on jobs.<tenant> into the stream QT_EXAMPLE_JOBS and
// consumed by the durable pull consumer "worker" (explicit ack, MaxDeliver
// 5, AckWait 5s); the throttle key is the tenant and the cost the job's
// cost. With -nats, a stream QT_EXAMPLE_JOBS left on that server is
// deleted at the start and at the end, and no other stream may claim
// jobs.>.
//
// -redis local starts a redis-server from PATH on a free loopback port
// for the run (stopped at the end), with persistence (appendonly yes,
// appendfsync always) in a temporary directory when the run injects
// kill-redis, without it otherwise (an fsync per write slows every
// decision). -faults LIST injects,
// one after the other and spread over the trace, kill-redis (SIGKILL,
// restart on the same port 2 s later) and pause-redis (SIGSTOP for 3 s),
// which need -redis local; kill-worker (SIGKILL to one worker process of
// -instances, 2 or more; a replacement starts 1 s later); restart-nats
// (the embedded nats-server shuts down and starts again 1 s later on the
// same store). The publisher retries until each job is in (its id
// deduplicates a resend); with faults the consumer has no MaxDeliver, and
// the run lasts until AckWait after the last fault. The summary lists the
// faults and the jobs handled again because a fault caught their ack in
// flight (explained, see explainDuplicates); any other duplicate fails
// the check.
//
// -limiter picks the family: window (sliding window log; in memory, or
// window.NewRedis with -redis), bucket (token bucket; bucket.NewLocal, or
// bucket.NewRedis with -redis; capacity -burst, default each tenant's
// count) or hybrid (bucket.NewHybrid, which needs -redis; the summary shows
// its decisions made locally, by Redis and degraded). A bucket may admit
// its burst plus its refill in one window, and a hybrid also the refill of
// the 500 ms a leased token may be held: the summary states each tenant's
// bound, and only admissions beyond it fail the check.
//
// Per-tenant limits: -rate for every tenant, a rate line of the jobs file
// for its tenant, and a line "TENANT COUNT/PERIOD [burst N]" of the -rates
// file, which may also set the tenant's burst. The worker gives them to one
// limiter with WithQuotas (window.WithQuotas, bucket.WithQuotas); with
// -redis they come from a Redis hash (quota.RedisHash, field = tenant,
// value = quota) that the worker fills at start, so that
// `redis-cli HSET <prefix>quotas <tenant> 50/1s` changes a tenant's limit
// during the run, in every worker process within a second; the header
// names the hash, and the summary judges each tenant by its quota at the
// end.
//
// With -redis, the limiters' keys get a prefix of their own for the run
// (and expire soon after it), and an asynq server on the same Redis gets
// the same jobs: tasks of type "job" (payload the job, trace context in the
// headers, MaxRetry 2) on queues of their own for the run (one per
// tenant, up to 16), gated by a limiter of their own with asynqthrottle
// (IsFailure, RetryDelayFunc, WithClient). The summary covers both
// consumers, and the check also requires that no task was archived; the
// queues are deleted at the end.
// asynq keeps retry times in whole seconds, so the asynq side finishes
// later (the default trace: about 12 s instead of 8); raise -timeout for
// traces with slow limits.
//
// With -instances N (N > 1, needs -redis, NATS only), this process
// publishes the jobs and N worker processes, this program started again
// with hidden flags, consume them from the same durable consumer with the
// Redis limiter. Each sends what it does (admissions with their clock
// readings, handler runs) to this process as JSON lines on its stdout, and
// this process checks all of them together. The worker processes stop when
// the run ends, and on Linux are killed if this process dies.
//
// -inflight N allows each tenant N handlers at once, across every worker
// process (concurrency.NewRedis with -redis, else concurrency.NewMemory;
// natsthrottle.WithInFlight and asynqthrottle.WithInFlight, lease 500 ms),
// and -work D makes every handler take D before it acks. The summary then
// shows, per tenant, the most handlers running at once (from the start of
// each handler to the end of its work, before its ack), and the check
// fails when it is above N.
//
// The limit is checked where it is enforced: at the admissions, each timed
// by the clock read just before and after the limiter decided; "max in any
// 1s" counts only admissions certainly inside one window.
//
// While it runs, the progress lines show the totals and, per tenant, the
// handler runs per second over the last window of its limit against the
// limit; the summary ends with a sparkline per tenant (admissions per
// second, a full block at the limit).
//
// -plot FILE.svg draws the run with gonum/plot: one panel per tenant (and
// consumer) with the cost units admitted per 100 ms and in the window of
// the limit against the limit line (and a bucket's bound), the NAKs or
// asynq rejections per 100 ms, those whose decision reserved the
// message's own slot, the messages held on their last delivery, and the
// faults injected as vertical lines. -plot FILE.html is a page with the
// same SVG inline: no scripts, nothing loaded from the network.
//
// -metrics ADDR serves the Gates' OpenTelemetry metrics in Prometheus text
// format at http://ADDR/metrics while the worker runs (the OpenTelemetry
// Prometheus exporter on a registry of its own; with -redis the NATS and
// asynq Gates add up in one set of series; with -instances N each worker
// process serves its own on the port of ADDR plus its number, 1..N).
// Prometheus shows them as:
//
//	throttle_decisions_total{throttle_outcome, throttle_source, throttle_key}
//	    counter: decisions; outcome admitted, rejected or reserved (a
//	    rejection that holds the message's own future slot), source
//	    local, redis or degraded, key the tenant (throttle.WithKeyMetrics:
//	    the first 64 tenants, "other" beyond)
//	throttle_dispositions_total{throttle_disposition, throttle_key}
//	    counter: what the consumers did with messages not run at once:
//	    nak, deferred, wait (in process, once per message however often
//	    it asks again), hold, retry and requeued (asynq)
//	throttle_decision_duration_seconds_bucket{throttle_outcome, throttle_source, throttle_key, le}
//	throttle_decision_duration_seconds_sum, _count
//	    histogram: time to make one decision, in seconds
//	throttle_store_errors_total{throttle_algorithm}
//	    counter: store failures and timeouts (the failure policy decided);
//	    absent until the first one
//
// and with -limiter hybrid the Hybrids' own (bucket.WithMeterProvider):
//
//	throttle_hybrid_decisions_total{throttle_outcome, throttle_source}
//	    counter: the Hybrid's decisions; outcome admitted or rejected,
//	    source local (no Redis round trip), redis or degraded
//	throttle_hybrid_redis_duration_seconds_bucket{throttle_hybrid_op, le}
//	throttle_hybrid_redis_duration_seconds_sum, _count
//	    histogram: latency of its Redis calls (op lease or give_back)
//	throttle_hybrid_redis_errors_total{throttle_hybrid_op}
//	    counter: its failed Redis calls; absent until the first one
//	throttle_hybrid_breaker_transitions_total{throttle_hybrid_breaker_from, throttle_hybrid_breaker_to}
//	    counter: its circuit breaker's state changes; absent until the first
//
// and
//
//	target_info
//	    the resource (service.name and the SDK)
//
// Every series also has the labels otel_scope_name
// ("github.com/queuethrottle/queuethrottle/throttle", the Hybrids'
// ".../bucket"),
// otel_scope_version and otel_scope_schema_url. A Grafana dashboard for
// them is in examples/grafana/queuethrottle.json.
//
//	go run ./examples/worker                    # from the repository root
//	go run ./examples/worker -plot run.svg      # and draw the run
//	go run ./examples/worker -metrics localhost:9464 &
//	curl -s localhost:9464/metrics | grep throttle_decisions_total
//	go run ./examples/worker -rate 5/1s         # a lower default limit
//	go run ./examples/worker -limiter bucket -burst 5
//	go run ./examples/worker -redis redis://localhost:6379/0 -nats nats://localhost:4222
//	go run ./examples/worker -limiter hybrid -redis redis://localhost:6379/0
//	go run ./examples/worker -instances 3 -redis redis://localhost:6379/0
//	go run ./examples/worker -instances 3 -redis redis://localhost:6379/0 -inflight 2 -work 200ms
//	go run ./examples/worker -trace stdout | tail
//	go run ./examples/worker -redis local -instances 3 -faults kill-redis,pause-redis,kill-worker,restart-nats
//
// The exit status is 1 when a job was never handled or handled more than
// once without a fault to explain it, when a
// tenant was admitted beyond its limit (or its bucket's bound) or ran
// more handlers at once than -inflight, when an
// asynq task was archived, or on an error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	natsthrottle "github.com/queuethrottle/queuethrottle/consumers/nats"
)

// config is what the flags set.
type config struct {
	JobsPath  string // JSON Lines trace of jobs; see testdata/README.md
	Rate      string // default per-tenant limit, throttle.ParseRate format
	RatesPath string // per-tenant quotas, lines "TENANT QUOTA" (see quotas)
	RedisURL  string // use the Redis limiters at this URL, and run the asynq side too
	BrokerURL string // asynq's Redis, when not RedisURL's (set by the run, not a flag)
	// RedisLatency > 0 puts a proxy delaying each way by it between the
	// limiters and Redis (asynq's queues stay direct); RedisTimeout is the
	// limiters' per-call timeout (WithTimeout).
	RedisLatency time.Duration
	RedisTimeout time.Duration
	Limiter      string        // limiter family: window, bucket or hybrid
	Burst        int           // bucket capacity; 0 means each tenant's rate Count
	Instances    int           // > 1: run that many worker processes (needs RedisURL)
	NATSURL      string        // use this NATS server instead of an embedded one
	Trace        string        // "" or "stdout"
	Timeout      time.Duration // give up waiting for the jobs after this long
	Progress     time.Duration // interval of the progress lines
	// Reservations is the horizon of throttle.WithReservations: a rejected
	// job reserves its own slot up to this far ahead. 0 turns them off.
	Reservations time.Duration
	Report       string        // write the JSON report to this file
	Plot         string        // draw the run to this .svg or .html file
	Metrics      string        // serve the Gates' metrics for Prometheus on this address
	Linger       time.Duration // keep serving Metrics this long after the summary
	// InFlight > 0 allows each tenant that many handlers at once, across
	// every worker process (concurrency.NewRedis with -redis, else
	// concurrency.NewMemory); Work is how long every handler takes.
	InFlight int
	Work     time.Duration
	// Fair shares each consumer's Handlers handlers across tenants
	// (natsthrottle.ConsumeByKey and asynqthrottle's fair shares); false is
	// first come, first served.
	Fair     bool
	Handlers int
	// Faults is the -faults list: kill-redis, pause-redis, kill-worker,
	// restart-nats, comma-separated, injected during the run.
	Faults string
	// Partner is -partner (the partner's limit, stacked on every
	// tenant's), PartnerQuota -partner-quota (a simulated partner that
	// every handler calls once per job) and PartnerQuotaAfter its
	// changes, "T=RATE,...".
	Partner, PartnerQuota, PartnerQuotaAfter string
	// Core publishes the trace on core NATS and consumes it through
	// natsthrottle.Core, whose refused messages wait up to CoreMaxWait.
	Core        bool
	CoreMaxWait time.Duration

	// The hidden settings of a worker process of -instances.
	WorkerOnly bool   // be a worker process: consume, send records to stdout, stop at EOF on stdin
	WorkerID   int    // its number, 1..Instances
	KeyPrefix  string // the Redis key prefix of the run's limiters
	PartnerURL string // the partner server of the run
}

func defaultConfig() config {
	return config{
		JobsPath:     "testdata/jobs.jsonl",
		Rate:         "20/1s",
		Limiter:      familyWindow,
		Instances:    1,
		RedisTimeout: redisTimeout,
		Timeout:      60 * time.Second,
		Progress:     500 * time.Millisecond,

		Reservations: time.Minute,
		Fair:         true,
		Handlers:     16,
		CoreMaxWait:  natsthrottle.DefaultCoreMaxWait,
	}
}

// hiddenFlags are for the worker processes of -instances only, and left
// out of the usage message.
var hiddenFlags = map[string]bool{"worker-only": true, "worker-id": true, "key-prefix": true, "partner-url": true}

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.JobsPath, "jobs", cfg.JobsPath, "jobs `file` (JSON Lines), relative to the working directory")
	flag.StringVar(&cfg.Rate, "rate", cfg.Rate, "per-tenant `limit` COUNT/PERIOD, e.g. 20/1s; rate lines in the jobs file override it per tenant")
	flag.StringVar(&cfg.RatesPath, "rates", "", "per-tenant quotas `FILE`: lines \"TENANT COUNT/PERIOD [burst N]\", over -rate and the jobs file; with -redis they go to a Redis hash that HSET changes during the run")
	flag.StringVar(&cfg.Limiter, "limiter", cfg.Limiter, "limiter `family`: window (sliding window log), bucket (token bucket) or hybrid (token bucket deciding locally on tokens leased from Redis; needs -redis)")
	flag.IntVar(&cfg.Burst, "burst", 0, "bucket capacity `N` for -limiter bucket or hybrid (default: each tenant's rate count)")
	flag.StringVar(&cfg.RedisURL, "redis", "", "Redis `URL`: the limiters live in Redis, and an asynq server on it gets the same jobs; \"local\" starts a redis-server from PATH on a free loopback port for the run (with persistence when -faults has kill-redis) (default: in-process limiters, NATS only)")
	flag.DurationVar(&cfg.RedisLatency, "redis-latency", 0, "put a proxy that delays each way by this `duration` (whole ms) between the limiters and Redis (needs -redis; asynq's queues stay direct): a store far away")
	flag.DurationVar(&cfg.RedisTimeout, "redis-timeout", cfg.RedisTimeout, "each limiter's per-call Redis `timeout` (WithTimeout); about twice the round trip works")
	flag.IntVar(&cfg.Instances, "instances", cfg.Instances, "`N` > 1 (at most 64) runs N worker processes on the NATS server and the Redis limiter (needs -redis; NATS only)")
	flag.StringVar(&cfg.NATSURL, "nats", "", "NATS `URL` of a JetStream server (default: embedded server in a temp dir)")
	flag.StringVar(&cfg.Trace, "trace", "", "`exporter` of the spans: \"stdout\" prints them with the OpenTelemetry stdout exporter (default: no tracing)")
	flag.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "stop waiting for unhandled jobs after this long (at least "+faultTimeout.String()+" by default when -faults has kill-redis: asynq's tasks active at the kill come back only after asynq's 30s lease and its recoverer)")
	flag.DurationVar(&cfg.Reservations, "reservations", cfg.Reservations, "a rejected job reserves its own slot up to this `horizon` ahead and comes back once, to it (0: no reservations, rejections bounce)")
	flag.StringVar(&cfg.Report, "report", "", "write the run's report as JSON to `FILE`")
	flag.StringVar(&cfg.Plot, "plot", "", "draw the run per tenant (admissions per 100 ms against the limit, NAKs, reservations, holds, faults) to `FILE`.svg or FILE.html")
	flag.StringVar(&cfg.Metrics, "metrics", "", "serve the throttle's OpenTelemetry metrics in Prometheus text format at http://`ADDR`/metrics while the worker runs, e.g. localhost:9464; per tenant (throttle_key)")
	flag.DurationVar(&cfg.Linger, "linger", 0, "keep serving -metrics this `long` after the summary (needs -metrics, not with -instances), so that a periodic scrape sees the whole run")
	flag.IntVar(&cfg.InFlight, "inflight", 0, "at most `N` handlers of a tenant at once, across every worker process (in Redis with -redis; 0: no limit)")
	flag.DurationVar(&cfg.Work, "work", 0, "every handler takes this `duration` before it acks (below a quarter of the consumer's AckWait of 5s)")
	flag.BoolVar(&cfg.Fair, "fair", cfg.Fair, "share the handlers fairly across tenants (max-min fair shares, weighted by the jobs file's \"weight\"); NATS pulls each tenant's messages from a consumer of its own when they can start. -fair=false: first come, first served, from one consumer")
	flag.IntVar(&cfg.Handlers, "handlers", cfg.Handlers, "`N` handlers per process and consumer, NATS and asynq alike (1 to 1024)")
	flag.StringVar(&cfg.Faults, "faults", "", "inject these faults during the run, one after the other: a comma-separated `list` of kill-redis (SIGKILL, restart on the same port 2s later), pause-redis (SIGSTOP for 3s), flush-redis (FLUSHALL) and restart-redis-empty (SIGKILL, restart without the data 150ms later), which need -redis local; kill-worker (SIGKILL one worker process, a replacement starts), which needs -instances 2 or more; restart-nats (shut the embedded nats-server down and start it again on the same store)")
	flag.BoolVar(&cfg.WorkerOnly, "worker-only", false, "be a worker process of -instances")
	flag.IntVar(&cfg.WorkerID, "worker-id", 0, "number of the worker process")
	flag.StringVar(&cfg.KeyPrefix, "key-prefix", "", "Redis key prefix of the limiters")
	flag.StringVar(&cfg.PartnerURL, "partner-url", "", "the partner server of the run")
	flag.StringVar(&cfg.Partner, "partner", "", "the partner's `limit` COUNT/PERIOD: one key stacked on every tenant's limit (throttle.All), for both consumers and every process")
	flag.StringVar(&cfg.PartnerQuota, "partner-quota", "", "start a simulated partner that every handler calls once per job, accepting at most `RATE` (a sliding window the throttle is not told about) and answering the rest 429 with Retry-After; a job counts as handled when the partner accepted its call")
	flag.BoolVar(&cfg.Core, "core", false, "publish the trace on core NATS instead of JetStream (requests for a tenant whose rate line says \"request\": true) and consume it through natsthrottle.Core: a job that cannot wait is given up and reported (the report's given_up); with -redis asynq gets the jobs too, with -instances the processes share one queue group")
	flag.DurationVar(&cfg.CoreMaxWait, "core-max-wait", cfg.CoreMaxWait, "with -core, how long a job may wait in process for its slot or a handler (WithCoreMaxWait) before it is given up")
	flag.StringVar(&cfg.PartnerQuotaAfter, "partner-quota-after", "", "change the partner's quota during the run: `T=RATE`[,...] from the replay's start, e.g. 10s=10/1s")
	flag.Usage = usage
	flag.Parse()
	redis.SetLogger(newRedisLog(os.Stderr, time.Second))
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "worker: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	timeoutSet := false
	flag.Visit(func(f *flag.Flag) { timeoutSet = timeoutSet || f.Name == "timeout" })
	if !timeoutSet && strings.Contains(cfg.Faults, "kill-redis") {
		cfg.Timeout = max(cfg.Timeout, faultTimeout)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if cfg.WorkerOnly {
		err = workerProcess(ctx, cfg, closedOnEOF(os.Stdin), os.Stdout)
	} else {
		err = run(ctx, cfg, os.Stdout)
	}
	stop()
	if err != nil {
		if !errors.Is(err, errCheckFailed) {
			fmt.Fprintln(os.Stderr, "worker:", err)
		}
		os.Exit(1)
	}
}

// faultTimeout is the least default -timeout of a run that kills Redis.
const faultTimeout = 3 * time.Minute

// usage prints the flags but the hidden ones.
func usage() {
	out := flag.CommandLine.Output()
	fmt.Fprintf(out, "Usage of %s:\n", os.Args[0])
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	fs.SetOutput(out)
	flag.VisitAll(func(f *flag.Flag) {
		if !hiddenFlags[f.Name] {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
	fs.PrintDefaults()
}

// errCheckFailed is returned by run when the summary shows a job not
// handled exactly once, a tenant over its limit (or its bucket's bound),
// or an archived asynq task; the summary says which.
var errCheckFailed = errors.New("check failed")

// run replays the jobs, prints progress and the summary to out, and
// returns errCheckFailed if the summary fails a check.
func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.Plot != "" {
		if err := checkPlotPath(cfg.Plot); err != nil {
			return err
		}
	}
	start := time.Now()
	rep, err := work(ctx, cfg, out)
	if cfg.Report != "" && (err == nil || rep.Jobs > 0) {
		if werr := writeReport(cfg.Report, rep, time.Since(start)); werr != nil {
			return errors.Join(err, werr)
		}
	}
	if cfg.Plot != "" && (err == nil || rep.Jobs > 0) {
		if werr := plotRun(cfg, rep, out); werr != nil {
			return errors.Join(err, werr)
		}
	}
	if err != nil {
		return err
	}
	if !rep.OK() {
		return errCheckFailed
	}
	return nil
}
