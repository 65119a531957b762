package throttletest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// NewIDLimiterFunc returns the IDLimiter under test, enforcing r (with
// capacity burst, for token buckets; windows ignore it) and reading time
// from c, with no state for any key.
type NewIDLimiterFunc func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.IDLimiter

// idStep is one decision of a reservation table: at T0+at, AllowID(key,
// n, id, horizon) must be admitted, or rejected with Reserved and
// RetryAfter as given. An empty id means AllowN. n == 0 means 1.
type idStep struct {
	at         time.Duration
	id         string
	n          int
	horizon    time.Duration
	allowed    bool
	reserved   bool
	retryAfter time.Duration
}

type idTable struct {
	name  string
	rate  throttle.Rate
	burst int
	steps []idStep
}

const horizon5s = 5 * time.Second

// windowIDTables are the sliding-window rules of reservations and ids.
var windowIDTables = []idTable{
	{
		// The example of the issue: limit 2/1s, horizon 5 s.
		name: "first come first served",
		rate: throttle.Rate{Count: 2, Per: time.Second},
		steps: []idStep{
			{at: 0, id: "a", horizon: horizon5s, allowed: true},
			{at: 0, id: "b", horizon: horizon5s, allowed: true},
			{at: 0, id: "c", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 0, id: "d", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 0, id: "e", horizon: horizon5s, reserved: true, retryAfter: 2 * time.Second},
			// An id admitted and still counted: admitted, nothing charged
			// (else c's claim at 1 s would find its window full).
			{at: 500 * ms, id: "a", horizon: horizon5s, allowed: true},
			// Early: rejected on its own slot, nothing new reserved.
			{at: 500 * ms, id: "c", horizon: horizon5s, reserved: true, retryAfter: 500 * ms},
			{at: time.Second, id: "c", horizon: horizon5s, allowed: true},
			{at: time.Second, id: "d", horizon: horizon5s, allowed: true},
			{at: time.Second, id: "f", horizon: horizon5s, reserved: true, retryAfter: time.Second}, // behind e
			{at: time.Second, reserved: false, retryAfter: 2 * time.Second},                         // AllowN waits for f too
			{at: 2 * time.Second, id: "e", horizon: horizon5s, allowed: true},
			{at: 2 * time.Second, id: "f", horizon: horizon5s, allowed: true},
			{at: 2 * time.Second, id: "g", horizon: horizon5s, reserved: true, retryAfter: time.Second},
		},
	},
	{
		name: "beyond the horizon nothing is reserved",
		rate: throttle.Rate{Count: 2, Per: time.Second},
		steps: []idStep{
			{at: 0, id: "a", horizon: 1500 * ms, allowed: true},
			{at: 0, id: "b", horizon: 1500 * ms, allowed: true},
			{at: 0, id: "c", horizon: 1500 * ms, reserved: true, retryAfter: time.Second},
			{at: 0, id: "d", horizon: 1500 * ms, reserved: true, retryAfter: time.Second},
			{at: 0, id: "e", horizon: 1500 * ms, retryAfter: 2 * time.Second},
			{at: 0, id: "e", horizon: 1500 * ms, retryAfter: 2 * time.Second},
			{at: 0, id: "e", horizon: 0, retryAfter: 2 * time.Second},
			{at: 2 * time.Second, id: "e", horizon: 1500 * ms, allowed: true},
		},
	},
	{
		// A reservation holds n units; a small request may fill a gap
		// before a larger reservation without delaying it.
		name: "costs and backfilling",
		rate: throttle.Rate{Count: 5, Per: time.Second},
		steps: []idStep{
			{at: 0, id: "a", n: 3, horizon: horizon5s, allowed: true},
			{at: 0, id: "b", n: 5, horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 0, id: "c", n: 2, horizon: horizon5s, allowed: true}, // fits before b
			{at: 500 * ms, id: "d", n: 1, horizon: horizon5s, reserved: true, retryAfter: 1500 * ms},
			{at: time.Second, id: "b", n: 5, horizon: horizon5s, allowed: true},
			{at: 2 * time.Second, id: "d", n: 1, horizon: horizon5s, allowed: true},
		},
	},
	{
		// A late claim is admitted at the instant it really runs; a claim
		// whose last window that fills waits for it. Reservations for the
		// same slot are not ahead of each other.
		name: "late claims are counted when they run",
		rate: throttle.Rate{Count: 2, Per: time.Second},
		steps: []idStep{
			{at: 0, id: "a", horizon: horizon5s, allowed: true},
			{at: 0, id: "b", horizon: horizon5s, allowed: true},
			{at: 0, id: "c", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 0, id: "d", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 0, id: "e", horizon: horizon5s, reserved: true, retryAfter: 2 * time.Second},
			{at: 0, id: "f", horizon: horizon5s, reserved: true, retryAfter: 2 * time.Second},
			{at: 0, id: "g", horizon: horizon5s, reserved: true, retryAfter: 3 * time.Second},
			{at: time.Second, id: "d", horizon: horizon5s, allowed: true},
			{at: 1200 * ms, id: "c", horizon: horizon5s, allowed: true},                       // 200 ms late: counted from 1.2 s
			{at: 2100 * ms, id: "e", horizon: horizon5s, allowed: true},                       // f, at the same slot, is not ahead of e
			{at: 2150 * ms, id: "f", horizon: horizon5s, reserved: true, retryAfter: 50 * ms}, // c counts until 2.2 s
			{at: 2200 * ms, id: "f", horizon: horizon5s, allowed: true},
			{at: 3 * time.Second, id: "g", horizon: horizon5s, reserved: true, retryAfter: 100 * ms}, // e counts until 3.1 s
			{at: 3100 * ms, id: "g", horizon: horizon5s, allowed: true},
		},
	},
	{
		// A claim later than its slot's window keeps its priority (within
		// the smaller of the horizon and 10 s): it goes ahead of the
		// reservations for later slots, even overdue ones, and of a
		// newcomer, instead of queueing at the tail.
		name: "very late claims keep their priority",
		rate: throttle.Rate{Count: 1, Per: time.Second},
		steps: []idStep{
			{at: 0, id: "a", horizon: horizon5s, allowed: true},
			{at: 0, id: "b", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 0, id: "c", horizon: horizon5s, reserved: true, retryAfter: 2 * time.Second},
			{at: 2500 * ms, id: "b", horizon: horizon5s, allowed: true}, // 1.5 s late, still ahead of c
			{at: 2500 * ms, id: "x", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 3 * time.Second, id: "c", horizon: horizon5s, reserved: true, retryAfter: 500 * ms}, // after b
			{at: 3500 * ms, id: "c", horizon: horizon5s, allowed: true},                              // first of the two at 3.5 s
			{at: 3500 * ms, id: "x", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 4500 * ms, id: "x", horizon: horizon5s, allowed: true},
		},
	},
	{
		// Beyond its window and the grace (the horizon, 1 s here) a
		// reservation is gone: its id is new again.
		name: "beyond the grace a reservation is gone",
		rate: throttle.Rate{Count: 1, Per: time.Second},
		steps: []idStep{
			{at: 0, id: "a", horizon: time.Second, allowed: true},
			{at: 0, id: "b", horizon: time.Second, reserved: true, retryAfter: time.Second},
			{at: 3500 * ms, id: "d", horizon: time.Second, allowed: true},
			{at: 3500 * ms, id: "e", horizon: time.Second, reserved: true, retryAfter: time.Second},
			{at: 3500 * ms, id: "b", horizon: time.Second, retryAfter: 2 * time.Second}, // behind e, beyond the horizon
		},
	},
	{
		name: "unclaimed reservations pass",
		rate: throttle.Rate{Count: 1, Per: time.Second},
		steps: []idStep{
			{at: 0, id: "a", horizon: horizon5s, allowed: true},
			{at: 0, id: "b", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 0, id: "c", horizon: horizon5s, reserved: true, retryAfter: 2 * time.Second},
			{at: 1500 * ms, reserved: false, retryAfter: 1500 * ms}, // b's slot counts though unclaimed
			{at: 3 * time.Second, allowed: true},
			// b's reservation passed with its window: b is new again.
			{at: 3 * time.Second, id: "b", horizon: horizon5s, reserved: true, retryAfter: time.Second},
		},
	},
}

