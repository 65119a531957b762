package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/internal/natsserver"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestMain runs the test binary as a worker process of -instances when it
// is started as one: with -instances, run starts os.Executable(), which in
// a test is this binary, with childEnv set.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if os.Getenv("QT_TEST_WORKER_PROCESS_FAILS") != "" {
			fmt.Fprintln(os.Stderr, "worker process failing on purpose")
			os.Exit(3)
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestParseJobs(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		jobs    []string // ids in arrival order
		rates   map[string]string
		weights map[string]float64
		wantErr string
	}{
		{
			name: "jobs sorted by arrival, cost defaults to 1",
			in: `{"id":"b1","tenant":"b","at_ms":20,"cost":2}
{"id":"a1","tenant":"a","at_ms":10}

{"id":"a2","tenant":"a","at_ms":10,"cost":1}`,
			jobs: []string{"a1", "a2", "b1"},
		},
		{
			name:  "rate override",
			in:    `{"tenant":"a","rate":"5/200ms"}` + "\n" + `{"id":"a1","tenant":"a","at_ms":0}`,
			jobs:  []string{"a1"},
			rates: map[string]string{"a": "5/200ms"},
		},
		{
			name:    "weights, with and without a rate",
			in:      `{"tenant":"a","rate":"5/200ms","weight":3}` + "\n" + `{"tenant":"b","weight":0.5}` + "\n" + `{"id":"a1","tenant":"a"}` + "\n" + `{"id":"b1","tenant":"b"}` + "\n" + `{"id":"c1","tenant":"c"}`,
			jobs:    []string{"a1", "b1", "c1"},
			rates:   map[string]string{"a": "5/200ms"},
			weights: map[string]float64{"a": 3, "b": 0.5, "c": 1},
		},
		{name: "no jobs", in: `{"tenant":"a","rate":"5/s"}`, wantErr: "no jobs"},
		{name: "bad json", in: `{"id":`, wantErr: "line 1"},
		{name: "unknown field", in: `{"id":"x","tenant":"a","at":1}`, wantErr: "unknown field"},
		{name: "missing id", in: `{"tenant":"a","at_ms":1}`, wantErr: "missing id"},
		{name: "missing tenant", in: `{"id":"x","at_ms":1}`, wantErr: "missing tenant"},
		{name: "tenant with dot", in: `{"id":"x","tenant":"a.b"}`, wantErr: "subject token"},
		{name: "duplicate id", in: `{"id":"x","tenant":"a"}` + "\n" + `{"id":"x","tenant":"b"}`, wantErr: "line 2: duplicate id"},
		{name: "negative offset", in: `{"id":"x","tenant":"a","at_ms":-1}`, wantErr: "at_ms"},
		{name: "offset beyond a day", in: `{"id":"x","tenant":"a","at_ms":1000000000000000}`, wantErr: "at_ms must be in [0, 86400000]"},
		{name: "long tenant", in: `{"id":"x","tenant":"` + strings.Repeat("t", 129) + `"}`, wantErr: "129 bytes, more than 128"},
		{name: "tenant with control character", in: `{"id":"x","tenant":"a\u0000b"}`, wantErr: "control or format characters"},
		{name: "long id", in: `{"id":"` + strings.Repeat("i", 257) + `","tenant":"a"}`, wantErr: "257 bytes, more than 256"},
		{name: "id with newline", in: `{"id":"x\r\ny","tenant":"a"}`, wantErr: "no spaces, control or format characters"},
		{name: "byte order mark", in: "\uFEFF" + `{"id":"x","tenant":"a"}`, jobs: []string{"x"}},
		{name: "two objects on a line", in: `{"id":"x","tenant":"a"} {"id":"y","tenant":"a"}`, wantErr: "line 1: more after the JSON object"},
		{name: "a brace after the object", in: `{"id":"x","tenant":"a"}}`, wantErr: "line 1: more after the JSON object"},
		{name: "fractional offset", in: `{"id":"x","tenant":"a","at_ms":1.5}`, wantErr: "line 1: at_ms must be an integer, got number 1.5"},
		{name: "offset as a string", in: `{"id":"x","tenant":"a","at_ms":"5"}`, wantErr: "line 1: at_ms must be an integer, got string"},
		{name: "invalid UTF-8", in: "{\"id\":\"x\",\"tenant\":\"ab\xff\"}", wantErr: "line 1: not valid UTF-8"},
		{name: "rate line twice", in: `{"tenant":"a","rate":"5/s"}` + "\n" + `{"tenant":"a","rate":"7/s"}` + "\n" + `{"id":"x","tenant":"a"}`, wantErr: "line 2: a second rate line for tenant a"},
		{name: "rate line for a tenant without jobs", in: `{"tenant":"ghost","rate":"5/s"}` + "\n" + `{"id":"x","tenant":"a"}`, wantErr: "a rate line for tenant ghost, which has no jobs"},
		{name: "line too long", in: `{"id":"x","tenant":"a"}` + "\n" + `{"id":"` + strings.Repeat("i", 70000) + `","tenant":"a"}`, wantErr: "line 2: longer than 65536 bytes"},
		{name: "a line of 65537 bytes", in: `{"id":"x","tenant":"a"}` + "\r\n" + strings.Repeat(" ", 65537-23) + `{"id":"y","tenant":"a"}` + "\r\n", wantErr: "line 2: longer than 65536 bytes"},
		{name: "a line of 65536 bytes", in: `{"id":"x","tenant":"a"}` + "\r\n" + strings.Repeat(" ", 65536-23) + `{"id":"y","tenant":"a"}` + "\r\n", jobs: []string{"x", "y"}},
		{name: "not an object", in: `[]`, wantErr: "line 1: a line must be a JSON object, got array"},
		{name: "a rate line with a job's fields", in: `{"tenant":"a","rate":"5/s","cost":3}` + "\n" + `{"id":"x","tenant":"a"}`, wantErr: "line 1: a rate line has a tenant, a rate, a weight and request only"},
		{name: "zero-width space in an id", in: "{\"id\":\"a\u200bb\",\"tenant\":\"a\"}", wantErr: "no spaces, control or format characters"},
		{name: "rate below a millisecond", in: `{"tenant":"a","rate":"1/1ns"}`, wantErr: "at least 1ms"},
		{name: "negative cost", in: `{"id":"x","tenant":"a","cost":-1}`, wantErr: "cost"},
		{name: "bad rate", in: `{"tenant":"a","rate":"5"}`, wantErr: "COUNT/PERIOD"},
		{name: "id and rate", in: `{"id":"x","tenant":"a","rate":"5/s"}`, wantErr: "a rate line has a tenant, a rate, a weight and request only"},
		{name: "zero weight", in: `{"tenant":"a","weight":0}` + "\n" + `{"id":"x","tenant":"a"}`, wantErr: "line 1: weight must be a number > 0"},
		{name: "negative weight", in: `{"tenant":"a","rate":"5/s","weight":-2}` + "\n" + `{"id":"x","tenant":"a"}`, wantErr: "line 1: weight must be a number > 0"},
		{name: "weight as a string", in: `{"tenant":"a","weight":"3"}` + "\n" + `{"id":"x","tenant":"a"}`, wantErr: "line 1: weight must be a number, got string"},
		{name: "weight on a job", in: `{"id":"x","tenant":"a","weight":3}`, wantErr: "a rate line has a tenant, a rate, a weight and request only"},
		{name: "weight line twice", in: `{"tenant":"a","weight":3}` + "\n" + `{"tenant":"a","rate":"5/s"}` + "\n" + `{"id":"x","tenant":"a"}`, wantErr: "line 2: a second rate line for tenant a"},
		{name: "weight for a tenant without jobs", in: `{"tenant":"ghost","weight":2}` + "\n" + `{"id":"x","tenant":"a"}`, wantErr: "a rate line for tenant ghost, which has no jobs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			jf, err := parseJobs(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, j := range jf.Jobs {
				ids = append(ids, j.ID)
				if j.Cost < 1 {
					t.Errorf("job %s: cost %d, want >= 1", j.ID, j.Cost)
				}
			}
			if fmt.Sprint(ids) != fmt.Sprint(tt.jobs) {
				t.Errorf("jobs = %v, want %v", ids, tt.jobs)
			}
			if len(jf.Rates) != len(tt.rates) {
				t.Errorf("rates = %v, want %v", jf.Rates, tt.rates)
			}
			for tenant, s := range tt.rates {
				if got := jf.Rates[tenant].String(); got != mustRate(t, s).String() {
					t.Errorf("rate of %s = %s, want %s", tenant, got, s)
				}
			}
			for tenant, w := range tt.weights {
				if got := jf.weight(tenant); got != w {
					t.Errorf("weight of %s = %v, want %v", tenant, got, w)
				}
			}
		})
	}
}

