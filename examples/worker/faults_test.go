package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func TestParseFaults(t *testing.T) {
	tests := []struct {
		name, list string
		want       []string
		err        string
	}{
		{name: "none", list: ""},
		{name: "all", list: "kill-redis, pause-redis,kill-worker,restart-nats", want: []string{"kill-redis", "pause-redis", "kill-worker", "restart-nats"}},
		{name: "data loss", list: "flush-redis,restart-redis-empty", want: []string{"flush-redis", "restart-redis-empty"}},
		{name: "unknown", list: "kill-redis,crash", err: `-faults: "crash" is not one of`},
		{name: "twice", list: "kill-redis,kill-redis", err: "kill-redis is listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseFaults(tt.list)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("parseFaults(%q) = %v, %v; want %v", tt.list, got, err, tt.want)
			}
		})
	}
}

// TestRunFaultsRefused: a fault the run cannot inject is refused before
// anything starts, with an error naming the flag it needs.
func TestRunFaultsRefused(t *testing.T) {
	tests := []struct {
		name   string
		set    func(*config)
		errHas string
	}{
		{name: "kill-redis without -redis local", set: func(c *config) { c.Faults = "kill-redis"; c.RedisURL = "redis://127.0.0.1:1/0" }, errHas: "-faults kill-redis needs -redis local"},
		{name: "pause-redis without -redis", set: func(c *config) { c.Faults = "pause-redis" }, errHas: "-faults pause-redis needs -redis local"},
		{name: "flush-redis without -redis", set: func(c *config) { c.Faults = "flush-redis" }, errHas: "-faults flush-redis needs -redis local"},
		{name: "restart-redis-empty without -redis local", set: func(c *config) { c.Faults = "restart-redis-empty"; c.RedisURL = "redis://127.0.0.1:1/0" }, errHas: "-faults restart-redis-empty needs -redis local"},
		{name: "kill-worker without -instances", set: func(c *config) { c.Faults = "kill-worker"; c.RedisURL = redisLocal }, errHas: "-faults kill-worker needs -instances 2 or more"},
		{name: "restart-nats with -nats", set: func(c *config) { c.Faults = "restart-nats"; c.NATSURL = "nats://127.0.0.1:1" }, errHas: "-faults restart-nats needs the embedded nats-server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.JobsPath = writeJobs(t, 1, "5/1s", 0)
			tt.set(&cfg)
			_, err := work(context.Background(), cfg, &strings.Builder{})
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("err = %v, want %q", err, tt.errHas)
			}
		})
	}
}

