package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// admission is an admission seen from outside the limiter: its true
// instant lies in [sent, returned].
type admission struct{ sent, returned time.Time }

// maxInWindow returns the most admissions certainly inside one window w
// (conservative: a set counts only if max(returned) - min(sent) < w, so
// even the most favourable true instants fit in a span shorter than w) and
// the naive most by return time (returned within [r, r+w)).
func maxInWindow(adm []admission, w time.Duration) (conservative, naive int) {
	bySent := slices.Clone(adm)
	slices.SortFunc(bySent, func(a, b admission) int { return a.sent.Compare(b.sent) })
	for i, a := range bySent {
		bound := a.sent.Add(w)
		n := 0
		for _, b := range bySent[i:] {
			if b.returned.Before(bound) {
				n++
			}
		}
		conservative = max(conservative, n)
	}
	ret := make([]time.Time, len(adm))
	for i, a := range adm {
		ret[i] = a.returned
	}
	slices.SortFunc(ret, func(a, b time.Time) int { return a.Compare(b) })
	j := 0
	for i := range ret {
		for ret[i].Sub(ret[j]) >= w {
			j++
		}
		naive = max(naive, i-j+1)
	}
	return conservative, naive
}

// accuracyResult is one limiter's accuracy run and boundary probe.
type accuracyResult struct {
	name, kind         string
	bound              int    // stated most admissions in any 1 s
	boundText          string // how the bound follows from the limiter's contract
	total              int
	maxCons, maxNaive  int
	errs               int
	probeBurst         int // admitted in the burst 0.9-1.2 s after the first call
	probeFirstSecond   int // admitted certainly within 1 s of the first admission
	probeMaxCons       int // most in any 1 s during the probe, conservative
	probeErrs          int
	overRun, overProbe bool
}

const (
	accClients    = 2
	accGoroutines = 4
	accDuration   = 3 * time.Second
	probeStart    = 900 * time.Millisecond
	probeEnd      = 1200 * time.Millisecond
)

// statedBound returns the most admissions in any 1 s that the limiter's own
// contract allows at accuracyLimits.
func statedBound(kind string) (int, string) {
	l := accuracyLimits
	switch kind {
	case kindWindow:
		return l.window, fmt.Sprintf("limit: %d in any %v", l.window, l.per)
	case kindBucket, kindGCRA:
		r := int(perSecond(l.rate))
		return l.burst + r, fmt.Sprintf("burst + rate×1s = %d + %d", l.burst, r)
	case kindFixed:
		return 2 * l.window, fmt.Sprintf("%d per fixed window, so up to 2×%d across a boundary (by design)", l.window, l.window)
	}
	return 0, ""
}

// runAccuracy runs k at accuracyLimits from two clients, each with its own
// limiter instance (two processes sharing one Redis), four goroutines each.
func runAccuracy(addr func() *redis.Client, k contender) (accuracyResult, error) {
	r := accuracyResult{name: k.name, kind: k.kind}
	r.bound, r.boundText = statedBound(k.kind)
	clients := make([]*redis.Client, accClients)
	allows := make([]allowFunc, accClients)
	for i := range clients {
		clients[i] = addr()
		defer clients[i].Close()
	}
	if err := clients[0].FlushAll(context.Background()).Err(); err != nil {
		return r, err
	}
	for i := range clients {
		inst, err := k.make(clients[i], accuracyLimits)
		if err != nil {
			return r, err
		}
		defer inst.release()
		allows[i] = inst.allow
	}

	adm, errs := hammer(allows, "acc", time.Now().Add(accDuration))
	r.total, r.errs = len(adm), errs
	r.maxCons, r.maxNaive = maxInWindow(adm, time.Second)
	r.overRun = r.maxCons > r.bound

	// Boundary probe on a fresh key: one call, then every goroutine calls
	// as fast as it can from 0.9 s to 1.2 s after it.
	sent := time.Now()
	ok, err := allows[0](context.Background(), "probe")
	first := admission{sent, time.Now()}
	if err != nil || !ok {
		return r, fmt.Errorf("%s: first probe call: allowed %v, error %v", k.name, ok, err)
	}
	time.Sleep(time.Until(sent.Add(probeStart)))
	burst, perrs := hammer(allows, "probe", sent.Add(probeEnd))
	r.probeBurst, r.probeErrs = len(burst), perrs
	r.probeFirstSecond = 1
	for _, a := range burst {
		// Certainly after the first admission (sent after it returned)
		// and before its instant + 1 s.
		if a.returned.Before(first.sent.Add(time.Second)) {
			r.probeFirstSecond++
		}
	}
	r.probeMaxCons, _ = maxInWindow(append(burst, first), time.Second)
	r.overProbe = r.probeMaxCons > r.bound
	return r, nil
}

// hammer calls key from accGoroutines goroutines per limiter instance as
// fast as they can until end, and returns the admissions and the errors.
func hammer(allows []allowFunc, key string, end time.Time) ([]admission, int) {
	var mu sync.Mutex
	var adm []admission
	errs := 0
	var wg sync.WaitGroup
	ctx := context.Background()
	for _, allow := range allows {
		for range accGoroutines {
			wg.Go(func() {
				var mine []admission
				bad := 0
				for time.Now().Before(end) {
					sent := time.Now()
					ok, err := allow(ctx, key)
					ret := time.Now()
					if err != nil {
						bad++
						continue
					}
					if ok {
						mine = append(mine, admission{sent, ret})
					}
				}
				mu.Lock()
				adm = append(adm, mine...)
				errs += bad
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return adm, errs
}
