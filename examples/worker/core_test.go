package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestCoreFlags: what -core does not run with is refused, naming the flag.
func TestCoreFlags(t *testing.T) {
	for _, c := range []func(*config){
		func(c *config) { c.Core, c.RedisURL = true, "redis://localhost:1/0" },
		func(c *config) { c.Core, c.Instances = true, 2 },
		func(c *config) { c.Core, c.InFlight = true, 2 },
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
