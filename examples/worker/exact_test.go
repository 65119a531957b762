package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
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

// TestCostsReplayIsExact: the limiter's own schedule of costs.jsonl (the
// slots window.Memory reserves, claimed on time: the worker's replay) is
// the exact schedule:
// no job starts later than the earliest instant that keeps every window
// within the limit. The Redis script makes the same decisions
// (window.TestMemoryAndRedisDecideAlike, window.TestBackfillFarAhead).
func TestCostsReplayIsExact(t *testing.T) {
	jf, rateOf := loadCosts(t)
	exact := exactStarts(jf.Jobs, rateOf)
	starts, _ := replay(jf.Jobs, rateOf, limiterSpec{})
	got := make([]int64, len(starts))
	for i, j := range jf.Jobs {
		got[i] = starts[i].Microseconds()
		if got[i] != exact[i] {
			t.Errorf("%s (cost %d, at %d ms) starts at %v, the exact schedule at %v",
				j.ID, j.Cost, j.AtMS, time.Duration(got[i])*time.Microsecond, time.Duration(exact[i])*time.Microsecond)
		}
	}
	if span := spanOf(jf.Jobs, got); span != 32*time.Second {
		t.Errorf("replay span %v, want the exact 32s", span)
	}
}

// TestRandomReplaysAreExact is TestCostsReplayIsExact on 200 random
// traces: one to three tenants at 1-6 per 200 ms to 2 s, costs 1 to the
// limit, arrivals in bursts and gaps. Every job starts at the exact
// schedule's instant, small jobs taking the gaps before larger ones.
func TestRandomReplaysAreExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 5))
	waited, backfilled := 0, 0
	for trace := range 200 {
		rates := map[string]throttle.Rate{}
		var jobs []job
		tenants := 1 + rng.IntN(3)
		for k := range tenants {
			name := fmt.Sprintf("t%d", k)
			rates[name] = throttle.Rate{Count: 1 + rng.IntN(6), Per: time.Duration(200+rng.IntN(9)*225) * time.Millisecond}
		}
		at := int64(0)
		for i := range 20 + rng.IntN(40) {
			if rng.IntN(3) == 0 {
				at += int64(rng.IntN(1500))
			}
			tenant := fmt.Sprintf("t%d", rng.IntN(tenants))
			jobs = append(jobs, job{ID: fmt.Sprintf("j%d", i), Tenant: tenant, AtMS: at, Cost: 1 + rng.IntN(rates[tenant].Count)})
		}
		rateOf := func(tenant string) throttle.Rate { return rates[tenant] }
		exact := exactStarts(jobs, rateOf)
		starts, _ := replay(jobs, rateOf, limiterSpec{})
		for i, j := range jobs {
			if starts[i] > j.at() {
				waited++
			}
			if i > 0 && starts[i] < starts[i-1] {
				backfilled++
			}
			if got := starts[i].Microseconds(); got != exact[i] {
				t.Fatalf("trace %d (rates %v): %s of %s (cost %d, at %d ms) starts at %v, the exact schedule at %v",
					trace, rates, j.ID, j.Tenant, j.Cost, j.AtMS, starts[i], time.Duration(exact[i])*time.Microsecond)
			}
		}
	}
	if waited == 0 || backfilled == 0 {
		t.Fatalf("%d jobs waited, %d started before the job ahead of them: the traces do not test the schedule", waited, backfilled)
	}
	t.Logf("%d jobs waited, %d started before the job ahead of them", waited, backfilled)
}