// bucketIDTables are the token-bucket rules: a reservation takes its
// tokens ahead of time, as golang.org/x/time/rate's ReserveN does.
var bucketIDTables = []idTable{
	{
		name: "first come first served",
		rate: throttle.Rate{Count: 2, Per: time.Second}, burst: 2,
		steps: []idStep{
			{at: 0, id: "a", horizon: horizon5s, allowed: true},
			{at: 0, id: "b", horizon: horizon5s, allowed: true},
			{at: 0, id: "c", horizon: horizon5s, reserved: true, retryAfter: 500 * ms},
			{at: 0, id: "d", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: 0, id: "e", horizon: horizon5s, reserved: true, retryAfter: 1500 * ms},
			{at: 250 * ms, id: "a", horizon: horizon5s, allowed: true},
			{at: 250 * ms, id: "c", horizon: horizon5s, reserved: true, retryAfter: 250 * ms},
			{at: 500 * ms, id: "c", horizon: horizon5s, allowed: true},
			{at: time.Second, id: "d", horizon: horizon5s, allowed: true},
			{at: time.Second, id: "f", horizon: horizon5s, reserved: true, retryAfter: time.Second},
			{at: time.Second, retryAfter: 1500 * ms},                    // AllowN waits for the debt (e, f) and its own token
			{at: 1600 * ms, id: "e", horizon: horizon5s, allowed: true}, // late: runs on its tokens
			{at: 2 * time.Second, id: "f", horizon: horizon5s, allowed: true},
			{at: 2 * time.Second, id: "g", horizon: horizon5s, reserved: true, retryAfter: 500 * ms},
		},
	},
	{
		name: "beyond the horizon nothing is reserved",
		rate: throttle.Rate{Count: 2, Per: time.Second}, burst: 2,
		steps: []idStep{
			{at: 0, id: "a", horizon: 1200 * ms, allowed: true},
			{at: 0, id: "b", horizon: 1200 * ms, allowed: true},
			{at: 0, id: "c", horizon: 1200 * ms, reserved: true, retryAfter: 500 * ms},
			{at: 0, id: "d", horizon: 1200 * ms, reserved: true, retryAfter: time.Second},
			{at: 0, id: "e", horizon: 1200 * ms, retryAfter: 1500 * ms},
			{at: 0, id: "e", horizon: 0, retryAfter: 1500 * ms},
			{at: 1500 * ms, id: "e", horizon: 1200 * ms, allowed: true},
		},
	},
	{
		name: "costs",
		rate: throttle.Rate{Count: 4, Per: time.Second}, burst: 4,
		steps: []idStep{
			{at: 0, id: "a", n: 3, horizon: horizon5s, allowed: true},
			{at: 0, id: "b", n: 3, horizon: horizon5s, reserved: true, retryAfter: 500 * ms},
			{at: 0, id: "c", n: 1, horizon: horizon5s, reserved: true, retryAfter: 750 * ms},
			{at: 500 * ms, id: "b", n: 3, horizon: horizon5s, allowed: true},
			{at: 750 * ms, id: "c", n: 1, horizon: horizon5s, allowed: true},
		},
	},
}

