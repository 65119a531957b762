// Command bench measures queuethrottle's limiters side by side with their
// peers (go-redis/redis_rate, ulule/limiter, throttled/throttled,
// golang.org/x/time/rate), on a private redis-server it starts itself, and
// writes RESULTS.md. Run it from this directory:
//
//	go run .
//
// Speed is reported as ratios to references measured in the same round
// (Redis PING for Redis-backed limiters, a plain mutex bucket for local
// ones), because the machines are small and noisy. See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"
)

func main() {
	testing.Init()
	rounds := flag.Int("rounds", 25, "measurement rounds; every contender runs once per case in each round")
	benchtime := flag.Duration("benchtime", 80*time.Millisecond, "target duration of one measurement")
	out := flag.String("out", "RESULTS.md", "file to write the results to")
	skipAccuracy := flag.Bool("skip-accuracy", false, "skip the accuracy runs")
	flag.Parse()
	if err := flag.Set("test.benchtime", benchtime.String()); err != nil {
		fatal(err)
	}
	if *rounds < 1 {
		fatal(fmt.Errorf("-rounds must be >= 1"))
	}
	start := time.Now()
	env := describeEnv()

	srv, err := startServer()
	if err != nil {
		fatal(err)
	}
	defer srv.stop()
	stopServer = srv.stop
	client := srv.client()
	defer client.Close()
	env.redisVersion = redisVersion(client)

	// Warm up the connection pool, the server and the CPU before round 1.
	warmUntil := time.Now().Add(time.Second)
	ping, err := cPing.make(client, throughputLimits)
	if err != nil {
		fatal(err)
	}
	for time.Now().Before(warmUntil) {
		warm(ping.allow, []string{"-"})
	}

	cases := benchCases()
	// results[case][contender][round]
	results := make([][][]sample, len(cases))
	for ci := range cases {
		results[ci] = make([][]sample, len(throughputContenders))
	}
	for round := range *rounds {
		for ci, bc := range cases {
			n := len(throughputContenders)
			for j := range n {
				// Rotate the order every round and case, so that no
				// contender always runs first or last, or at the same
				// moment relative to the others.
				ki := (j + round*5 + ci) % n
				k := throughputContenders[ki]
				s, err := measure(client, k, bc)
				if err != nil {
					fatal(err)
				}
				results[ci][ki] = append(results[ci][ki], s)
				fmt.Fprintf(os.Stderr, "round %d/%d  %-22s %-32s %12.0f ns/op\n", round+1, *rounds, bc.name, k.name, s.nsOp)
			}
			if !bc.parallel {
				if err := retimeSequential(client, results[ci], bc, *benchtime); err != nil {
					fatal(err)
				}
			}
		}
	}
	_ = client.FlushAll(context.Background()).Err()

	var acc []accuracyResult
	if !*skipAccuracy {
		for _, k := range accuracyContenders {
			r, err := runAccuracy(srv.client, k)
			if err != nil {
				fatal(err)
			}
			fmt.Fprintf(os.Stderr, "accuracy %-30s total %d, max in 1 s %d (naive %d), probe burst %d, errors %d\n",
				k.name, r.total, r.maxCons, r.maxNaive, r.probeBurst, r.errs+r.probeErrs)
			acc = append(acc, r)
		}
	}
	env.loadEnd = loadAvg()
	env.duration = time.Since(start)
	env.rounds, env.benchtime = *rounds, *benchtime

	text := report(env, cases, results, acc)
	if err := os.WriteFile(*out, []byte(text), 0o644); err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "wrote %s in %v\n", *out, env.duration.Round(time.Second))
}

// stopServer stops the redis-server, if one was started, before a fatal
// exit.
var stopServer = func() {}

func fatal(err error) {
	stopServer()
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
