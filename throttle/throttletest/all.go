package throttletest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// RunAll checks throttle.All over two limiters of the family under test,
// a per-tenant one (3 per second) and a global one (5 per second, asked
// first), on a random schedule at fixed instants with costs 1 and 2:
//
//   - every Decision is what the parts say, combined as All documents:
//     each part asked alone (charged with AllowID and refunded at once),
//     Allowed when all admit, RetryAfter the largest of the rejecting
//     parts', Limit and Remaining the tightest part's, ResetAfter the
//     largest, Source the farthest;
//   - a rejected request charges no part: the parts always hold what a
//     second pair of limiters holds that was given only the admitted
//     requests.
func RunAll(t *testing.T, newLimiter NewRefunderFunc) {
	t.Helper()
	ctx := context.Background()
	tenantRate := throttle.Rate{Count: 3, Per: time.Second}
	globalRate := throttle.Rate{Count: 5, Per: time.Second}
	clock := NewClock(T0)
	global := func(string) string { return "global" }
	parts := []throttle.Refunder{newLimiter(t, globalRate, clock), newLimiter(t, tenantRate, clock)}
	shadow := []throttle.Refunder{newLimiter(t, globalRate, clock), newLimiter(t, tenantRate, clock)}
	keyFuncs := []func(string) string{global, nil}
	all, err := throttle.All(throttle.Part{Limiter: parts[0], Key: global}, throttle.Part{Limiter: parts[1]})
	if err != nil {
		t.Fatal(err)
	}
	// oracle asks every part alone what it says, and gives back what it
	// took for that.
	oracle := func(t *testing.T, ps []throttle.Refunder, key string, n int) []throttle.Decision {
		t.Helper()
		ds := make([]throttle.Decision, len(ps))
		for i, p := range ps {
			k := key
			if keyFuncs[i] != nil {
				k = keyFuncs[i](key)
			}
			d, err := p.AllowID(ctx, k, n, "runall-probe", 0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				if _, err := p.Refund(ctx, k, n, "runall-probe"); err != nil {
					t.Fatal(err)
				}
			}
			ds[i] = d
		}
		return ds
	}
	rng := rand.New(rand.NewPCG(5, 6))
	at := time.Duration(0)
	admitted, rejected := 0, 0
	for step := range 400 {
		at += time.Duration(rng.IntN(150_000)) * time.Microsecond
		clock.Set(T0.Add(at))
		key := fmt.Sprint("tenant-", rng.IntN(3))
		n := 1 + rng.IntN(2)
		said := oracle(t, parts, key, n)
		if s := oracle(t, shadow, key, n); fmt.Sprint(stripSource(said)) != fmt.Sprint(stripSource(s)) {
			t.Fatalf("step %d at %v (%s, n %d): the parts hold more than the admitted requests:\n parts  %v\n shadow %v", step, at, key, n, said, s)
		}
		want := combine(said)
		got, err := all.AllowN(ctx, key, n)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if got != want {
			t.Fatalf("step %d at %v (%s, n %d): All says %s (source %v)\nthe parts say %v\nwant %s (source %v)", step, at, key, n, fmtDecision(got), got.Source, said, fmtDecision(want), want.Source)
		}
		if !got.Allowed {
			rejected++
			continue
		}
		admitted++
		for i, p := range shadow {
			k := key
			if keyFuncs[i] != nil {
				k = keyFuncs[i](key)
			}
			if d, err := p.AllowN(ctx, k, n); err != nil || !d.Allowed {
				t.Fatalf("step %d: shadow part %d: %s, %v", step, i, fmtDecision(d), err)
			}
		}
	}
	if admitted == 0 || rejected == 0 {
		t.Fatalf("%d admitted, %d rejected: the schedule tests nothing", admitted, rejected)
	}
}

// combine is All's rule for the parts' decisions.
func combine(ds []throttle.Decision) throttle.Decision {
	var out throttle.Decision
	var tight *throttle.Decision
	rejected := false
	for i := range ds {
		d := &ds[i]
		out.ResetAfter = max(out.ResetAfter, d.ResetAfter)
		out.Source = max(out.Source, d.Source)
		switch {
		case !d.Allowed && (!rejected || d.RetryAfter > tight.RetryAfter):
			tight, rejected = d, true
		case d.Allowed && !rejected && (tight == nil || d.Remaining < tight.Remaining):
			tight = d
		}
	}
	out.Allowed = !rejected
	out.Limit, out.Remaining, out.RetryAfter = tight.Limit, tight.Remaining, tight.RetryAfter
	return out
}

func stripSource(ds []throttle.Decision) []throttle.Decision {
	out := make([]throttle.Decision, len(ds))
	for i, d := range ds {
		d.Source = 0
		out[i] = d
	}
	return out
}
