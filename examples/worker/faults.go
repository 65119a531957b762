package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Fault kinds, the values of -faults.
const (
	// faultKillRedis kills the redis-server of -redis local (SIGKILL) and
	// starts it again on the same port, from its append-only file,
	// redisDownFor later.
	faultKillRedis = "kill-redis"
	// faultPauseRedis stops the redis-server of -redis local (SIGSTOP)
	// for redisPauseFor, then continues it (SIGCONT): a hung server.
	faultPauseRedis = "pause-redis"
	// faultFlushRedis runs FLUSHALL on the limiters' redis-server of
	// -redis local: every window, bucket, slot and quota hash is gone at
	// once while their units still count.
	faultFlushRedis = "flush-redis"
	// faultRestartRedisEmpty kills the limiters' redis-server (SIGKILL)
	// and starts it again without its data, redisEmptyDownFor later: a
	// restart without persistence, or a failover to an empty replica.
	faultRestartRedisEmpty = "restart-redis-empty"
	// faultKillWorker kills one worker process of -instances (SIGKILL);
	// the others take over its messages (the server redelivers them
	// after AckWait) and a replacement starts workerReplaceAfter later.
	faultKillWorker = "kill-worker"
	// faultRestartNATS shuts the embedded nats-server down and starts it
	// again natsDownFor later on the same port and JetStream store.
	faultRestartNATS = "restart-nats"
)

// faultKinds are the kinds -faults accepts, in the order the usage lists
// them.
var faultKinds = []string{faultKillRedis, faultPauseRedis, faultFlushRedis, faultRestartRedisEmpty, faultKillWorker, faultRestartNATS}

// losesRedisData reports whether kinds lose the limiters' Redis data: a
// run with one keeps asynq's queues on a redis-server of their own, since
// losing them would lose jobs, not test the limiters.
func losesRedisData(kinds []string) bool {
	return slices.Contains(kinds, faultFlushRedis) || slices.Contains(kinds, faultRestartRedisEmpty)
}

// How long each fault lasts, and how they are spread.
const (
	redisDownFor       = 2 * time.Second
	redisPauseFor      = 3 * time.Second
	redisEmptyDownFor  = 150 * time.Millisecond
	natsDownFor        = time.Second
	workerReplaceAfter = time.Second
	// faultGap is the least time between the recovery from one fault and
	// the next fault.
	faultGap = time.Second
)

// faultMaxDeliver is the consumer's MaxDeliver in a run with faults:
// unlimited, instead of 5. While Redis is down or hung, the failure
// policy rejects (fail-closed), and every such NAK uses a delivery, unlike
// throttling's; a message on its last delivery is held in its worker
// process, and lost to the consumer if that process is killed then (the
// hybrid, without reservations, bounces often enough to get there).
const faultMaxDeliver = -1

// faultSettle is how long a run goes on after the recovery from its last
// fault, however soon every job was handled: long enough for the server
// to redeliver what a fault left unacknowledged (AckWait) and for the
// handler to run again, so the duplicates a fault causes are counted.
var faultSettle = consumerConfig().AckWait + 2*time.Second

// parseFaults parses the -faults list: kinds separated by commas, each at
// most once ("" for none).
func parseFaults(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var kinds []string
	for _, k := range strings.Split(list, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(faultKinds, k) {
			return nil, fmt.Errorf("-faults: %q is not one of %s", k, strings.Join(faultKinds, ", "))
		}
		if slices.Contains(kinds, k) {
			return nil, fmt.Errorf("-faults: %s is listed twice", k)
		}
		kinds = append(kinds, k)
	}
	return kinds, nil
}

// checkFaults refuses faults the run cannot inject: the Redis faults need
// the redis-server the worker starts (-redis local), kill-worker needs
// worker processes to kill (-instances 2 or more), restart-nats the
// embedded nats-server (no -nats).
func checkFaults(kinds []string, cfg config) error {
	for _, k := range kinds {
		switch k {
		case faultKillRedis, faultPauseRedis, faultFlushRedis, faultRestartRedisEmpty:
			if cfg.RedisURL != redisLocal {
				return fmt.Errorf("-faults %s needs -redis local: the worker can only kill or pause the redis-server it started (got -redis %q)", k, cfg.RedisURL)
			}
		case faultKillWorker:
			if cfg.Instances < 2 {
				return fmt.Errorf("-faults %s needs -instances 2 or more: it kills one worker process and the others take over (got -instances %d)", k, cfg.Instances)
			}
		case faultRestartNATS:
			if cfg.NATSURL != "" {
				return fmt.Errorf("-faults %s needs the embedded nats-server: it cannot restart the server of -nats %s", k, cfg.NATSURL)
			}
		}
	}
	return nil
}

// faultTargets are what the faults act on; nil when the run has none.
type faultTargets struct {
	redis *localRedis
	nats  *embeddedNATS
	procs *processes
}

