// Command worker replays a trace of jobs from several tenants into a NATS
// JetStream stream and consumes it with a worker whose handler is gated per
// tenant by a sliding-window limit. Rejected messages are NAKed with the
// retry-after and come back later; at the end it prints, per tenant, how
// many jobs were published, handled and NAKed, and the most admitted (so
// handled) in any window against the limit, and it checks that every job
// was handled exactly once.
//
// With no flags it needs no services: it starts an embedded nats-server
// with JetStream in a temporary directory and uses the in-memory window.
// Jobs are published on jobs.<tenant> into the stream QT_EXAMPLE_JOBS and
// consumed by the durable pull consumer "worker" (explicit ack, MaxDeliver
// 5, AckWait 5s); the throttle key is the tenant and the cost the job's
// cost. With -nats, a stream QT_EXAMPLE_JOBS left on that server is
// deleted at the start and at the end, and no other stream may claim
// jobs.>. With -redis, the windows' keys get a prefix of their own for the
// run and expire after one window.
//
// The limit is checked where it is enforced: at the admissions, each timed
// by the clock read just before and after the limiter decided; "max in any
// 1s" counts only admissions certainly inside one window.
//
//	go run ./examples/worker                    # from the repository root
//	go run ./examples/worker -rate 5/1s         # a lower default limit
//	go run ./examples/worker -redis redis://localhost:6379/0 -nats nats://localhost:4222
//	go run ./examples/worker -trace stdout | tail
//
// The exit status is 1 when a job was not handled exactly once, when a
// tenant was handled faster than its limit, or on an error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"
)

// config is what the flags set.
type config struct {
	JobsPath string        // JSON Lines trace of jobs; see testdata/README.md
	Rate     string        // default per-tenant limit, throttle.ParseRate format
	RedisURL string        // use the Redis window at this URL instead of the in-memory one
	NATSURL  string        // use this NATS server instead of an embedded one
	Trace    string        // "" or "stdout"
	Timeout  time.Duration // give up waiting for the jobs after this long
	Progress time.Duration // interval of the progress lines
}

func defaultConfig() config {
	return config{
		JobsPath: "testdata/jobs.jsonl",
		Rate:     "20/1s",
		Timeout:  60 * time.Second,
		Progress: 500 * time.Millisecond,
	}
}

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.JobsPath, "jobs", cfg.JobsPath, "jobs `file` (JSON Lines), relative to the working directory")
	flag.StringVar(&cfg.Rate, "rate", cfg.Rate, "per-tenant `limit` COUNT/PERIOD, e.g. 20/1s; rate lines in the jobs file override it per tenant")
	flag.StringVar(&cfg.RedisURL, "redis", "", "Redis `URL` for the Redis sliding window (default: in-memory window)")
	flag.StringVar(&cfg.NATSURL, "nats", "", "NATS `URL` of a JetStream server (default: embedded server in a temp dir)")
	flag.StringVar(&cfg.Trace, "trace", "", "`exporter` of the spans: \"stdout\" prints them with the OpenTelemetry stdout exporter (default: no tracing)")
	flag.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "stop waiting for unhandled jobs after this long")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "worker: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, cfg, os.Stdout)
	stop()
	if err != nil {
		if !errors.Is(err, errCheckFailed) {
			fmt.Fprintln(os.Stderr, "worker:", err)
		}
		os.Exit(1)
	}
}

// errCheckFailed is returned by run when the summary shows a job not
// handled exactly once or a tenant over its limit; the summary says which.
var errCheckFailed = errors.New("check failed")

// run replays the jobs, prints progress and the summary to out, and
// returns errCheckFailed if the summary fails a check.
func run(ctx context.Context, cfg config, out io.Writer) error {
	rep, err := work(ctx, cfg, out)
	if err != nil {
		return err
	}
	if !rep.ExactlyOnce() || !rep.WithinLimits() {
		return errCheckFailed
	}
	return nil
}
