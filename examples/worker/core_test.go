package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

// coreJobs writes a trace of two tenants at 5/1s, 20 jobs each at t=0:
// "req" sends requests, "plain" plain messages.
func coreJobs(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"tenant":"req","rate":"5/1s","request":true}` + "\n")
	b.WriteString(`{"tenant":"plain","rate":"5/1s"}` + "\n")
	for i := range 20 {
		fmt.Fprintf(&b, `{"id":"req-%d","tenant":"req","at_ms":0}`+"\n", i)
		fmt.Fprintf(&b, `{"id":"plain-%d","tenant":"plain","at_ms":0}`+"\n", i)
	}
	path := filepath.Join(t.TempDir(), "core.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunCore: -core publishes on core NATS and consumes through
// natsthrottle.Core. With the default wait every job is handled exactly
// once within its limit and every request answered by the handler; with
// -core-max-wait 100ms the jobs that cannot start within it are given up,
// counted per tenant from the Core's reports, each request among them
// answered 429, none unanswered, and the run is OK.
func TestRunCore(t *testing.T) {
	cfg := defaultConfig()
	cfg.JobsPath = coreJobs(t)
	cfg.Core = true
	cfg.Timeout = 20 * time.Second
	rep, out := mustWork(t, cfg)
	jobs := map[string]int{"req": 20, "plain": 20}
	checkConsumer(t, rep, jobs)
	if a := rep.Requests; a == nil || a.ok != 20 || a.limited != 0 || a.unanswered != 0 {
		t.Errorf("requests %+v, want 20 answered by the handler", a)
	}
	if !strings.Contains(out.String(), "OK: all 40 jobs handled exactly once on core NATS") {
		t.Errorf("verdict: %q", lastLine(out.String()))
	}

	cfg.CoreMaxWait = 100 * time.Millisecond
	rep, out = mustWork(t, cfg)
	if !rep.OK() {
		t.Fatalf("not OK:\n%s", out.String())
	}
	by := byTenant(rep)
	for name, tr := range by {
		if tr.Handled+tr.GivenUp != 20 || tr.GivenUp < 10 || tr.MaxInWindow > 5 {
			t.Errorf("%s: handled %d, given up %d, max %d in a window; want 20 in all, at least 10 given up, <= 5", name, tr.Handled, tr.GivenUp, tr.MaxInWindow)
		}
	}
	a := rep.Requests
	if a == nil || a.ok != by["req"].Handled || a.limited != by["req"].GivenUp || a.unanswered != 0 {
		t.Errorf("requests %+v; want %d answered by the handler, %d answered 429, none unanswered", a, by["req"].Handled, by["req"].GivenUp)
	}
	if !strings.Contains(lastLine(out.String()), "given up and reported") {
		t.Errorf("verdict: %q", lastLine(out.String()))
	}
}

// TestRunCoreRedis runs coreJobs with the limits in Redis: with
// -instances 2 the worker processes share one limit per tenant (their
// admissions together within it) and the queue group spreads the jobs;
// in one process asynq gets the same jobs. With -core-max-wait 100ms the
// give-ups of every process are counted per tenant, each request among
// them answered 429, none unanswered.
func TestRunCoreRedis(t *testing.T) {
	for _, instances := range []int{1, 2} {
		t.Run(fmt.Sprintf("instances=%d", instances), func(t *testing.T) {
			cfg := defaultConfig()
			cfg.JobsPath = coreJobs(t)
			cfg.Core = true
			cfg.Instances = instances
			cfg.RedisURL = "redis://" + redistest.Start(t).Addr() + "/0"
			cfg.Timeout = 20 * time.Second
			cfg.CoreMaxWait = 100 * time.Millisecond
			rep, out := mustWork(t, cfg)
			if !rep.OK() {
				t.Fatalf("not OK: %s", lastLine(out.String()))
			}
			by := byTenant(rep)
			for name, tr := range by {
				if tr.Handled+tr.GivenUp != 20 || tr.GivenUp < 10 || tr.MaxInWindow > 5 {
					t.Errorf("%s: handled %d, given up %d, max %d in a window; want 20 in all, at least 10 given up, <= 5", name, tr.Handled, tr.GivenUp, tr.MaxInWindow)
				}
			}
			if a := rep.Requests; a == nil || a.ok != by["req"].Handled || a.limited != by["req"].GivenUp || a.unanswered != 0 {
				t.Errorf("requests %+v; want %d answered by the handler, %d answered 429, none unanswered", a, by["req"].Handled, by["req"].GivenUp)
			}
			if instances == 1 {
				if rep.Asynq == nil {
					t.Fatal("no asynq report with -redis")
				}
				checkConsumer(t, *rep.Asynq, map[string]int{"req": 20, "plain": 20})
			}
		})
	}
}

// TestCoreFlags: what -core does not run with is refused, naming the flag.
func TestCoreFlags(t *testing.T) {
	for _, c := range []func(*config){
		func(c *config) { c.Core, c.Faults = true, "kill-redis" },
		func(c *config) { c.CoreMaxWait = time.Second },
	} {
		cfg := defaultConfig()
		c(&cfg)
		if err := checkCore(cfg); err == nil || !strings.Contains(err.Error(), "-core") {
			t.Errorf("checkCore(%+v): %v, want an error naming -core", cfg, err)
		}
	}
}

// TestRunCoreFairShares runs fairTrace on core NATS: with the fair shares
// of -handlers the calm tenant starts about at once beside the floods,
// the floods' starts go about 3 to 1 (their weights), and every job runs
// exactly once, none given up; first come, first served (-fair=false)
// the calm tenant waits behind the floods.
func TestRunCoreFairShares(t *testing.T) {
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			cfg := defaultConfig()
			cfg.JobsPath = fairTrace(t)
			cfg.Core = true
			cfg.Fair = fair
			cfg.Handlers = 8
			cfg.Work = 100 * time.Millisecond
			cfg.Timeout = 30 * time.Second
			rep, out := mustWork(t, cfg)
			checkConsumer(t, rep, map[string]int{"gold": 160, "tin": 160, "calm": 25})
			if !strings.Contains(lastLine(out.String()), "OK: all 345 jobs handled exactly once on core NATS") {
				t.Errorf("verdict: %q", lastLine(out.String()))
			}
			by := byTenant(rep)
			calm := by["calm"]
			if !fair {
				if calm.WaitP50 < time.Second {
					t.Errorf("first come, first served: calm's p50 wait %v, want it behind the floods (over 1 s)", calm.WaitP50)
				}
				return
			}
			if calm.WaitP99 > 300*time.Millisecond {
				t.Errorf("calm's p99 wait %v beside the floods, want it about at once (under 300 ms)", calm.WaitP99)
			}
			// Both floods wait through seconds 1 and 2; gold's starts over
			// them are about 3 times tin's.
			g, tn := 0, 0
			for s := 1; s <= 2; s++ {
				g += by["gold"].StartsPerS[s]
				tn += by["tin"].StartsPerS[s]
			}
			if ratio := float64(g) / float64(tn); ratio < 2.4 || ratio > 3.6 {
				t.Errorf("gold %d, tin %d starts in seconds 1-2: ratio %.2f, want about 3", g, tn, ratio)
			}
		})
	}
}