// faultInjector injects the faults of a run, one after the other, each
// once the one before has recovered. Its channels: errs gets an error if a
// fault cannot be injected or recovered from (the run stops); settled is
// closed faultSettle after the recovery from the last fault.
type faultInjector struct {
	errs    chan error
	settled chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

// startFaults injects kinds on targets in the background: the i-th of k
// faults is planned at span × i/(k+1) after start (span is the trace's,
// so the faults fall while jobs arrive), and never before faultGap after
// the recovery from the one before. Each fault gets a line on out and,
// once recovered from, is passed to mark. The caller must call stop.
func startFaults(ctx context.Context, kinds []string, targets faultTargets, start time.Time, span time.Duration, mark func(faultMark), out io.Writer) *faultInjector {
	ctx, cancel := context.WithCancel(ctx)
	fi := &faultInjector{errs: make(chan error, 1), settled: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(fi.done)
		next := start
		for i, kind := range kinds {
			planned := start.Add(span * time.Duration(i+1) / time.Duration(len(kinds)+1))
			if !sleepUntil(ctx, maxTime(planned, next)) {
				return
			}
			at := time.Now()
			m, err := inject(ctx, kind, targets)
			recovered := time.Now()
			m.Kind, m.At, m.Until = kind, at.Sub(start), recovered.Sub(start)
			if err != nil {
				fi.errs <- fmt.Errorf("fault %s at t=%.1fs: %w", kind, m.At.Seconds(), err)
				return
			}
			fmt.Fprintf(out, "fault at t=%.1fs: %s: %s; recovered at t=%.1fs\n", m.At.Seconds(), kind, m.Detail, m.Until.Seconds())
			mark(m)
			next = recovered.Add(faultGap)
		}
		if sleepUntil(ctx, time.Now().Add(faultSettle)) {
			close(fi.settled)
		}
	}()
	return fi
}

// stop stops injecting (a fault under way still recovers) and waits.
func (fi *faultInjector) stop() {
	fi.cancel()
	<-fi.done
}

// sleepUntil waits until t and reports whether ctx was still live then.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// pause waits for d, or less if ctx is done first: a fault's outage is cut
// short when the run ends, and then recovered from at once.
func pause(ctx context.Context, d time.Duration) { sleepUntil(ctx, time.Now().Add(d)) }

// inject injects one fault of kind and recovers from it; the mark it
// returns has the Detail and Proc.
func inject(ctx context.Context, kind string, t faultTargets) (faultMark, error) {
	var m faultMark
	switch kind {
	case faultKillRedis:
		pid := t.redis.pid()
		if err := t.redis.kill(); err != nil {
			return m, err
		}
		pause(ctx, redisDownFor)
		if err := t.redis.restart(); err != nil {
			return m, err
		}
		m.Detail = fmt.Sprintf("SIGKILL to redis-server (pid %d), started again on %s after %v (pid %d)", pid, t.redis.addr(), redisDownFor, t.redis.pid())
	case faultPauseRedis:
		if err := t.redis.pause(); err != nil {
			return m, err
		}
		pause(ctx, redisPauseFor)
		if err := t.redis.resume(); err != nil {
			return m, err
		}
		m.Detail = fmt.Sprintf("SIGSTOP to redis-server (pid %d), SIGCONT %v later", t.redis.pid(), redisPauseFor)
	case faultFlushRedis:
		if err := t.redis.flushAll(ctx); err != nil {
			return m, err
		}
		m.Detail = fmt.Sprintf("FLUSHALL on redis-server %s: every limiter key gone while its units still count", t.redis.addr())
	case faultRestartRedisEmpty:
		pid := t.redis.pid()
		if err := t.redis.kill(); err != nil {
			return m, err
		}
		if err := t.redis.wipe(); err != nil {
			return m, err
		}
		pause(ctx, redisEmptyDownFor)
		if err := t.redis.restart(); err != nil {
			return m, err
		}
		m.Detail = fmt.Sprintf("SIGKILL to redis-server (pid %d), started again without its data on %s after %v (pid %d)", pid, t.redis.addr(), redisEmptyDownFor, t.redis.pid())
	case faultKillWorker:
		victim, pid, err := t.procs.killOne()
		if err != nil {
			return m, err
		}
		pause(ctx, workerReplaceAfter)
		id, newPid, err := t.procs.replace()
		if err != nil {
			return m, err
		}
		m.Proc = victim
		m.Detail = fmt.Sprintf("SIGKILL to worker process #%d (pid %d); the others take over its messages; #%d (pid %d) replaces it after %v", victim, pid, id, newPid, workerReplaceAfter)
	case faultRestartNATS:
		t.nats.shutdown()
		pause(ctx, natsDownFor)
		if err := t.nats.restart(); err != nil {
			return m, err
		}
		m.Detail = fmt.Sprintf("nats-server shut down, started again on %s with the same JetStream store after %v", t.nats.url(), natsDownFor)
	default:
		return m, errors.New("unknown fault")
	}
	return m, nil
}