// RunWindowReservations runs the reservation and id rules of a sliding
// window log against newLimiter's limiters (burst is 0): reservations in
// first-come-first-served order, one slot per id, nothing reserved beyond
// the horizon, costs and backfilling, late claims counted at the instant
// they run, unclaimed reservations passing, ids scoped to their key and
// opaque.
func RunWindowReservations(t *testing.T, newLimiter NewIDLimiterFunc) {
	t.Helper()
	runIDTables(t, "window", windowIDTables, newLimiter)
	runIDCommon(t, newLimiter)
}

// RunBucketReservations runs the reservation and id rules of a token
// bucket against newLimiter's limiters: reservations take tokens ahead of
// time up to horizon × rate in debt, one slot per id, a late claim runs
// on its tokens, ids scoped to their key and opaque.
func RunBucketReservations(t *testing.T, newLimiter NewIDLimiterFunc) {
	t.Helper()
	runIDTables(t, "bucket", bucketIDTables, newLimiter)
	runIDCommon(t, newLimiter)
}

func runIDTables(t *testing.T, family string, tables []idTable, newLimiter NewIDLimiterFunc) {
	for _, tc := range tables {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(T0)
			l := newLimiter(t, tc.rate, max(tc.burst, tc.rate.Count), clock)
			key := family + "/ids/" + tc.name
			for i, s := range tc.steps {
				clock.Set(T0.Add(s.at))
				d := decideID(t, l, key, s)
				what := fmt.Sprintf("step %d (at %v, id %q, n %d, horizon %v)", i, s.at, s.id, max(s.n, 1), s.horizon)
				checkIDDecision(t, what, d, tc.rate)
				if d.Allowed != s.allowed || d.Reserved != s.reserved || d.RetryAfter != s.retryAfter {
					t.Fatalf("%s:\n got  %s\n want {Allowed:%v Reserved:%v RetryAfter:%v}", what, fmtIDDecision(d), s.allowed, s.reserved, s.retryAfter)
				}
			}
		})
	}
}

func decideID(t *testing.T, l throttle.IDLimiter, key string, s idStep) throttle.Decision {
	t.Helper()
	n := max(s.n, 1)
	var d throttle.Decision
	var err error
	if s.id == "" {
		d, err = l.AllowN(context.Background(), key, n)
	} else {
		d, err = l.AllowID(context.Background(), key, n, s.id, s.horizon)
	}
	if err != nil {
		t.Fatalf("at %v, id %q: %v", s.at, s.id, err)
	}
	return d
}

