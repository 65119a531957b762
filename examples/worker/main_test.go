package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/internal/natsserver"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestParseJobs(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		jobs    []string // ids in arrival order
		rates   map[string]string
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
		{name: "no jobs", in: `{"tenant":"a","rate":"5/s"}`, wantErr: "no jobs"},
		{name: "bad json", in: `{"id":`, wantErr: "line 1"},
		{name: "unknown field", in: `{"id":"x","tenant":"a","at":1}`, wantErr: "unknown field"},
		{name: "missing id", in: `{"tenant":"a","at_ms":1}`, wantErr: "missing id"},
		{name: "missing tenant", in: `{"id":"x","at_ms":1}`, wantErr: "missing tenant"},
		{name: "tenant with dot", in: `{"id":"x","tenant":"a.b"}`, wantErr: "subject token"},
		{name: "duplicate id", in: `{"id":"x","tenant":"a"}` + "\n" + `{"id":"x","tenant":"b"}`, wantErr: "line 2: duplicate id"},
		{name: "negative offset", in: `{"id":"x","tenant":"a","at_ms":-1}`, wantErr: "at_ms"},
		{name: "negative cost", in: `{"id":"x","tenant":"a","cost":-1}`, wantErr: "cost"},
		{name: "bad rate", in: `{"tenant":"a","rate":"5"}`, wantErr: "COUNT/PERIOD"},
		{name: "id and rate", in: `{"id":"x","tenant":"a","rate":"5/s"}`, wantErr: "not both"},
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
		rec.published(j.Tenant, uint64(i+1))
	}
	for i := range 3 {
		now := start.Add(time.Duration(i) * 10 * time.Millisecond)
		rec.admitted("a", 1, now, now)
	}
	rec.admitted("b", 1, start, start)
	rec.handle(handled{Tenant: "a", JobID: "a1", Seq: 1})
	rec.handle(handled{Tenant: "a", JobID: "a2", Seq: 2})
	rec.handle(handled{Tenant: "a", JobID: "a2", Seq: 2})
	rec.nak("a")
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

	rep := rec.summarize(jobs, func(string) throttle.Rate { return rate })
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
	if last := lastLine(out); !strings.HasPrefix(last, "FAIL: not every job handled exactly once: 1 of 4 never handled (a3), 1 handled more than once (a2 x2 at stream seq [2 2])") {
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
// than its limit, and the burst was throttled.
func TestRun(t *testing.T) {
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 25, "5/200ms", 6)
	cfg.Rate = "3/200ms"
	cfg.Timeout = 20 * time.Second
	cfg.Progress = 200 * time.Millisecond
	var out bytes.Buffer
	rep, err := work(context.Background(), cfg, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
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
	if burst.Naks == 0 {
		t.Error("the burst was never NAKed")
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

// TestRunRedis runs the small trace with the Redis window against a
// private redis-server (skipped when redis-server is not installed).
func TestRunRedis(t *testing.T) {
	srv := redistest.Start(t)
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 15, "5/200ms", 4)
	cfg.Rate = "3/200ms"
	cfg.RedisURL = "redis://" + srv.Addr() + "/0"
	cfg.Timeout = 20 * time.Second
	var out bytes.Buffer
	rep, err := work(context.Background(), cfg, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Redis window at "+srv.Addr()) {
		t.Error("the header does not name the Redis window")
	}
	if !rep.ExactlyOnce() || !rep.WithinLimits() {
		t.Errorf("exactly once %v, within limits %v", rep.ExactlyOnce(), rep.WithinLimits())
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
	var out bytes.Buffer
	rep, err := work(context.Background(), cfg, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Elapsed > 10*time.Second {
		t.Errorf("took %v: waited for the terminated job", rep.Elapsed)
	}
	if fmt.Sprint(rep.Missing) != "[huge-1]" || rep.Tenants[0].Terms != 1 {
		t.Errorf("missing %v, tenant %+v", rep.Missing, rep.Tenants[0])
	}
	if !strings.Contains(out.String(), "throttle error: jobs.big:") {
		t.Error("the termination is not reported")
	}
}
