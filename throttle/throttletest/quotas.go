package throttletest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// NewQuotaFunc returns the limiter under test, enforcing r for keys
// without a quota and quotas for the others, reading time from c, with no
// state for any key.
type NewQuotaFunc func(t *testing.T, r throttle.Rate, quotas throttle.QuotaFunc, c throttle.Clock) throttle.Limiter

// RunWindowQuotas runs the per-key quota rules of a sliding window log:
// each key is decided against its own quota (the limiter's Rate for the
// zero Quota), Decision.Limit is the key's, a changed quota applies from
// the next decision (a smaller one never admits over itself), a cost
// above the key's limit is an error wrapping throttle.ErrInvalidCost and
// an invalid quota one wrapping throttle.ErrInvalidOption.
func RunWindowQuotas(t *testing.T, newLimiter NewQuotaFunc) {
	t.Helper()
	var mu sync.Mutex
	quotas := map[string]throttle.Quota{
		"gold": {Rate: throttle.Rate{Count: 3, Per: time.Second}},
		"free": {Rate: throttle.Rate{Count: 1, Per: 500 * ms}},
		"bad":  {Rate: throttle.Rate{Count: -1, Per: time.Second}},
		"zero": {Rate: throttle.Rate{Count: 0, Per: -time.Second}},
	}
	set := func(key string, q throttle.Quota) {
		mu.Lock()
		quotas[key] = q
		mu.Unlock()
	}
	f := func(key string) throttle.Quota {
		mu.Lock()
		defer mu.Unlock()
		return quotas[key]
	}
	clock := NewClock(T0)
	l := newLimiter(t, throttle.Rate{Count: 2, Per: time.Second}, f, clock)
	ctx := context.Background()
	type step struct {
		at         time.Duration
		key        string
		n          int
		allowed    bool
		limit      int
		retryAfter time.Duration
	}
	run := func(t *testing.T, steps []step) {
		t.Helper()
		for i, s := range steps {
			clock.Set(T0.Add(s.at))
			d, err := l.AllowN(ctx, s.key, max(s.n, 1))
			if err != nil {
				t.Fatalf("step %d (at %v, key %s): %v", i, s.at, s.key, err)
			}
			if d.Allowed != s.allowed || d.Limit != s.limit || d.RetryAfter != s.retryAfter {
				t.Fatalf("step %d (at %v, key %s): %s, want allowed %v, limit %d, retry after %v",
					i, s.at, s.key, fmtDecision(d), s.allowed, s.limit, s.retryAfter)
			}
		}
	}
	t.Run("per key", func(t *testing.T) {
		run(t, []step{
			{at: 0, key: "gold", allowed: true, limit: 3},
			{at: 0, key: "gold", n: 2, allowed: true, limit: 3},
			{at: 0, key: "gold", limit: 3, retryAfter: time.Second},
			{at: 0, key: "free", allowed: true, limit: 1},
			{at: 0, key: "free", limit: 1, retryAfter: 500 * ms},
			{at: 0, key: "other", allowed: true, limit: 2},
			{at: 0, key: "other", allowed: true, limit: 2},
			{at: 0, key: "other", limit: 2, retryAfter: time.Second},
			{at: 500 * ms, key: "free", allowed: true, limit: 1},
		})
	})
	t.Run("changed at run time", func(t *testing.T) {
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 3, Per: time.Second}})
		run(t, []step{
			{at: 2 * time.Second, key: "k", n: 3, allowed: true, limit: 3},
		})
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 2, Per: time.Second}})
		run(t, []step{
			// 3 counted against a new limit of 2: the 2nd oldest must leave.
			{at: 2500 * ms, key: "k", limit: 2, retryAfter: 500 * ms},
		})
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 5, Per: time.Second}})
		run(t, []step{
			{at: 2600 * ms, key: "k", n: 2, allowed: true, limit: 5},
			{at: 2600 * ms, key: "k", limit: 5, retryAfter: 400 * ms},
		})
		set("k", throttle.Quota{})
		run(t, []step{
			{at: 2700 * ms, key: "k", limit: 2, retryAfter: 900 * ms}, // the limiter's own 2/1s: the 4th oldest of 5 leaves at 3.6 s
		})
	})
	t.Run("blocked", func(t *testing.T) {
		testBlocked(t, l, clock, set)
	})
	t.Run("bad input", func(t *testing.T) {
		for _, key := range []string{"bad", "zero"} {
			if _, err := l.AllowN(ctx, key, 1); !errors.Is(err, throttle.ErrInvalidOption) || !errors.Is(err, throttle.ErrInvalidQuota) {
				t.Errorf("invalid quota of %s: error %v, want ErrInvalidQuota and ErrInvalidOption", key, err)
			}
		}
		if _, err := l.AllowN(ctx, "gold", 4); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Errorf("cost 4 above gold's 3: error %v, want ErrInvalidCost", err)
		}
		if _, err := l.AllowN(ctx, "other", 3); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Errorf("cost 3 above the default 2: error %v, want ErrInvalidCost", err)
		}
		d, err := l.AllowN(ctx, "gold-fresh", 2)
		if err != nil || !d.Allowed {
			t.Errorf("a key without a quota after bad input: %s, %v", fmt.Sprint(d), err)
		}
	})
}