// checkIDDecision checks what every Decision of AllowID must satisfy.
func checkIDDecision(t *testing.T, what string, d throttle.Decision, r throttle.Rate) {
	t.Helper()
	switch {
	case d.Limit != r.Count:
		t.Fatalf("%s: Limit = %d, want %d", what, d.Limit, r.Count)
	case d.Remaining < 0:
		t.Fatalf("%s: Remaining = %d < 0", what, d.Remaining)
	case d.Allowed && (d.RetryAfter != 0 || d.Reserved):
		t.Fatalf("%s: admitted with RetryAfter %v, Reserved %v", what, d.RetryAfter, d.Reserved)
	case !d.Allowed && d.RetryAfter <= 0:
		t.Fatalf("%s: rejected with RetryAfter %v, want > 0", what, d.RetryAfter)
	case d.RetryAfter%time.Millisecond != 0 || d.ResetAfter%time.Millisecond != 0 || d.ResetAfter < 0:
		t.Fatalf("%s: RetryAfter %v or ResetAfter %v not whole non-negative milliseconds", what, d.RetryAfter, d.ResetAfter)
	}
}

func fmtIDDecision(d throttle.Decision) string {
	return fmt.Sprintf("{Allowed:%v Reserved:%v RetryAfter:%v Remaining:%d ResetAfter:%v}",
		d.Allowed, d.Reserved, d.RetryAfter, d.Remaining, d.ResetAfter)
}

// runIDCommon runs the rules every IDLimiter shares.
func runIDCommon(t *testing.T, newLimiter NewIDLimiterFunc) {
	r := throttle.Rate{Count: 2, Per: time.Second}
	t.Run("ids are scoped to their key", func(t *testing.T) {
		l := newLimiter(t, r, 2, NewClock(T0))
		ctx := context.Background()
		for _, key := range []string{"k1", "k2"} {
			for i := range 2 {
				d, err := l.AllowID(ctx, key, 1, "same", horizon5s)
				if err != nil || !d.Allowed {
					t.Fatalf("key %s, try %d: %s, %v; want admitted", key, i, fmtIDDecision(d), err)
				}
			}
		}
		// "same" was charged once on each key.
		for _, key := range []string{"k1", "k2"} {
			d, err := l.AllowN(ctx, key, 1)
			if err != nil || !d.Allowed || d.Remaining != 0 {
				t.Fatalf("key %s: %s, %v; want admitted with Remaining 0", key, fmtIDDecision(d), err)
			}
		}
	})
	t.Run("ids are opaque", func(t *testing.T) {
		ids := append(OddKeys(), "A1:x", "R1:x", "x:1", "x", "1:x")
		l := newLimiter(t, throttle.Rate{Count: len(ids), Per: time.Second}, len(ids), NewClock(T0))
		ctx := context.Background()
		for round := range 2 {
			for i, id := range ids {
				d, err := l.AllowID(ctx, "opaque", 1, id, horizon5s)
				if err != nil || !d.Allowed {
					t.Fatalf("round %d, id #%d %.40q: %s, %v; want admitted", round, i, id, fmtIDDecision(d), err)
				}
				if round == 1 && d.Remaining != 0 {
					t.Fatalf("id #%d %.40q again: Remaining %d, want 0 (charged twice, or ids collide)", i, id, d.Remaining)
				}
			}
		}
		d, err := l.AllowID(ctx, "opaque", 1, "one more", 0)
		if err != nil || d.Allowed {
			t.Fatalf("one more id: %s, %v; want rejected (every id charged once)", fmtIDDecision(d), err)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		l := newLimiter(t, r, 2, NewClock(T0))
		ctx := context.Background()
		if _, err := l.AllowID(ctx, "bad", 0, "x", time.Second); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Fatalf("AllowID(n=0) error = %v, want ErrInvalidCost", err)
		}
		if _, err := l.AllowID(ctx, "bad", 1, "x", -time.Second); !errors.Is(err, throttle.ErrInvalidOption) || !strings.Contains(err.Error(), "horizon") {
			t.Fatalf("AllowID(horizon<0) error = %v, want ErrInvalidOption naming horizon", err)
		}
		d, err := l.AllowID(ctx, "bad", 2, "x", 0)
		if err != nil || !d.Allowed {
			t.Fatalf("AllowID after bad input: %s, %v; want admitted (bad input charges nothing)", fmtIDDecision(d), err)
		}
	})
}
