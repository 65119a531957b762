package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// TestRunPartner: every handler calls the simulated partner once per job.
// Under a -partner limit below its quota, shared by both consumers, the
// partner answers no 429 and the partner's key never admits over its
// limit; with no -partner limit, the partner's 429s put the jobs back
// (Backoff) until it accepts them: every job handled exactly once all the
// same, 429s counted and not as handler runs.
func TestRunPartner(t *testing.T) {
	srv := redistest.Start(t)
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 20, "50/1s", 4)
	cfg.Rate = "50/1s"
	cfg.RedisURL = "redis://" + srv.Addr() + "/0"
	cfg.Timeout = 30 * time.Second
	cfg.Partner, cfg.PartnerQuota = "10/1s", "12/1s"
	rep, out := mustWork(t, cfg)
	jobs := map[string]int{"burst": 20, "light": 4}
	checkConsumer(t, rep, jobs)
	if rep.Asynq == nil {
		t.Fatal("no asynq report with -redis")
	}
	checkConsumer(t, *rep.Asynq, jobs)
	p := rep.Partner
	if p == nil {
		t.Fatal("no partner report")
	}
	if p.Rejected429 != 0 || p.Accepted != 48 || p.Calls != 48 {
		t.Errorf("partner: %d calls, %d accepted, %d 429s; want 48 calls (both consumers), all accepted", p.Calls, p.Accepted, p.Rejected429)
	}
	if p.MaxInWindow > 10 || p.MaxInWindow < 9 {
		t.Errorf("partner: max %d admitted in 1 s, want the -partner limit 10 (both consumers together)", p.MaxInWindow)
	}
	if !strings.Contains(out.String(), "partner (quota 12/1s): 48 calls, 48 accepted, 0 answered 429") {
		t.Errorf("no partner line in the summary:\n%s", out.String())
	}
	if l := p.limitPerS(); len(l) == 0 || slices.Min(l) != 10 || slices.Max(l) != 10 {
		t.Errorf("limit_per_s %v, want 10 in every second (no 429, nothing to adapt)", l)
	}

	// A quota below the limit: the adaptive limit comes down to it, and
	// the report follows it second by second. A job of cost 3 is
	// admissible in the paced first window too (parts of 3 units, not 2).
	cfg.Partner, cfg.PartnerQuota = "20/1s", "8/1s"
	heavy, err := os.ReadFile(cfg.JobsPath)
	if err != nil {
		t.Fatal(err)
	}
	heavy = append(heavy, `{"id":"light-heavy","tenant":"light","at_ms":0,"cost":3}`+"\n"...)
	cfg.JobsPath = filepath.Join(t.TempDir(), "heavy.jsonl")
	if err := os.WriteFile(cfg.JobsPath, heavy, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, _ = mustWork(t, cfg)
	jobs["light"]++
	checkConsumer(t, rep, jobs)
	checkConsumer(t, *rep.Asynq, jobs)
	p = rep.Partner
	l := p.limitPerS()
	if len(l) == 0 || slices.Min(l) > 8 || p.Final > 9 || p.Accepted != 50 {
		t.Errorf("-partner 20/1s, quota 8/1s: limit_per_s %v, final %d, %d accepted; want it down to the quota (at most 8 less the margin), 50 accepted", l, p.Final, p.Accepted)
	}
	jobs["light"]--

	cfg = defaultConfig()
	cfg.JobsPath = writeJobs(t, 20, "50/1s", 4)
	cfg.Rate = "50/1s"
	cfg.Timeout = 30 * time.Second
	cfg.PartnerQuota = "8/1s"
	rep, _ = mustWork(t, cfg)
	checkConsumer(t, rep, jobs)
	p = rep.Partner
	if p == nil || p.Rejected429 == 0 || p.Accepted != 24 || p.Calls != p.Accepted+p.Rejected429 {
		t.Fatalf("partner without a -partner limit: %+v; want 429s, and 24 accepted (each job once)", p)
	}
	sum := 0
	for _, n := range p.AcceptedPerS {
		sum += n
		if n > 8 {
			t.Errorf("the partner accepted %d in one second, over its quota 8: %v", n, p.AcceptedPerS)
		}
	}
	if sum != p.Accepted {
		t.Errorf("accepted_per_s sums to %d, want %d", sum, p.Accepted)
	}
}