// testBlocked checks the blocked quota (throttle.Blocked) on a limiter
// whose own limit admits 2 at once: every decision of the key is a
// rejection with the quota's period as RetryAfter, at any cost, charging
// and reserving nothing, so the key has its whole limit once unblocked.
func testBlocked(t *testing.T, l throttle.Limiter, clock *Clock, set func(string, throttle.Quota)) {
	t.Helper()
	ctx := context.Background()
	clock.Set(T0.Add(time.Hour))
	set("off", throttle.Blocked(250*ms+300*time.Microsecond))
	want := func(what string, d throttle.Decision, err error) {
		t.Helper()
		if err != nil || d.Allowed || d.Reserved || d.Remaining != 0 || d.RetryAfter != 251*ms {
			t.Errorf("%s of a blocked key: %s, %v; want a rejection, nothing reserved, retry after 251ms", what, fmtDecision(d), err)
		}
	}
	for _, n := range []int{1, 2, 1000} {
		d, err := l.AllowN(ctx, "off", n)
		want(fmt.Sprintf("AllowN(%d)", n), d, err)
	}
	if ids, ok := l.(throttle.IDLimiter); ok {
		d, err := ids.AllowID(ctx, "off", 1, "m-1", time.Minute)
		want("AllowID with a horizon", d, err)
	}
	if p, ok := l.(interface {
		Peek(ctx context.Context, key string, n int) (throttle.Decision, error)
	}); ok {
		d, err := p.Peek(ctx, "off", 1)
		want("Peek", d, err)
	}
	if b, ok := l.(throttle.BatchLimiter); ok {
		ds, err := b.AllowBatch(ctx, []throttle.Request{{Key: "off", N: 1}, {Key: "off-not", N: 1}, {Key: "off", N: 2}})
		if err != nil || len(ds) != 3 {
			t.Fatalf("AllowBatch beside a blocked key: %v, %v", ds, err)
		}
		want("AllowBatch's 1st", ds[0], nil)
		want("AllowBatch's 3rd", ds[2], nil)
		if !ds[1].Allowed {
			t.Errorf("AllowBatch: an unblocked key beside a blocked one: %s, want admitted", fmtDecision(ds[1]))
		}
	}
	set("off", throttle.Quota{})
	d, err := l.AllowN(ctx, "off", 2)
	if err != nil || !d.Allowed {
		t.Errorf("unblocked: AllowN(2) = %s, %v; want admitted (the block charged nothing)", fmtDecision(d), err)
	}
}