// TestExplainDuplicates: a second run is put down to a fault only when the
// run before it had its delivery in hand when the fault came and its ack
// unconfirmed, and the second run is a later delivery after the fault;
// every other duplicate stays unexplained.
func TestExplainDuplicates(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s float64) int64 { return start.Add(time.Duration(s * float64(time.Second))).UnixNano() }
	run := func(proc int, delivery uint64, startS, ackS float64) handled {
		h := handled{JobID: "j", Proc: proc, Delivery: delivery, Received: at(startS), At: at(startS), End: at(startS)}
		if ackS > 0 {
			h.AckAt = at(ackS)
		}
		return h
	}
	kill := faultMark{Kind: faultKillWorker, Proc: 2, At: 5 * time.Second, Until: 6 * time.Second}
	restart := faultMark{Kind: faultRestartNATS, At: 5 * time.Second, Until: 6 * time.Second}
	redisKill := faultMark{Kind: faultKillRedis, At: 5 * time.Second, Until: 7 * time.Second}
	tests := []struct {
		name      string
		runs      []handled
		faults    []faultMark
		c         consumer
		explained bool
	}{
		{name: "killed before its ack", runs: []handled{run(2, 1, 4.9, 0), run(1, 2, 10, 10.1)}, faults: []faultMark{kill}, explained: true},
		{name: "no fault", runs: []handled{run(2, 1, 4.9, 0), run(1, 2, 10, 10.1)}},
		{name: "ack confirmed before the redelivery", runs: []handled{run(2, 1, 4.9, 4.95), run(1, 2, 10, 10.1)}, faults: []faultMark{kill}},
		{name: "another process killed", runs: []handled{run(3, 1, 4.9, 0), run(1, 2, 10, 10.1)}, faults: []faultMark{kill}},
		{name: "the same delivery twice", runs: []handled{run(2, 1, 4.9, 0), run(1, 1, 10, 10.1)}, faults: []faultMark{kill}},
		{name: "first run long before the fault", runs: []handled{run(2, 1, 1, 0), run(1, 2, 25, 25.1)}, faults: []faultMark{{Kind: faultKillWorker, Proc: 2, At: 20 * time.Second, Until: 21 * time.Second}}},
		{name: "second run before the fault", runs: []handled{run(2, 1, 4.8, 0), run(1, 2, 4.9, 4.95)}, faults: []faultMark{kill}},
		{name: "redelivery far too late", runs: []handled{run(2, 1, 4.9, 0), run(1, 2, 100, 100.1)}, faults: []faultMark{kill}},
		{name: "nats restart, ack confirmed after the redelivery", runs: []handled{run(1, 3, 4.9, 6.5), run(1, 4, 6.2, 6.3)}, faults: []faultMark{restart}, explained: true},
		{name: "nats restart, ack confirmed as the server came back", runs: []handled{run(1, 3, 4.9, 6.5), run(1, 4, 9, 9.1)}, faults: []faultMark{restart}, explained: true},
		{name: "nats restart, ack confirmed long after", runs: []handled{run(1, 3, 4.9, 8.5), run(1, 4, 9, 9.1)}, faults: []faultMark{restart}},
		{name: "nats restart, delivered while the server shut down", runs: []handled{run(1, 1, 5.05, 0), run(1, 2, 9, 9.1)}, faults: []faultMark{restart}, explained: true},
		{name: "nats restart, first delivered as the server came back", runs: []handled{run(1, 1, 6.5, 0), run(1, 2, 9, 9.1)}, faults: []faultMark{restart}, explained: true},
		{name: "nats restart, first delivered after the server came back", runs: []handled{run(1, 1, 8.5, 0), run(1, 2, 9, 9.1)}, faults: []faultMark{restart}},
		{name: "nats restart, redelivered as the server came back, then again", runs: []handled{run(1, 3, 6.1, 6.9), run(2, 4, 7.2, 7.3)}, faults: []faultMark{restart}, explained: true},
		{name: "nats restart, redelivered long after the server came back", runs: []handled{run(1, 3, 9, 9.5), run(2, 4, 10, 10.1)}, faults: []faultMark{restart}},
		{name: "nats restart, redelivered as it came back, the next run far too late", runs: []handled{run(1, 3, 6.1, 6.9), run(2, 4, 100, 100.1)}, faults: []faultMark{restart}},
		{name: "nats restart, the same delivery twice as it came back", runs: []handled{run(1, 3, 6.1, 6.9), run(2, 3, 7.2, 7.3)}, faults: []faultMark{restart}},
		{name: "redis fault does not explain NATS", runs: []handled{run(2, 1, 4.9, 0), run(1, 2, 10, 10.1)}, faults: []faultMark{{Kind: faultKillRedis, At: 5 * time.Second, Until: 7 * time.Second}}},
		{name: "asynq, redis killed as the task completed", runs: []handled{run(0, 1, 4.9, 0), run(0, 2, 40, 0)}, faults: []faultMark{{Kind: faultKillRedis, At: 5 * time.Second, Until: 7 * time.Second}}, c: consumerAsynq, explained: true},
		{name: "asynq, NATS restart does not explain", runs: []handled{run(0, 1, 4.9, 0), run(0, 2, 10, 0)}, faults: []faultMark{restart}, c: consumerAsynq},
		// asynq's recoverer runs a task left active about two minutes
		// later (lease 30 s, cutoff 30 s, every minute): t=120s in a run.
		{name: "asynq, run while redis was down, recovered at t=120s", runs: []handled{run(0, 1, 6, 0), run(0, 2, 120.3, 0)}, faults: []faultMark{redisKill}, c: consumerAsynq, explained: true},
		{name: "asynq, completed as asynq's client reconnected", runs: []handled{run(0, 1, 7.5, 0), run(0, 2, 120.3, 0)}, faults: []faultMark{redisKill}, c: consumerAsynq, explained: true},
		{name: "asynq, run while redis was paused", runs: []handled{run(0, 1, 6, 0), run(0, 2, 120.3, 0)}, faults: []faultMark{{Kind: faultPauseRedis, At: 5 * time.Second, Until: 8 * time.Second}}, c: consumerAsynq, explained: true},
		{name: "asynq, completed long after the recovery", runs: []handled{run(0, 1, 12, 0), run(0, 2, 120.3, 0)}, faults: []faultMark{redisKill}, c: consumerAsynq},
		{name: "asynq, completed long before the fault", runs: []handled{run(0, 1, 1, 0), run(0, 2, 120.3, 0)}, faults: []faultMark{redisKill}, c: consumerAsynq},
		{name: "asynq, recovered too late", runs: []handled{run(0, 1, 6, 0), run(0, 2, 190, 0)}, faults: []faultMark{redisKill}, c: consumerAsynq},
		{name: "asynq, the same delivery twice", runs: []handled{run(0, 1, 6, 0), run(0, 1, 120.3, 0)}, faults: []faultMark{redisKill}, c: consumerAsynq},
		{name: "asynq, second run before the fault", runs: []handled{run(0, 1, 4, 0), run(0, 2, 4.5, 0)}, faults: []faultMark{redisKill}, c: consumerAsynq},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := explainDuplicates(tt.runs, tt.faults, start, tt.c, time.Minute)["j"]
			want := dupRuns{unexplained: 1}
			if tt.explained {
				want = dupRuns{explained: 1}
			}
			if got != want {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}
}

