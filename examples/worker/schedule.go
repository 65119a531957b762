package main

import (
	"context"
	"math"
	"sort"
	"time"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// mustWait returns, per tenant, how many jobs of the trace cannot start
// on arrival under their tenant's limit (see replay). It is the floor of
// the NAKs a run needs (one each), and what the summary's NAKs are judged
// against.
func mustWait(jobs []job, rateOf func(string) throttle.Rate, spec limiterSpec) map[string]int {
	_, waited := replay(jobs, rateOf, spec)
	return waited
}

// replay is an exact first-come-first-served replay of the trace on
// in-memory limiters of the run's family at fixed instants, where every
// job that cannot start reserves its slot and starts there. It returns
// each job's start, from the replay's start (-1 for a job its limiter
// could not decide), and per tenant how many jobs could not start on
// arrival.
func replay(jobs []job, rateOf func(string) throttle.Rate, spec limiterSpec) (starts []time.Duration, waited map[string]int) {
	clock := &fixedClock{}
	limiters := map[string]throttle.IDLimiter{}
	limiter := func(tenant string) throttle.IDLimiter {
		if l, ok := limiters[tenant]; ok {
			return l
		}
		r := rateOf(tenant)
		var l throttle.IDLimiter
		var err error
		if spec.bucketed() {
			l, err = bucket.NewLocal(r, spec.burstFor(tenant, r), bucket.WithClock(clock))
		} else {
			l, err = window.NewMemory(r, window.WithClock(clock))
		}
		if err != nil {
			return nil
		}
		limiters[tenant] = l
		return l
	}
	// Arrivals in order; each waiting job comes back at its slot.
	type event struct {
		at time.Duration
		i  int // in jobs
	}
	events := make([]event, 0, len(jobs))
	starts = make([]time.Duration, len(jobs))
	for i, j := range jobs {
		events = append(events, event{j.at(), i})
		starts[i] = -1
	}
	waited = map[string]int{}
	ctx := context.Background()
	for len(events) > 0 {
		sort.SliceStable(events, func(a, b int) bool { return events[a].at < events[b].at })
		e := events[0]
		events = events[1:]
		j := jobs[e.i]
		l := limiter(j.Tenant)
		if l == nil {
			continue
		}
		clock.t = time.Unix(0, 0).Add(e.at)
		d, err := l.AllowID(ctx, j.Tenant, max(j.Cost, 1), j.ID, math.MaxInt64)
		switch {
		case err != nil:
			continue
		case d.Allowed:
			starts[e.i] = e.at
			continue
		}
		if e.at == j.at() {
			waited[j.Tenant]++
		}
		events = append(events, event{e.at + d.RetryAfter, e.i})
	}
	return starts, waited
}

// fixedClock is the clock of the replay.
type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time { return c.t }