func TestLoadJobsMissingFile(t *testing.T) {
	_, err := loadJobs(filepath.Join(t.TempDir(), "nope.jsonl"))
	if err == nil || !strings.Contains(err.Error(), "not found") || !strings.Contains(err.Error(), "-jobs") {
		t.Fatalf("err = %v, want a not-found error that mentions -jobs", err)
	}
}

// TestDefaultJobsFile checks the committed trace: it parses, has several
// tenants, and has enough jobs to show throttling.
func TestDefaultJobsFile(t *testing.T) {
	jf, err := loadJobs("../../testdata/jobs.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(jf.Jobs); n < 300 || n > 400 {
		t.Errorf("%d jobs, want 300-400", n)
	}
	if n := len(jf.tenants()); n < 3 || n > 5 {
		t.Errorf("%d tenants, want 3-5", n)
	}
}

func TestMaxInWindow(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	at := func(m, n int) event { return event{lo: ms(m), hi: ms(m), n: n} }
	tests := []struct {
		name   string
		events []event
		per    time.Duration
		want   int
	}{
		{name: "none", per: time.Second, want: 0},
		{name: "one", events: []event{at(5, 1)}, per: time.Second, want: 1},
		{name: "all inside", events: []event{at(0, 1), at(500, 1), at(999, 1)}, per: time.Second, want: 3},
		{name: "edge leaves the window", events: []event{at(0, 1), at(1000, 1), at(1500, 1)}, per: time.Second, want: 2},
		{name: "weights", events: []event{at(0, 3), at(100, 2), at(1100, 1)}, per: time.Second, want: 5},
		{name: "burst later", events: []event{at(0, 1), at(2000, 1), at(2001, 1), at(2002, 1), at(3001, 1)}, per: time.Second, want: 3},
		{name: "unsorted", events: []event{at(2002, 1), at(0, 1), at(2001, 1), at(2000, 1)}, per: time.Second, want: 3},
		{name: "same instant", events: []event{at(7, 1), at(7, 1)}, per: time.Nanosecond, want: 2},
		{
			// The second admission happened in [990ms, 1010ms]: perhaps
			// after the first left the window, so it is not counted.
			name:   "uncertain instant not counted",
			events: []event{at(0, 1), {lo: ms(990), hi: ms(1010), n: 1}},
			per:    time.Second, want: 1,
		},
		{
			name:   "certain despite uncertainty",
			events: []event{{lo: ms(0), hi: ms(10), n: 1}, {lo: ms(500), hi: ms(510), n: 1}},
			per:    time.Second, want: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := maxInWindow(tt.events, tt.per); got != tt.want {
				t.Errorf("maxInWindow = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestTenantOf(t *testing.T) {
	tests := []struct {
		subject, want string
		ok            bool
	}{
		{"jobs.acme", "acme", true},
		{"jobs.", "", false},
		{"jobs.a.b", "", false},
		{"other.acme", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			got, err := tenantOf(tt.subject)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("tenantOf(%q) = %q, %v; want %q, ok=%v", tt.subject, got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestSummary(t *testing.T) {
	start := time.Now()
	rate := mustRate(t, "2/1s")
	jobs := []job{{ID: "a1", Tenant: "a"}, {ID: "a2", Tenant: "a"}, {ID: "a3", Tenant: "a"}, {ID: "b1", Tenant: "b"}}
	rec := newRecorder(start, len(jobs))
	for i, j := range jobs {
		rec.published(j.Tenant, j.ID, uint64(i+1))
	}
	for i := range 3 {
		now := start.Add(time.Duration(i) * 10 * time.Millisecond)
		rec.admitted("a", "", 1, now, now)
	}
	rec.admitted("b", "", 1, start, start)
	rec.handle(handled{Tenant: "a", JobID: "a1", Ref: "1"})
	rec.handle(handled{Tenant: "a", JobID: "a2", Ref: "2"})
	rec.handle(handled{Tenant: "a", JobID: "a2", Ref: "2"})
	rec.nak("a", start, false)
	rec.maxDelivered(3)
	select {
	case <-rec.complete:
		t.Fatal("complete before every job was handled or lost")
	default:
	}
	rec.handle(handled{Tenant: "b", JobID: "b1"})
	select {
	case <-rec.complete:
	default:
		t.Fatal("not complete after every job was handled or lost")
	}

	rep := rec.summarize(jobs, func(string) throttle.Rate { return rate }, limiterSpec{})
	if rep.ExactlyOnce() {
		t.Error("ExactlyOnce with a duplicate and a missing job")
	}
	if rep.WithinLimits() {
		t.Error("WithinLimits with 3 handled in 20ms at 2/1s")
	}
	if fmt.Sprint(rep.Missing) != "[a3]" || fmt.Sprint(rep.Duplicates["a2"]) != "[2 2]" || len(rep.Duplicates) != 1 {
		t.Errorf("missing %v, duplicates %v", rep.Missing, rep.Duplicates)
	}
	a := rep.Tenants[0]
	if a.Tenant != "a" || a.Published != 3 || a.Handled != 3 || a.Naks != 1 || a.MaxDeliver != 1 || a.MaxInWindow != 3 {
		t.Errorf("tenant a: %+v", a)
	}
	var buf bytes.Buffer
	rep.print(&buf)
	out := buf.String()
	for _, want := range []string{"max in any 1s: 3 (limit 2)  OVER THE LIMIT", "max in any 1s: 1 (limit 2)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if last := lastLine(out); !strings.HasPrefix(last, "FAIL: not every job handled exactly once: 1 of 4 not handled (a3): 1 lost (terminated, or dropped at MaxDeliver), 0 never handled, 1 handled more than once (a2 x2 at stream seq [2 2])") {
		t.Errorf("last line = %q", last)
	}
}

// writeJobs writes a jobs file into a temp dir: a burst of burst jobs of
// tenant "burst" at 0 ms with the given rate override, and light jobs of
// tenant "light" every 100 ms.
func writeJobs(t *testing.T, burst int, burstRate string, light int) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, `{"tenant":"burst","rate":%q}`+"\n", burstRate)
	for i := range burst {
		fmt.Fprintf(&b, `{"id":"burst-%d","tenant":"burst","at_ms":%d,"cost":1}`+"\n", i, i%3)
	}
	for i := range light {
		fmt.Fprintf(&b, `{"id":"light-%d","tenant":"light","at_ms":%d,"cost":1}`+"\n", i, i*100)
	}
	path := filepath.Join(t.TempDir(), "jobs.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRun replays a small trace against an embedded NATS server and the
// in-memory window: every job is handled exactly once, no tenant faster
// than its limit, and the burst was throttled: with fair shares (a
// consumer per tenant, pulled when a job can start) without a NAK, each
// job delivered once; first come, first served (-fair=false, no
// reservations), by NAKs.
func TestRun(t *testing.T) {
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) { testRun(t, fair) })
	}
}

func testRun(t *testing.T, fair bool) {
	cfg := defaultConfig()
	cfg.Fair = fair
	cfg.Reservations = 0 // rejections bounce: without fair shares the burst is NAKed
	cfg.JobsPath = writeJobs(t, 25, "5/200ms", 6)
	cfg.Rate = "3/200ms"
	cfg.Timeout = 20 * time.Second
	cfg.Progress = 200 * time.Millisecond
	rep, out := mustWork(t, cfg)
	if !rep.ExactlyOnce() {
		t.Errorf("not exactly once: missing %v, duplicates %v", rep.Missing, rep.Duplicates)
	}
	if !rep.WithinLimits() {
		t.Error("a tenant was handled faster than its limit")
	}
	byTenant := map[string]tenantReport{}
	for _, tr := range rep.Tenants {
		byTenant[tr.Tenant] = tr
	}
	burst, light := byTenant["burst"], byTenant["light"]
	if burst.Rate.String() != "5/200ms" || light.Rate.String() != "3/200ms" {
		t.Errorf("rates: burst %v, light %v", burst.Rate, light.Rate)
	}
	if burst.Published != 25 || burst.Handled != 25 || light.Published != 6 || light.Handled != 6 {
		t.Errorf("burst %+v, light %+v", burst, light)
	}
	switch {
	case fair && (burst.Naks != 0 || rep.Deliveries != 31):
		t.Errorf("burst: %d NAKs, %d deliveries in all; want 0 and 31 (a job is pulled when it can start)", burst.Naks, rep.Deliveries)
	case !fair && burst.Naks == 0:
		t.Error("the burst was never NAKed")
	}
	if burst.WaitP99 < 600*time.Millisecond {
		t.Errorf("burst: p99 wait %v, want about 800 ms (25 jobs at 5 per 200 ms)", burst.WaitP99)
	}
	if burst.MaxInWindow != 5 {
		t.Errorf("burst: max in window %d, want 5 (the limit, reached at the start)", burst.MaxInWindow)
	}
	if last := lastLine(out.String()); last != fmt.Sprintf("OK: all 31 jobs handled exactly once in %.1fs", rep.Elapsed.Seconds()) {
		t.Errorf("last line = %q", last)
	}
}

// TestRunTimeout: a job that cannot be admitted before the timeout is
// reported missing, and run fails the check.
func TestRunTimeout(t *testing.T) {
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 3, "1/10s", 0)
	cfg.Timeout = 700 * time.Millisecond
	var out bytes.Buffer
	err := run(context.Background(), cfg, &out)
	t.Logf("output:\n%s", out.String())
	if !errors.Is(err, errCheckFailed) {
		t.Fatalf("run = %v, want errCheckFailed", err)
	}
	if !strings.Contains(out.String(), "stopped early: timed out after 700ms") {
		t.Error("no timeout line")
	}
	if last := lastLine(out.String()); !strings.HasPrefix(last, "FAIL: not every job handled exactly once: 2 of 3 never handled") {
		t.Errorf("last line = %q", last)
	}
}

// TestRunTrace: with -trace stdout the decision spans are printed, and
// flushed before the summary, whose verdict stays the last line.
func TestRunTrace(t *testing.T) {
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 8, "4/200ms", 2)
	cfg.Trace = "stdout"
	cfg.Timeout = 20 * time.Second
	var out bytes.Buffer
	if err := run(context.Background(), cfg, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	if n := strings.Count(s, `"Name":"`+throttle.SpanName+`"`); n < 10 {
		t.Errorf("%d %s spans, want >= 10 (10 jobs, some rejected first)", n, throttle.SpanName)
	}
	if !strings.Contains(s, `"Name":"send jobs.burst"`) {
		t.Error("no producer span")
	}
	if last := lastLine(s); !strings.HasPrefix(last, "OK: all 10 jobs handled exactly once") {
		t.Errorf("last line = %q", last)
	}
}

func TestRunErrors(t *testing.T) {
	good := writeJobs(t, 1, "1/s", 0)
	tests := []struct {
		name    string
		mod     func(*config)
		wantErr string
	}{
		{name: "missing jobs file", mod: func(c *config) { c.JobsPath = filepath.Join(t.TempDir(), "x.jsonl") }, wantErr: "not found"},
		{name: "bad rate", mod: func(c *config) { c.JobsPath = good; c.Rate = "fast" }, wantErr: "-rate"},
		{name: "bad trace", mod: func(c *config) { c.JobsPath = good; c.Trace = "otlp" }, wantErr: "-trace"},
		{name: "bad redis url", mod: func(c *config) { c.JobsPath = good; c.RedisURL = "http://x" }, wantErr: "-redis"},
		{name: "hybrid without redis", mod: func(c *config) { c.JobsPath = good; c.Limiter = "hybrid" }, wantErr: "-limiter hybrid needs -redis URL"},
		{name: "bad limiter", mod: func(c *config) { c.JobsPath = good; c.Limiter = "gcra" }, wantErr: "-limiter"},
		{name: "burst with window", mod: func(c *config) { c.JobsPath = good; c.Burst = 3 }, wantErr: "-burst"},
		{name: "instances without redis", mod: func(c *config) { c.JobsPath = good; c.Instances = 3 }, wantErr: "-instances 3 needs -redis URL"},
		{name: "zero instances", mod: func(c *config) { c.JobsPath = good; c.Instances = 0 }, wantErr: "-instances: must be from 1 to 64"},
		{name: "too many instances", mod: func(c *config) { c.JobsPath = good; c.Instances = 100000; c.RedisURL = redisLocal }, wantErr: "-instances: must be from 1 to 64 (each is a worker process), got 100000"},
		{name: "negative burst", mod: func(c *config) { c.JobsPath = good; c.Limiter = "bucket"; c.Burst = -1 }, wantErr: "-burst"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultConfig()
			tt.mod(&cfg)
			err := run(context.Background(), cfg, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("run = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func mustRate(t *testing.T, s string) throttle.Rate {
	t.Helper()
	r, err := throttle.ParseRate(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// byTenant indexes the rows of a report.
func byTenant(rep report) map[string]tenantReport {
	m := map[string]tenantReport{}
	for _, tr := range rep.Tenants {
		m[tr.Tenant] = tr
	}
	return m
}

// checkConsumer asserts that every job of a consumer's report was handled
// exactly once, published and handled as many times as jobs has, and
// admitted within its limiter's bound.
func checkConsumer(t *testing.T, rep report, jobs map[string]int) {
	t.Helper()
	if !rep.ExactlyOnce() {
		t.Errorf("%v: not exactly once: missing %v, duplicates %v", rep.Consumer, rep.Missing, rep.Duplicates)
	}
	for _, tr := range rep.Tenants {
		if tr.Over() {
			t.Errorf("%v: tenant %s: %d admitted in a window, over its %s", rep.Consumer, tr.Tenant, tr.MaxInWindow, tr.BoundText)
		}
		if n := jobs[tr.Tenant]; tr.Published != n || tr.Handled != n {
			t.Errorf("%v: tenant %s: published %d, handled %d, want %d", rep.Consumer, tr.Tenant, tr.Published, tr.Handled, n)
		}
	}
}

// TestRunRedis runs the small trace with the Redis window against a
// private redis-server (skipped when redis-server is not installed), on
// NATS and on asynq: every job handled exactly once on each, within the
// limits; on asynq, tasks rejected more often than their MaxRetry are
// still handled, nothing is archived or counted failed, and the queues
// are gone at the end.
func TestRunRedis(t *testing.T) {
	srv := redistest.Start(t)
	cfg := defaultConfig()
	// 30 jobs at once at 5/1s, rejections bouncing: the asynq tasks come
	// back in rounds about a second apart, so the last ones are rejected
	// 5 times or more, more than MaxRetry (3 or more even when a loaded
	// machine lets a round take in more than its 5).
	cfg.Reservations = 0
	cfg.JobsPath = writeJobs(t, 30, "5/1s", 4)
	cfg.Rate = "3/200ms"
	cfg.RedisURL = "redis://" + srv.Addr() + "/0"
	cfg.Timeout = 20 * time.Second
	rep, out := mustWork(t, cfg)
	if !strings.Contains(out.String(), "Redis window at "+srv.Addr()) {
		t.Error("the header does not name the Redis window")
	}
	jobs := map[string]int{"burst": 30, "light": 4}
	checkConsumer(t, rep, jobs)
	a := rep.Asynq
	if a == nil {
		t.Fatal("no asynq report with -redis")
	}
	checkConsumer(t, *a, jobs)
	if a.Archived != 0 || a.Failed != 0 {
		t.Errorf("asynq: %d archived, %d failed; want 0 and 0", a.Archived, a.Failed)
	}
	if a.MostRejections <= asynqMaxRetry {
		t.Errorf("asynq: at most %d rejections of one task, want more than MaxRetry %d", a.MostRejections, asynqMaxRetry)
	}
	if got := byTenant(*a)["burst"].MaxInWindow; got != 5 {
		t.Errorf("asynq: burst: max in window %d, want 5", got)
	}
	if !rep.OK() {
		t.Error("report not OK")
	}
	if last := lastLine(out.String()); !strings.HasPrefix(last, "OK: all 34 jobs handled exactly once on NATS and on asynq, 0 archived, in ") {
		t.Errorf("last line = %q", last)
	}
	if len(a.Queues) != 2 {
		t.Errorf("queues %v, want one per tenant (2)", a.Queues)
	}
	for _, q := range a.Queues {
		keys, err := srv.Client(t).Keys(context.Background(), "asynq:{"+q+"}*").Result()
		if err != nil || len(keys) > 0 {
			t.Errorf("keys of queue %s left: %v, %v", q, keys, err)
		}
	}
}

// TestRunBucket runs the small trace with token buckets: in process, and
// in Redis (with the asynq side). A bucket may admit its burst plus the
// refill in one window, and no more; the summary states that bound.
func TestRunBucket(t *testing.T) {
	tests := []struct {
		name   string
		redis  bool
		header string
	}{
		{name: "local", header: "in-process token bucket, burst = each tenant's count"},
		{name: "redis", redis: true, header: "Redis token bucket at "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.Fair = false     // NATS NAKs the burst (the fair shares would pull it when it can start)
			cfg.Reservations = 0 // rejections bounce: the burst is NAKed
			cfg.JobsPath = writeJobs(t, 25, "5/200ms", 6)
			cfg.Rate = "3/200ms"
			cfg.Limiter = familyBucket
			cfg.Timeout = 20 * time.Second
			if tt.redis {
				cfg.RedisURL = "redis://" + redistest.Start(t).Addr() + "/0"
			}
			rep, out := mustWork(t, cfg)
			s := out.String()
			if !strings.Contains(s, tt.header) {
				t.Errorf("the header does not say %q", tt.header)
			}
			for _, want := range []string{"(bound 10 = burst 5 + refill 5)", "(bound 6 = burst 3 + refill 3)"} {
				if !strings.Contains(s, want) {
					t.Errorf("the summary does not state %q", want)
				}
			}
			jobs := map[string]int{"burst": 25, "light": 6}
			checkConsumer(t, rep, jobs)
			burst := byTenant(rep)["burst"]
			if burst.Naks == 0 {
				t.Error("the burst was never NAKed")
			}
			if (rep.Asynq != nil) != tt.redis {
				t.Fatalf("asynq report %v with redis %v", rep.Asynq != nil, tt.redis)
			}
			if rep.Asynq != nil {
				checkConsumer(t, *rep.Asynq, jobs)
			}
			if !rep.OK() {
				t.Error("report not OK")
			}
		})
	}
}

// TestRunHybrid runs the small trace with the hybrid bucket on both
// consumers: the summary shows its decisions by source, it admits within
// its bound, and its unused tokens go back at the end.
func TestRunHybrid(t *testing.T) {
	srv := redistest.Start(t)
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 25, "5/200ms", 6)
	cfg.Rate = "3/200ms"
	cfg.Limiter = familyHybrid
	cfg.RedisURL = "redis://" + srv.Addr() + "/0"
	cfg.Timeout = 20 * time.Second
	rep, out := mustWork(t, cfg)
	s := out.String()
	if !strings.Contains(s, "hybrid token bucket on Redis at "+srv.Addr()) {
		t.Error("the header does not name the hybrid")
	}
	// 5/200ms, burst 5: 5 + the refill over 200ms + 500ms of lease hold.
	if !strings.Contains(s, "(bound 23 = burst 5 + refill 18 in 700ms)") {
		t.Error("the summary does not state the hybrid's bound")
	}
	jobs := map[string]int{"burst": 25, "light": 6}
	checkConsumer(t, rep, jobs)
	if rep.Asynq == nil {
		t.Fatal("no asynq report with -redis")
	}
	checkConsumer(t, *rep.Asynq, jobs)
	for _, r := range []report{rep, *rep.Asynq} {
		h := r.Hybrid
		if h == nil {
			t.Fatalf("%v: no hybrid stats", r.Consumer)
		}
		if h.Local+h.Redis+h.Degraded == 0 {
			t.Errorf("%v: hybrid stats %+v: no decisions", r.Consumer, *h)
		}
	}
	if n := strings.Count(s, "hybrid decisions: "); n != 2 {
		t.Errorf("%d lines of hybrid decisions, want 2 (NATS and asynq)", n)
	}
	if !rep.OK() {
		t.Error("report not OK")
	}
}

// TestRunInstances runs the small trace through three worker processes
// (this test binary, see TestMain) sharing one durable consumer and the
// Redis limiters: across all of them, every job is handled exactly once
// and no tenant is admitted over its limit in any window.
func TestRunInstances(t *testing.T) {
	tests := []struct {
		limiter string
		jobs    string // the burst tenant's rate
	}{
		{limiter: familyWindow, jobs: "5/200ms"},
		{limiter: familyHybrid, jobs: "5/200ms"},
	}
	for _, tt := range tests {
		t.Run(tt.limiter, func(t *testing.T) {
			srv := redistest.Start(t)
			cfg := defaultConfig()
			cfg.JobsPath = writeJobs(t, 25, tt.jobs, 6)
			cfg.Rate = "3/200ms"
			cfg.Limiter = tt.limiter
			cfg.RedisURL = "redis://" + srv.Addr() + "/0"
			cfg.Instances = 3
			cfg.Timeout = 30 * time.Second
			rep, out := mustWork(t, cfg)
			checkConsumer(t, rep, map[string]int{"burst": 25, "light": 6})
			if !rep.OK() {
				t.Error("report not OK")
			}
			if got := byTenant(rep)["burst"].MaxInWindow; tt.limiter == familyWindow && got != 5 {
				t.Errorf("burst: max in window %d, want 5 (the limit, reached at the start)", got)
			}
			sum := 0
			for p, n := range rep.Processes {
				if p < 1 || p > 3 {
					t.Errorf("process #%d", p)
				}
				sum += n
			}
			if sum != 31 {
				t.Errorf("processes handled %v, %d in all, want 31", rep.Processes, sum)
			}
			s := out.String()
			if !strings.Contains(s, "for 3 worker processes") || !strings.Contains(s, "jobs handled per worker process: #1 ") {
				t.Error("the summary does not show the processes")
			}
			if strings.Contains(s, "error:") {
				t.Error("a worker process reported an error")
			}
			if last := lastLine(s); !strings.HasPrefix(last, "OK: all 31 jobs handled exactly once across 3 worker processes in ") {
				t.Errorf("last line = %q", last)
			}
		})
	}
}

// TestRunInstancesProcessFails: a worker process that ends before it is
// asked to stop ends the run at once, with the reason, and fails the check.
func TestRunInstancesProcessFails(t *testing.T) {
	srv := redistest.Start(t)
	t.Setenv("QT_TEST_WORKER_PROCESS_FAILS", "1")
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 3, "5/200ms", 0)
	cfg.RedisURL = "redis://" + srv.Addr() + "/0"
	cfg.Instances = 2
	cfg.Timeout = 20 * time.Second
	var out bytes.Buffer
	start := time.Now()
	err := run(context.Background(), cfg, &out)
	t.Logf("output:\n%s", out.String())
	if !errors.Is(err, errCheckFailed) {
		t.Fatalf("run = %v, want errCheckFailed", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v: waited for the timeout", d)
	}
	if !regexp.MustCompile(`stopped early: worker process #\d \(pid \d+\) ended early: exit status 3`).MatchString(out.String()) {
		t.Error("the summary does not say which process ended")
	}
	if last := lastLine(out.String()); !strings.HasPrefix(last, "FAIL: not every job handled exactly once: 3 of 3 never handled") {
		t.Errorf("last line = %q", last)
	}
}

func TestLimiterSpecBound(t *testing.T) {
	tests := []struct {
		name string
		spec limiterSpec
		rate string
		want int
		text string
	}{
		{name: "zero is the window", spec: limiterSpec{}, rate: "20/1s", want: 20, text: "limit 20"},
		{name: "window", spec: limiterSpec{Family: familyWindow}, rate: "10/1s", want: 10, text: "limit 10"},
		{name: "bucket", spec: limiterSpec{Family: familyBucket}, rate: "20/1s", want: 40, text: "bound 40 = burst 20 + refill 20"},
		{name: "bucket with burst", spec: limiterSpec{Family: familyBucket, Burst: 5}, rate: "20/1s", want: 25, text: "bound 25 = burst 5 + refill 20"},
		{name: "hybrid", spec: limiterSpec{Family: familyHybrid}, rate: "20/1s", want: 50, text: "bound 50 = burst 20 + refill 30 in 1.5s"},
		{name: "hybrid fractional refill rounds up", spec: limiterSpec{Family: familyHybrid}, rate: "5/200ms", want: 23, text: "bound 23 = burst 5 + refill 18 in 700ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, text := tt.spec.bound(mustRate(t, tt.rate))
			if got != tt.want || text != tt.text {
				t.Errorf("bound = %d, %q; want %d, %q", got, text, tt.want, tt.text)
			}
		})
	}
}

// TestRunExternalNATS runs twice against one server given by URL, as with
// -nats: the second run starts from a fresh stream, and the stream is
// removed at the end.
func TestRunExternalNATS(t *testing.T) {
	srv := natsserver.Run(t)
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 6, "3/200ms", 2)
	cfg.NATSURL = srv.ClientURL()
	cfg.Timeout = 20 * time.Second
	for i := range 2 {
		var out bytes.Buffer
		if err := run(context.Background(), cfg, &out); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out.String())
		}
		if !strings.Contains(out.String(), "NATS external ("+srv.ClientURL()+")") {
			t.Errorf("run %d: the header does not name the external server:\n%s", i, out.String())
		}
	}
	_, js := natsserver.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, streamName); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s after the run: err = %v, want ErrStreamNotFound", streamName, err)
	}
}

// TestRunNeverAdmissible: a job whose cost exceeds its tenant's limit is
// terminated by the throttle, reported lost and never handled; the run
// does not wait for it until the timeout.
func TestRunNeverAdmissible(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs.jsonl")
	jobs := `{"tenant":"big","rate":"2/200ms"}
{"id":"ok-1","tenant":"big","at_ms":0,"cost":2}
{"id":"huge-1","tenant":"big","at_ms":0,"cost":3}
`
	if err := os.WriteFile(path, []byte(jobs), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := defaultConfig()
	cfg.JobsPath = path
	cfg.Timeout = 20 * time.Second
	rep, out := mustWork(t, cfg)
	if rep.Elapsed > 10*time.Second {
		t.Errorf("took %v: waited for the terminated job", rep.Elapsed)
	}
	if fmt.Sprint(rep.Missing) != "[huge-1]" || rep.Tenants[0].Terms != 1 {
		t.Errorf("missing %v, tenant %+v", rep.Missing, rep.Tenants[0])
	}
	if !strings.Contains(out.String(), "throttle error: jobs.big:") {
		t.Error("the termination is not reported")
	}
	if !strings.Contains(out.String(), "note: 1 job can never be admitted, and the throttle will terminate it (reported lost): huge-1 (cost 3, big admits at most 2)") {
		t.Error("no note before the run of the job that can never be admitted")
	}
	if last := lastLine(out.String()); !strings.HasPrefix(last, "FAIL: not every job handled exactly once: 1 of 2 not handled (huge-1): 1 lost (terminated, or dropped at MaxDeliver), 0 never handled") {
		t.Errorf("last line %q does not call the terminated job lost", last)
	}
}

// mustWork runs the worker in-process with cfg, logs its output, and
// fails t if it returns an error.
func mustWork(t *testing.T, cfg config) (report, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	rep, err := work(context.Background(), cfg, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	return rep, &out
}

// TestRunReservations floods one tenant (600 jobs at once at 200/1s)
// beside a quiet one under its own limit (5/s at 20/1s), with
// reservations, on the in-memory window and on the Redis window, first
// come, first served (-fair=false: one consumer, in stream order): each
// flood job that must wait is NAKed at most once (to its own slot), none
// is held, the quiet tenant is never NAKed, every job is handled exactly
// once and no tenant goes over its limit. The same flood without
// reservations bounces: more NAKs than that. With fair shares (a
// consumer per tenant) nothing is NAKed at all.
func TestRunReservations(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"tenant":"flood","rate":"200/1s"}` + "\n")
	for i := range 600 {
		fmt.Fprintf(&b, `{"id":"flood-%d","tenant":"flood","at_ms":%d}`+"\n", i, i%50)
	}
	for i := range 15 {
		fmt.Fprintf(&b, `{"id":"quiet-%d","tenant":"quiet","at_ms":%d}`+"\n", i, i*200)
	}
	path := filepath.Join(t.TempDir(), "flood.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name         string
		redis        bool
		reservations time.Duration
	}{
		{"memory", false, time.Minute},
		{"redis", true, time.Minute},
		{"memory, no reservations", false, 0},
		{"memory, fair", false, time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.Fair = strings.HasSuffix(tt.name, "fair")
			cfg.JobsPath = path
			cfg.Timeout = 30 * time.Second
			cfg.Reservations = tt.reservations
			if tt.redis {
				cfg.RedisURL = "redis://" + redistest.Start(t).Addr() + "/0"
			}
			rep, _ := mustWork(t, cfg)
			if !rep.OK() {
				t.Fatal("the run failed its checks")
			}
			flood, quiet := byTenant(rep)["flood"], byTenant(rep)["quiet"]
			if flood.MustWait != 400 {
				t.Errorf("flood: %d must wait, want 400 (600 at 200 per second)", flood.MustWait)
			}
			t.Logf("flood: %d NAKs for %d that must wait, %d holds; quiet: %d NAKs, wait p99 %v", flood.Naks, flood.MustWait, flood.Holds, quiet.Naks, quiet.WaitP99)
			limit := flood.MustWait * 115 / 100
			if cfg.Fair {
				if flood.Naks != 0 || rep.Deliveries != 615 || quiet.WaitP99 > 100*time.Millisecond {
					t.Errorf("fair: flood %d NAKs, %d deliveries in all, quiet p99 wait %v; want 0, 615 and the quiet tenant at once", flood.Naks, rep.Deliveries, quiet.WaitP99)
				}
				return
			}
			if tt.reservations == 0 {
				if flood.Naks <= limit {
					t.Errorf("flood without reservations: %d NAKs, want a bounce (more than %d)", flood.Naks, limit)
				}
				return
			}
			if flood.Naks > limit {
				t.Errorf("flood: %d NAKs, want at most %d (1.15 x the %d that must wait)", flood.Naks, limit, flood.MustWait)
			}
			if flood.Holds != 0 || quiet.Holds != 0 {
				t.Errorf("holds: flood %d, quiet %d; want 0", flood.Holds, quiet.Holds)
			}
			if quiet.Naks != 0 {
				t.Errorf("quiet: %d NAKs, want 0 (it never goes over its own limit)", quiet.Naks)
			}
			if rep.Asynq != nil {
				a := byTenant(*rep.Asynq)
				if n, limit := a["flood"].Naks, a["flood"].MustWait*115/100; n > limit {
					t.Errorf("asynq flood: %d rejections, want at most %d", n, limit)
				}
			}
		})
	}
}

// TestStopPublisherWaitsForTheLastAcks: when every job was handled, the
// publisher's last acknowledgements are waited for before its context is
// canceled (a canceled publish would leave a handled job unpublished in
// the summary); a run stopped for another reason cancels at once.
func TestStopPublisherWaitsForTheLastAcks(t *testing.T) {
	pubDone := make(chan error, 1)
	canceled := make(chan struct{})
	cancel := sync.OnceFunc(func() { close(canceled) })
	var sawCancel atomic.Bool
	go func() {
		time.Sleep(50 * time.Millisecond) // the last ack
		select {
		case <-canceled:
			sawCancel.Store(true)
		default:
		}
		pubDone <- nil
	}()
	if err := stopPublisher("", nil, false, pubDone, cancel); err != nil {
		t.Fatal(err)
	}
	if sawCancel.Load() {
		t.Fatal("the publisher was canceled before its last acknowledgement")
	}
	select {
	case <-canceled:
	default:
		t.Fatal("the publisher's context was not canceled at the end")
	}

	// Stopped early: the publisher, blocked until canceled, is canceled at once.
	pubDone = make(chan error, 1)
	canceled = make(chan struct{})
	cancel = sync.OnceFunc(func() { close(canceled) })
	go func() {
		<-canceled
		pubDone <- context.Canceled
	}()
	start := time.Now()
	if err := stopPublisher("timed out after 1s", nil, false, pubDone, cancel); err != nil {
		t.Fatalf("a canceled publisher's error: %v, want none", err)
	}
	if d := time.Since(start); d >= publishAttemptTimeout {
		t.Fatalf("took %v: waited for a publisher of a run stopped early", d)
	}
}

func TestPlural(t *testing.T) {
	for _, tt := range []struct {
		n          int
		noun, want string
	}{{1, "delivery", "1 delivery"}, {2, "delivery", "2 deliveries"}, {3, "key", "3 keys"}, {0, "job", "0 jobs"}, {2, "y", "2 ys"}} {
		if got := plural(tt.n, tt.noun); got != tt.want {
			t.Errorf("plural(%d, %q) = %q, want %q", tt.n, tt.noun, got, tt.want)
		}
	}
}