// TestRunFaults runs a short trace with -redis local, two worker
// processes and two faults: kill-redis (the limiters' keys survive on the
// append-only file) and kill-worker (the other process takes over, a
// replacement starts). The report lists both faults, in order; no job is
// lost and no duplicate is left unexplained.
func TestRunFaults(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not on PATH")
		}
		t.Skip("redis-server not on PATH")
	}
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 20, "10/500ms", 20) // light: one job every 100 ms for 2 s
	cfg.RedisURL = redisLocal
	cfg.Instances = 2
	cfg.Faults = "kill-redis,kill-worker"
	cfg.Timeout = 45 * time.Second
	cfg.Report = filepath.Join(t.TempDir(), "report.json")
	var out strings.Builder
	err := run(context.Background(), cfg, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Errorf("run: %v", err)
	}
	for _, want := range []string{"started redis-server", "appendonly yes", "fault at t=", "kill-redis: SIGKILL to redis-server", "kill-worker: SIGKILL to worker process #", "#3 (pid"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	b, err := os.ReadFile(cfg.Report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		OK     bool `json:"ok"`
		Faults []struct {
			Kind string  `json:"kind"`
			AtS  float64 `json:"at_s"`
		} `json:"faults"`
		Consumers []struct {
			Name    string `json:"name"`
			Tenants []struct {
				Tenant    string `json:"tenant"`
				Published int    `json:"published"`
				Handled   int    `json:"handled"`
				Twice     int    `json:"handled_twice"`
				Explained *int   `json:"duplicates_explained"`
				Lost      int    `json:"lost"`
			} `json:"tenants"`
		} `json:"consumers"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Faults) != 2 || rep.Faults[0].Kind != faultKillRedis || rep.Faults[1].Kind != faultKillWorker ||
		rep.Faults[0].AtS <= 0 || rep.Faults[1].AtS <= rep.Faults[0].AtS {
		t.Errorf("faults = %+v, want kill-redis then kill-worker", rep.Faults)
	}
	if len(rep.Consumers) != 1 {
		t.Fatalf("%d consumers in the report, want nats", len(rep.Consumers))
	}
	for _, c := range rep.Consumers {
		handled := 0
		for _, tr := range c.Tenants {
			if tr.Lost != 0 || tr.Twice != 0 || tr.Explained == nil {
				t.Errorf("%s %s: lost %d, handled twice (unexplained) %d, duplicates_explained %v", c.Name, tr.Tenant, tr.Lost, tr.Twice, tr.Explained)
			}
			handled += tr.Handled
			if tr.Explained != nil {
				handled -= *tr.Explained
			}
		}
		if handled < 40 {
			t.Errorf("%s: %d jobs handled, want all 40", c.Name, handled)
		}
	}
	if !rep.OK {
		t.Error("report not ok")
	}
}

// TestRunLosesRedisData: flush-redis and restart-redis-empty fall while a
// tenant is held at its limit, on NATS and asynq: the limiters see the
// lost keys (every tenant within its bound: the report is ok), asynq's
// queues live on a redis-server of their own, and nothing is lost.
func TestRunLosesRedisData(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not on PATH")
		}
		t.Skip("redis-server not on PATH")
	}
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 60, "10/1s", 40) // the burst waits for its window throughout
	cfg.RedisURL = redisLocal
	cfg.Faults = "flush-redis,restart-redis-empty"
	cfg.Timeout = 60 * time.Second
	cfg.Report = filepath.Join(t.TempDir(), "report.json")
	var out strings.Builder
	err := run(context.Background(), cfg, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Errorf("run: %v", err)
	}
	for _, want := range []string{"asynq's queues on a redis-server of their own", "flush-redis: FLUSHALL on redis-server", "restart-redis-empty: SIGKILL to redis-server", "without its data"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	b, err := os.ReadFile(cfg.Report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		OK        bool `json:"ok"`
		Consumers []struct {
			Name    string `json:"name"`
			Tenants []struct {
				Tenant      string `json:"tenant"`
				Lost        int    `json:"lost"`
				MaxInWindow int    `json:"max_in_window"`
				Bound       int    `json:"bound"`
			} `json:"tenants"`
		} `json:"consumers"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Consumers) != 2 {
		t.Fatalf("%d consumers in the report, want nats and asynq", len(rep.Consumers))
	}
	for _, c := range rep.Consumers {
		for _, tr := range c.Tenants {
			if tr.Lost != 0 || tr.MaxInWindow > tr.Bound {
				t.Errorf("%s %s: %d lost, %d admitted in one window (bound %d)", c.Name, tr.Tenant, tr.Lost, tr.MaxInWindow, tr.Bound)
			}
		}
	}
	if !rep.OK {
		t.Error("report not ok: a tenant over its bound, or a job lost")
	}
}