// TestParsePartner: the -partner flags, and their errors naming the flag.
func TestParsePartner(t *testing.T) {
	ps, err := parsePartner("20/1s", "25/1s", "10s=10/1s, 20s=30/1s")
	if err != nil || ps.Budget.Count != 20 || ps.Quota.Count != 25 || len(ps.After) != 2 || ps.After[1].At != 20*time.Second || ps.After[1].Rate.Count != 30 {
		t.Fatalf("parsePartner: %+v, %v", ps, err)
	}
	for _, bad := range [][3]string{{"x", "", ""}, {"", "0/1s", ""}, {"", "", "10s=10/1s"}, {"", "5/1s", "10s"}, {"", "5/1s", "-1s=5/1s"}, {"", "5/1s", "10s=5/1s,5s=6/1s"}} {
		if _, err := parsePartner(bad[0], bad[1], bad[2]); err == nil || !strings.Contains(err.Error(), "-partner") {
			t.Errorf("parsePartner(%q): %v, want an error naming the flag", bad, err)
		}
	}
}

// TestBackoffChargesTheRetry: a call the partner answered 429 is given
// back through the run's limiter (the consumers' Backoff calls
// Gate.Release, which reaches every part of throttle.All), and its record
// with it: the message is charged again when it comes back, as the call
// it then makes. Stopped at the recording wrapper, the retry was admitted
// free within the window of the refused call, and the partner saw more
// calls in a second than the limit let through.
func TestBackoffChargesTheRetry(t *testing.T) {
	ctx := context.Background()
	per := time.Minute
	tenant, err := window.NewMemory(throttle.Rate{Count: 10, Per: per})
	if err != nil {
		t.Fatal(err)
	}
	partner, err := window.NewMemory(throttle.Rate{Count: 2, Per: per})
	if err != nil {
		t.Fatal(err)
	}
	all, err := throttle.All(throttle.Part{Limiter: tenant}, throttle.Part{Limiter: partner, Key: func(string) string { return partnerKey }})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rec := newRecorder(start, 1)
	lim := &recordingLimiter{l: all, rate: throttle.Rate{Count: 10, Per: per}, admitted: rec.admitted, refunded: rec.refunded}
	gate, err := throttle.NewGate(lim, throttle.WithReservations(per))
	if err != nil {
		t.Fatal(err)
	}
	admit := func(id string) throttle.Decision {
		t.Helper()
		d, err := gate.AdmitID(ctx, "acme", 1, id)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := admit("job-1"); !d.Allowed {
		t.Fatalf("first call: %+v, want admitted", d)
	}
	if err := gate.Release(ctx, "acme", 1, "job-1"); err != nil { // answered 429
		t.Fatal(err)
	}
	if n := len(rec.admits["acme"]); n != 0 {
		t.Errorf("%d admissions recorded after the release, want 0", n)
	}
	if d := admit("job-1"); !d.Allowed || d.AlreadyAdmitted {
		t.Fatalf("the message back after its 429: %+v, want admitted and charged again", d)
	}
	if d := admit("job-2"); !d.Allowed {
		t.Fatalf("another message: %+v, want admitted (the partner's limit 2 holds job-1's retry and it)", d)
	}
	if d := admit("job-3"); d.Allowed {
		t.Fatalf("a third message: %+v, want rejected (limit 2: the retry was charged)", d)
	}
	if n := len(rec.admits["acme"]); n != 2 {
		t.Errorf("%d admissions recorded, want 2 (the retry and job-2)", n)
	}
}
