package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

func TestMaxInFlight(t *testing.T) {
	run := func(at, end int64) handled { return handled{At: at, End: end} }
	tests := []struct {
		name string
		runs []handled
		want int
	}{
		{name: "none", want: 0},
		{name: "one", runs: []handled{run(0, 10)}, want: 1},
		{name: "overlap", runs: []handled{run(0, 10), run(5, 15), run(6, 7)}, want: 3},
		{name: "one ends as the next starts", runs: []handled{run(0, 10), run(10, 20), run(20, 30)}, want: 1},
		{name: "unsorted", runs: []handled{run(20, 30), run(0, 25), run(10, 12)}, want: 2},
		{name: "no end counts at its start", runs: []handled{run(5, 0), run(5, 0), run(0, 10)}, want: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := maxInFlight(tt.runs); got != tt.want {
				t.Errorf("maxInFlight = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestCharged(t *testing.T) {
	at := func(m int, id string) event {
		d := time.Duration(m) * time.Millisecond
		return event{lo: d, hi: d, n: 1, id: id}
	}
	tests := []struct {
		name   string
		events []event
		want   int
	}{
		{name: "distinct ids", events: []event{at(0, "a"), at(1, "b"), at(2, "")}, want: 3},
		{name: "again in the window", events: []event{at(0, "a"), at(500, "a"), at(999, "a")}, want: 1},
		{name: "again after the window", events: []event{at(0, "a"), at(1000, "a"), at(1500, "a")}, want: 2},
		{name: "no id always charged", events: []event{at(0, ""), at(1, "")}, want: 2},
		{name: "unsorted", events: []event{at(500, "a"), at(0, "a")}, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := len(charged(tt.events, time.Second)); got != tt.want {
				t.Errorf("%d charged, want %d", got, tt.want)
			}
		})
	}
}

func TestReportOverInFlight(t *testing.T) {
	rep := report{InFlight: 2, Tenants: []tenantReport{{Tenant: "a", MaxInFlight: 3}}}
	if rep.OK() {
		t.Fatal("report with 3 in flight at a limit of 2 is OK")
	}
	var b strings.Builder
	rep.printTable(&b, "")
	if !strings.Contains(b.String(), "3 (limit 2)") || !strings.Contains(b.String(), "OVER THE IN-FLIGHT LIMIT") {
		t.Errorf("table:\n%s", b.String())
	}
	rep.Tenants[0].MaxInFlight = 2
	if !rep.OK() {
		t.Fatal("report at the in-flight limit is not OK")
	}
}

// TestRunInFlight runs a burst of one tenant with -inflight 2 and -work:
// in process (the in-memory limits, NATS only) and across three worker
// processes sharing the Redis limits. At most 2 handlers of a tenant run
// at once, and the limit is reached; every job is handled exactly once,
// none lost (no MaxDeliver), within the rate limits.
func TestRunInFlight(t *testing.T) {
	for _, instances := range []int{1, 3} {
		t.Run(map[int]string{1: "in process", 3: "3 worker processes"}[instances], func(t *testing.T) {
			cfg := defaultConfig()
			cfg.JobsPath = writeJobs(t, 12, "50/1s", 4)
			cfg.Rate = "10/200ms"
			cfg.InFlight = 2
			cfg.Work = 100 * time.Millisecond
			cfg.Timeout = 20 * time.Second
			if instances > 1 {
				cfg.Instances = instances
				cfg.RedisURL = "redis://" + redistest.Start(t).Addr() + "/0"
			}
			rep, out := mustWork(t, cfg)
			checkConsumer(t, rep, map[string]int{"burst": 12, "light": 4})
			if !rep.OK() {
				t.Error("report not OK")
			}
			for _, tr := range rep.Tenants {
				if lost := tr.Terms + tr.MaxDeliver; lost != 0 {
					t.Errorf("tenant %s: %d lost", tr.Tenant, lost)
				}
			}
			burst := byTenant(rep)["burst"]
			if burst.MaxInFlight != 2 {
				t.Errorf("burst: %d handlers at once, want exactly 2", burst.MaxInFlight)
			}
			// Refused a slot, a job waits in process for one of its
			// tenant's handlers to end, its tenant's others in the stream.
			if burst.Naks+burst.Holds != 0 || rep.Deliveries != 16 {
				t.Errorf("burst: %d NAKs, %d holds, %d deliveries in all; want 0, 0 and 16", burst.Naks, burst.Holds, rep.Deliveries)
			}
			if !strings.Contains(out.String(), "2 (limit 2)") {
				t.Error("the summary does not show the in-flight column")
			}
			if s := out.String(); strings.Contains(s, "error:") {
				t.Error("an error was reported")
			}
		})
	}
}

// TestRunSlowHandlers runs the default jobs on three worker processes with
// the slowest handler -work allows (1.2 s, below a quarter of the AckWait
// of 5 s): a message waits in the client's buffer behind the 16 in
// flight, then perhaps in process for its slot (which restarts its
// AckWait), then runs, and is still handled once. (At 2.4 s, before
// waits restarted the AckWait, 5 to 12 of the 368 jobs were handled
// twice.)
func TestRunSlowHandlers(t *testing.T) {
	cfg := defaultConfig()
	cfg.JobsPath = "../../testdata/jobs.jsonl"
	cfg.Instances = 3
	cfg.RedisURL = "redis://" + redistest.Start(t).Addr() + "/0"
	cfg.Work = 1200 * time.Millisecond
	rep, out := mustWork(t, cfg)
	if !rep.ExactlyOnce() {
		t.Errorf("not every job handled exactly once:\n%s", out)
	}
	if !rep.OK() {
		t.Error("report not OK")
	}
}

// TestDrainNote: the worker warns before the run when -work leaves its
// handlers too little time for every job before -timeout, by the handlers
// of every process or by a tenant's -inflight share, and says nothing
// when they have the time.
func TestDrainNote(t *testing.T) {
	jf := jobsFile{}
	for i := range 320 {
		tenant := "hog"
		if i%10 == 0 {
			tenant = "calm"
		}
		jf.Jobs = append(jf.Jobs, job{ID: strconv.Itoa(i), Tenant: tenant, AtMS: int64(i)})
	}
	cfg := defaultConfig()
	cfg.Timeout = 5 * time.Second
	cfg.Work = 300 * time.Millisecond
	// 320 jobs of 300 ms on 16 handlers: at least 6 s.
	if got, want := drainNote(jf, cfg, 1), "note: 320 jobs of 300ms on 16 handlers: the run takes at least 6s, longer than -timeout 5s"; !strings.HasPrefix(got, want) {
		t.Errorf("one process: %q, want it to start %q", got, want)
	}
	if got := drainNote(jf, cfg, 2); got != "" {
		t.Errorf("two processes (3 s): %q, want no note", got)
	}
	// hog's 288 jobs, 4 at once: at least 21.6 s.
	cfg.InFlight = 4
	if got, want := drainNote(jf, cfg, 2), "note: hog's 288 jobs of 300ms, at most 4 at once (-inflight): the run takes at least 21.6s"; !strings.HasPrefix(got, want) {
		t.Errorf("-inflight 4: %q, want it to start %q", got, want)
	}
	cfg.Work = 0
	if got := drainNote(jf, cfg, 1); got != "" {
		t.Errorf("no -work: %q, want no note", got)
	}
	// The last job arrives at 319 ms: the handlers are not what binds.
	cfg.Timeout = 300 * time.Millisecond
	if got, want := drainNote(jf, cfg, 1), "note: the last job arrives at 319ms: the run takes at least 319ms, longer than -timeout 300ms"; !strings.HasPrefix(got, want) {
		t.Errorf("a trace longer than -timeout: %q, want it to start %q", got, want)
	}
	cfg.Work = time.Millisecond
	if got, want := drainNote(jf, cfg, 1), "note: the last job arrives at 319ms: the run takes at least 320ms"; !strings.HasPrefix(got, want) {
		t.Errorf("a trace longer than -timeout, -work 1ms: %q, want it to start %q", got, want)
	}
}
