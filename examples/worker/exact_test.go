package main

import (
	"context"
	"math"
	"sort"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// exactStarts returns the exact schedule of jobs (in arrival order) under
// their tenants' sliding windows: every job at the earliest instant, µs
// after the replay's start, no earlier than its arrival, at which its
// cost keeps every window of its tenant's limit (units at t count during
// [t, t+Per)) within Count, the jobs placed before it included. A small
// job may so take a gap before a larger job's instant, never moving it.
// By brute force, with no bound on how far ahead it looks: the reference
// a run's starts are judged against.
func exactStarts(jobs []job, rateOf func(string) throttle.Rate) []int64 {
	type unit struct {
		at int64 // µs
		n  int
	}
	placed := map[string][]unit{}
	// fits reports whether n more units at s keep within limit every
	// window ending at s or at a unit in (s, s+w): those are the windows
	// whose count can change.
	fits := func(us []unit, s int64, n, limit int, w int64) bool {
		ends := []int64{s}
		for _, u := range us {
			if u.at > s && u.at < s+w {
				ends = append(ends, u.at)
			}
		}
		for _, x := range ends {
			sum := n
			for _, u := range us {
				if u.at > x-w && u.at <= x {
					sum += u.n
				}
			}
			if sum > limit {
				return false
			}
		}
		return true
	}
	starts := make([]int64, len(jobs))
	for i, j := range jobs {
		r := rateOf(j.Tenant)
		w, n, us := r.PerMicros(), max(j.Cost, 1), placed[j.Tenant]
		// The earliest fit is the arrival or an instant a unit leaves.
		cands := []int64{j.at().Microseconds()}
		for _, u := range us {
			if u.at+w > cands[0] {
				cands = append(cands, u.at+w)
			}
		}
		sort.Slice(cands, func(a, b int) bool { return cands[a] < cands[b] })
		for _, s := range cands {
			if fits(us, s, n, r.Count, w) {
				starts[i] = s
				placed[j.Tenant] = append(us, unit{s, n})
				break
			}
		}
	}
	return starts
}

// spanOf returns first arrival to last start (as a report's seconds).
func spanOf(jobs []job, starts []int64) time.Duration {
	first, last := int64(math.MaxInt64), int64(0)
	for i, j := range jobs {
		first = min(first, j.at().Microseconds())
		last = max(last, starts[i])
	}
	return time.Duration(last-first) * time.Microsecond
}

// TestCostsExactSchedule: testdata/costs.jsonl is what its README entry
// says (51 jobs, 158 units, 5/1s), and its exact schedule ends 32 s after
// the first arrival.
func TestCostsExactSchedule(t *testing.T) {
	jf, rateOf := loadCosts(t)
	exact := exactStarts(jf.Jobs, rateOf)
	if span := spanOf(jf.Jobs, exact); span != 32*time.Second {
		t.Fatalf("exact schedule span %v, want 32s", span)
	}
}

// loadCosts loads testdata/costs.jsonl and checks it is what its README
// entry says: 51 jobs, 158 units, one tenant at 5/1s.
func loadCosts(t *testing.T) (jobsFile, func(string) throttle.Rate) {
	t.Helper()
	jf, err := loadJobs("../../testdata/costs.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	units := 0
	for _, j := range jf.Jobs {
		units += max(j.Cost, 1)
	}
	rateOf := func(tenant string) throttle.Rate { return jf.Rates[tenant] }
	if r := rateOf("costs"); len(jf.Jobs) != 51 || units != 158 || r != (throttle.Rate{Count: 5, Per: time.Second}) {
		t.Fatalf("costs.jsonl: %d jobs, %d units, rate %v; want 51, 158, 5/1s", len(jf.Jobs), units, r)
	}
	return jf, rateOf
}

// replayStarts is the first-come-first-served replay of mustWait on
// window.Memory at fixed instants: each job asks at its arrival, and a
// job refused comes back after its RetryAfter (its reserved slot) until
// admitted. It returns the instants (µs) the jobs were admitted at.
func replayStarts(t *testing.T, jobs []job, rateOf func(string) throttle.Rate) []int64 {
	t.Helper()
	clock := &fixedClock{}
	limiters := map[string]*window.Memory{}
	type event struct {
		at time.Duration
		i  int
	}
	events := make([]event, 0, len(jobs))
	for i, j := range jobs {
		events = append(events, event{j.at(), i})
	}
	starts := make([]int64, len(jobs))
	for len(events) > 0 {
		sort.SliceStable(events, func(a, b int) bool { return events[a].at < events[b].at })
		e := events[0]
		events = events[1:]
		j := jobs[e.i]
		l := limiters[j.Tenant]
		if l == nil {
			var err error
			if l, err = window.NewMemory(rateOf(j.Tenant), window.WithClock(clock)); err != nil {
				t.Fatal(err)
			}
			limiters[j.Tenant] = l
		}
		clock.t = time.Unix(0, 0).Add(e.at)
		d, err := l.AllowID(context.Background(), j.Tenant, max(j.Cost, 1), j.ID, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			starts[e.i] = e.at.Microseconds()
			continue
		}
		events = append(events, event{e.at + d.RetryAfter, e.i})
	}
	return starts
}

// TestCostsReplayIsExact: the limiter's own schedule of costs.jsonl (the
// slots window.Memory reserves, claimed on time) is the exact schedule:
// no job starts later than the earliest instant that keeps every window
// within the limit. The Redis script makes the same decisions
// (window.TestMemoryAndRedisDecideAlike, window.TestBackfillFarAhead).
func TestCostsReplayIsExact(t *testing.T) {
	jf, rateOf := loadCosts(t)
	exact := exactStarts(jf.Jobs, rateOf)
	got := replayStarts(t, jf.Jobs, rateOf)
	for i, j := range jf.Jobs {
		if got[i] != exact[i] {
			t.Errorf("%s (cost %d, at %d ms) starts at %v, the exact schedule at %v",
				j.ID, j.Cost, j.AtMS, time.Duration(got[i])*time.Microsecond, time.Duration(exact[i])*time.Microsecond)
		}
	}
	if span := spanOf(jf.Jobs, got); span != 32*time.Second {
		t.Errorf("replay span %v, want the exact 32s", span)
	}
}