// TestRecoveredComesBackAtOnce: a task asynq's recoverer found orphaned
// (its lease expired: kill-redis) is retried at once; a handler's own
// failure still gets asynq's backoff.
func TestRecoveredComesBackAtOnce(t *testing.T) {
	task := asynq.NewTask(taskType, nil)
	if d := failureRetryDelay(1, fmt.Errorf("recoverer: %w", asynq.ErrLeaseExpired), task); d != 0 {
		t.Errorf("delay after a lease expired = %v, want 0", d)
	}
	if d := failureRetryDelay(1, errors.New("handler failed"), task); d < 15*time.Second {
		t.Errorf("delay after a handler failure = %v, want asynq's backoff (15 s or more)", d)
	}
}

// TestReportExplainsAsynqFailed: an asynq table with failed attempts says
// what asynq counts as failed, and one without says nothing of it.
func TestReportExplainsAsynqFailed(t *testing.T) {
	for _, failed := range []int{0, 15} {
		rep := report{Consumer: consumerAsynq, Failed: failed, MaxRetry: 2}
		var b strings.Builder
		rep.printTable(&b, "")
		if got := strings.Contains(b.String(), "a lease that expired"); got != (failed > 0) {
			t.Errorf("%d failed: explanation shown %v, want %v; table:\n%s", failed, got, failed > 0, b.String())
		}
	}
}

// TestVerdictNamesOverLimit: a run that handled every job once but let a
// tenant over its bound, or over the in-flight limit, ends with FAIL
// naming it, never OK.
func TestVerdictNamesOverLimit(t *testing.T) {
	rep := report{Consumer: consumerNATS, Jobs: 2, InFlight: 2, Tenants: []tenantReport{
		{Tenant: "acme", MaxInWindow: 22, Bound: 20, BoundText: "limit 20"},
		{Tenant: "hooli", MaxInWindow: 5, Bound: 20, BoundText: "limit 20", MaxInFlight: 3},
	}}
	got := rep.verdict()
	for _, want := range []string{"FAIL: over the limit", "acme 22 in one window (limit 20)", "hooli 3 in flight (limit 2)"} {
		if !strings.Contains(got, want) {
			t.Errorf("verdict = %q, want it to contain %q", got, want)
		}
	}
	rep.Tenants[0].MaxInWindow, rep.Tenants[1].MaxInFlight = 20, 2
	if got := rep.verdict(); !strings.HasPrefix(got, "OK: ") {
		t.Errorf("verdict within the limits = %q, want OK", got)
	}
}
