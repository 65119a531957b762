package throttletest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// NewBucketQuotaFunc returns the token bucket under test, refilling
// r.Count tokens per r.Per up to burst for keys without a quota and as
// quotas says for the others, reading time from c, with no state for any
// key.
type NewBucketQuotaFunc func(t *testing.T, r throttle.Rate, burst int, quotas throttle.QuotaFunc, c throttle.Clock) throttle.Limiter

// RunBucketQuotas runs the per-key quota rules of a token bucket, exactly,
// on fixed instants: each key is decided against its own quota (Burst 0
// means Rate.Count; the limiter's rate and burst for the zero Quota), and
// Decision.Limit is the key's Rate.Count. A changed quota applies from the
// next decision: the bucket keeps the tokens it holds, capped at the new
// burst (a shrunk burst limits the very next decision), and refills at the
// new rate from then on; when Rate.Per changes, the tokens are counted
// whole (2.5 tokens at 40/2s are 2 at 20/1s, not the 5 that reading the
// credit in the new period would give). A cost above the key's burst is
// an error wrapping throttle.ErrInvalidCost and an invalid quota one
// wrapping throttle.ErrInvalidOption.
func RunBucketQuotas(t *testing.T, newLimiter NewBucketQuotaFunc) {
	t.Helper()
	var mu sync.Mutex
	quotas := map[string]throttle.Quota{
		"gold": {Rate: throttle.Rate{Count: 10, Per: time.Second}, Burst: 3},
		"free": {Rate: throttle.Rate{Count: 1, Per: 500 * ms}},
		"bad":  {Rate: throttle.Rate{Count: -1, Per: time.Second}},
		"zero": {Rate: throttle.Rate{Count: 0, Per: -time.Second}},
		"neg":  {Rate: throttle.Rate{Count: 1, Per: time.Second}, Burst: -1},
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
	l := newLimiter(t, throttle.Rate{Count: 2, Per: time.Second}, 2, f, clock)
	ctx := context.Background()
	type step struct {
		at         time.Duration
		key        string
		n          int
		allowed    bool
		limit      int
		remaining  int
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
			if d.Allowed != s.allowed || d.Limit != s.limit || d.Remaining != s.remaining || d.RetryAfter != s.retryAfter {
				t.Fatalf("step %d (at %v, key %s, n %d): %s, want allowed %v, limit %d, remaining %d, retry after %v",
					i, s.at, s.key, max(s.n, 1), fmtDecision(d), s.allowed, s.limit, s.remaining, s.retryAfter)
			}
		}
	}
	t.Run("per key", func(t *testing.T) {
		run(t, []step{
			{at: 0, key: "gold", n: 3, allowed: true, limit: 10},
			{at: 0, key: "gold", limit: 10, retryAfter: 100 * ms},
			{at: 0, key: "free", allowed: true, limit: 1},
			{at: 0, key: "free", limit: 1, retryAfter: 500 * ms},
			{at: 0, key: "other", allowed: true, limit: 2, remaining: 1},
			{at: 0, key: "other", allowed: true, limit: 2},
			{at: 0, key: "other", limit: 2, retryAfter: 500 * ms},
			{at: 300 * ms, key: "gold", n: 3, allowed: true, limit: 10},
			{at: 500 * ms, key: "free", allowed: true, limit: 1},
		})
	})
	t.Run("changed at run time", func(t *testing.T) {
		const at = 10 * time.Second
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 10, Per: time.Second}, Burst: 5})
		run(t, []step{{at: at, key: "k", n: 5, allowed: true, limit: 10}})
		// 3 tokens by +300ms, but the burst shrinks to 2: 1 left after one.
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 10, Per: time.Second}, Burst: 2})
		run(t, []step{
			{at: at + 300*ms, key: "k", allowed: true, limit: 10, remaining: 1},
		})
		// A grown burst adds no token: the one left, then the refill.
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 10, Per: time.Second}, Burst: 8})
		run(t, []step{
			{at: at + 300*ms, key: "k", allowed: true, limit: 10},
			{at: at + 300*ms, key: "k", limit: 10, retryAfter: 100 * ms},
			{at: at + 500*ms, key: "k", n: 2, allowed: true, limit: 10},
		})
		// A faster rate refills from the next decision's instant on.
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 20, Per: time.Second}, Burst: 8})
		run(t, []step{{at: at + 600*ms, key: "k", n: 2, allowed: true, limit: 20}})
		// The same rate in another period: 175ms × 20/s = 3.5 tokens.
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 40, Per: 2 * time.Second}, Burst: 8})
		run(t, []step{{at: at + 775*ms, key: "k", allowed: true, limit: 40, remaining: 2}})
		// 2.5 tokens held at 40/2s are 2 whole tokens at 20/1s.
		set("k", throttle.Quota{Rate: throttle.Rate{Count: 20, Per: time.Second}, Burst: 8})
		run(t, []step{
			{at: at + 775*ms, key: "k", n: 2, allowed: true, limit: 20},
			{at: at + 775*ms, key: "k", limit: 20, retryAfter: 50 * ms},
		})
		// Back to the limiter's own 2/1s, burst 2: 0.2 tokens by +100ms.
		set("k", throttle.Quota{})
		run(t, []step{{at: at + 875*ms, key: "k", limit: 2, retryAfter: 400 * ms}})
	})
	t.Run("blocked", func(t *testing.T) {
		testBlocked(t, l, clock, set)
	})
	t.Run("bad input", func(t *testing.T) {
		for _, key := range []string{"bad", "zero", "neg"} {
			if _, err := l.AllowN(ctx, key, 1); !errors.Is(err, throttle.ErrInvalidOption) || !errors.Is(err, throttle.ErrInvalidQuota) {
				t.Errorf("invalid quota of %s: error %v, want ErrInvalidQuota and ErrInvalidOption", key, err)
			}
		}
		if _, err := l.AllowN(ctx, "gold", 4); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Errorf("cost 4 above gold's burst 3: error %v, want ErrInvalidCost", err)
		}
		if _, err := l.AllowN(ctx, "other", 3); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Errorf("cost 3 above the default burst 2: error %v, want ErrInvalidCost", err)
		}
		if d, err := l.AllowN(ctx, "fresh", 2); err != nil || !d.Allowed {
			t.Errorf("a key without a quota after bad input: %s, %v", fmtDecision(d), err)
		}
	})
}
