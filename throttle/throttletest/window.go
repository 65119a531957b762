package throttletest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// NewWindowFunc returns the limiter under test, enforcing r and reading
// time from c. Every call must return a limiter with no state for any key
// (for a shared store: a fresh key prefix), so that keys used by one
// subtest never see admissions of another, or of an earlier test run.
type NewWindowFunc func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Limiter

// step is one decision of a table: at T0+at, AllowN(key, n) must return
// the Decision described. n == 0 means 1.
type step struct {
	at         time.Duration
	key        string // appended to the table's key; "" is the table's key
	n          int
	allowed    bool
	remaining  int
	retryAfter time.Duration
	resetAfter time.Duration
}

type windowTable struct {
	name  string
	rate  throttle.Rate
	steps []step
}

const ms = time.Millisecond

// windowTables are the sliding-window rules as step tables. Instants are
// whole microseconds, the precision of the Redis windows.
var windowTables = []windowTable{
	{
		name: "admits up to Count then rejects",
		rate: throttle.Rate{Count: 3, Per: time.Second},
		steps: []step{
			{at: 0, allowed: true, remaining: 2, resetAfter: time.Second},
			{at: 0, allowed: true, remaining: 1, resetAfter: time.Second},
			{at: 0, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 0, allowed: false, remaining: 0, retryAfter: time.Second, resetAfter: time.Second},
			{at: 500 * ms, allowed: false, remaining: 0, retryAfter: 500 * ms, resetAfter: 500 * ms},
			{at: time.Second, allowed: true, remaining: 2, resetAfter: time.Second},
		},
	},
	{
		// An admission at t counts during [t, t+Per).
		name: "boundary",
		rate: throttle.Rate{Count: 3, Per: time.Second},
		steps: []step{
			{at: 0, allowed: true, remaining: 2, resetAfter: time.Second},
			{at: 100 * ms, allowed: true, remaining: 1, resetAfter: time.Second},
			{at: 200 * ms, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 300 * ms, allowed: false, remaining: 0, retryAfter: 700 * ms, resetAfter: 900 * ms},
			{at: 999 * ms, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 201 * ms},
			{at: 999*ms + 500*time.Microsecond, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 201 * ms},
			{at: time.Second, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: time.Second, allowed: false, remaining: 0, retryAfter: 100 * ms, resetAfter: time.Second},
			{at: 1099 * ms, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 901 * ms},
			{at: 1100 * ms, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 1199*ms + 999*time.Microsecond, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 901 * ms},
			{at: 1200 * ms, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 1999*ms + 999*time.Microsecond, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 201 * ms},
			{at: 2000 * ms, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 4000 * ms, allowed: true, remaining: 2, resetAfter: time.Second},
		},
	},
	{
		// RetryAfter waits for the k-th oldest unit, k = count + n - Count.
		name: "cost n > 1",
		rate: throttle.Rate{Count: 5, Per: time.Second},
		steps: []step{
			{at: 0, n: 2, allowed: true, remaining: 3, resetAfter: time.Second},
			{at: 100 * ms, n: 2, allowed: true, remaining: 1, resetAfter: time.Second},
			{at: 200 * ms, n: 2, allowed: false, remaining: 1, retryAfter: 800 * ms, resetAfter: 900 * ms},
			{at: 200 * ms, n: 1, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 300 * ms, n: 3, allowed: false, remaining: 0, retryAfter: 800 * ms, resetAfter: 900 * ms},
			{at: 300 * ms, n: 5, allowed: false, remaining: 0, retryAfter: 900 * ms, resetAfter: 900 * ms},
			{at: time.Second, n: 3, allowed: false, remaining: 2, retryAfter: 100 * ms, resetAfter: 200 * ms},
			{at: time.Second, n: 2, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 2 * time.Second, n: 5, allowed: true, remaining: 0, resetAfter: time.Second},
		},
	},
	{
		name: "ResetAfter follows the newest admission",
		rate: throttle.Rate{Count: 3, Per: time.Second},
		steps: []step{
			{at: 0, allowed: true, remaining: 2, resetAfter: time.Second},
			{at: 400 * ms, allowed: true, remaining: 1, resetAfter: time.Second},
			{at: 600 * ms, n: 2, allowed: false, remaining: 1, retryAfter: 400 * ms, resetAfter: 800 * ms},
			{at: time.Second, n: 2, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 1300 * ms, allowed: false, remaining: 0, retryAfter: 100 * ms, resetAfter: 700 * ms},
		},
	},
	{
		name: "keys are independent",
		rate: throttle.Rate{Count: 1, Per: time.Second},
		steps: []step{
			{at: 0, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 0, key: "/b", allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 0, allowed: false, remaining: 0, retryAfter: time.Second, resetAfter: time.Second},
			{at: 500 * ms, key: "/c", allowed: true, remaining: 0, resetAfter: time.Second},
			{at: 500 * ms, key: "/b", allowed: false, remaining: 0, retryAfter: 500 * ms, resetAfter: 500 * ms},
			{at: time.Second, allowed: true, remaining: 0, resetAfter: time.Second},
			{at: time.Second, key: "/b", allowed: true, remaining: 0, resetAfter: time.Second},
			{at: time.Second, key: "/c", allowed: false, remaining: 0, retryAfter: 500 * ms, resetAfter: 500 * ms},
		},
	},
	{
		name: "sub-second window 5/250ms",
		rate: throttle.Rate{Count: 5, Per: 250 * ms},
		steps: []step{
			{at: 0, allowed: true, remaining: 4, resetAfter: 250 * ms},
			{at: 10 * ms, n: 4, allowed: true, remaining: 0, resetAfter: 250 * ms},
			{at: 10 * ms, allowed: false, remaining: 0, retryAfter: 240 * ms, resetAfter: 250 * ms},
			{at: 249 * ms, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 11 * ms},
			{at: 250 * ms, allowed: true, remaining: 0, resetAfter: 250 * ms},
			{at: 259 * ms, n: 2, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 241 * ms},
			{at: 260 * ms, n: 4, allowed: true, remaining: 0, resetAfter: 250 * ms},
			{at: 510 * ms, n: 5, allowed: true, remaining: 0, resetAfter: 250 * ms},
		},
	},
	{
		// Durations are rounded up to the millisecond, never down.
		name: "window with a sub-millisecond part 2/1000.5ms",
		rate: throttle.Rate{Count: 2, Per: time.Second + 500*time.Microsecond},
		steps: []step{
			{at: 0, allowed: true, remaining: 1, resetAfter: 1001 * ms},
			{at: 0, allowed: true, remaining: 0, resetAfter: 1001 * ms},
			{at: 0, allowed: false, remaining: 0, retryAfter: 1001 * ms, resetAfter: 1001 * ms},
			{at: time.Second, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 1 * ms},
			{at: time.Second + 499*time.Microsecond, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 1 * ms},
			{at: time.Second + 500*time.Microsecond, allowed: true, remaining: 1, resetAfter: 1001 * ms},
		},
	},
}

// RunWindow runs the sliding-window conformance suite against the limiters
// newLimiter returns. See the package documentation for the rules it
// checks. Each subtest uses a fresh limiter, a fresh Clock starting at T0
// and keys of its own.
func RunWindow(t *testing.T, newLimiter NewWindowFunc) {
	t.Helper()
	for _, tc := range windowTables {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(T0)
			runSteps(t, newLimiter(t, tc.rate, clock), clock, "window/"+tc.name, tc.rate.Count, tc.steps)
		})
	}
	t.Run("RetryAfter is exact", func(t *testing.T) { testRetryAfterExact(t, newLimiter) })
	t.Run("rejected attempts never count", func(t *testing.T) { testRejectedNeverCount(t, newLimiter) })
	t.Run("bad cost", func(t *testing.T) { testBadCost(t, newLimiter) })
	t.Run("clock going backwards", func(t *testing.T) { testClockBackwards(t, newLimiter) })
	t.Run("odd keys", func(t *testing.T) { testOddKeys(t, newLimiter) })
}

// retryAfterDeltas are the irregular gaps, in µs and ms, between the
// requests of the RetryAfter-is-exact tests.
var retryAfterDeltas = []time.Duration{0, 3 * time.Microsecond, 137250 * time.Microsecond, time.Microsecond,
	401999 * time.Microsecond, 50 * ms, 0, 999 * time.Microsecond, 333333 * time.Microsecond}

// presentAndRetry presents 60 requests through allow (which decides at
// T0+at), spaced by retryAfterDeltas with costs in turn; after each rejection it
// checks that RetryAfter-1ms later is still too early and that exactly
// RetryAfter later is admitted. At least 10 rejections must happen.
func presentAndRetry(t *testing.T, allow func(at time.Duration, n int) throttle.Decision, costs []int) {
	t.Helper()
	at := time.Duration(0)
	rejections := 0
	for i := 0; i < 60; i++ {
		at += retryAfterDeltas[i%len(retryAfterDeltas)]
		n := costs[i%len(costs)]
		d := allow(at, n)
		if d.Allowed {
			continue
		}
		rejections++
		ra := d.RetryAfter
		if ra > time.Millisecond {
			if early := allow(at+ra-time.Millisecond, n); early.Allowed {
				t.Fatalf("at %v, n %d: RetryAfter %v, but admitted 1ms earlier", at, n, ra)
			}
		}
		at += ra
		if late := allow(at, n); !late.Allowed {
			t.Fatalf("at %v, n %d: rejected exactly RetryAfter %v later: %s", at-ra, n, ra, fmtDecision(late))
		}
	}
	if rejections < 10 {
		t.Fatalf("only %d rejections: the schedule does not exercise RetryAfter", rejections)
	}
}

// runSteps runs steps against l on key, moving clock to each step's
// instant, and fails t at the first Decision that differs from the step.
func runSteps(t *testing.T, l throttle.Limiter, clock *Clock, key string, limit int, steps []step) {
	t.Helper()
	for i, s := range steps {
		clock.Set(T0.Add(s.at))
		n := max(s.n, 1)
		got, err := l.AllowN(context.Background(), key+s.key, n)
		if err != nil {
			t.Fatalf("step %d (at %v, key %q, n %d): %v", i, s.at, s.key, n, err)
		}
		want := throttle.Decision{
			Allowed:    s.allowed,
			Limit:      limit,
			Remaining:  s.remaining,
			RetryAfter: s.retryAfter,
			ResetAfter: s.resetAfter,
		}
		if !sameDecision(got, want) {
			t.Fatalf("step %d (at %v, key %q, n %d):\n got  %s\n want %s", i, s.at, s.key, n, fmtDecision(got), fmtDecision(want))
		}
	}
}

// sameDecision compares everything but Source.
func sameDecision(got, want throttle.Decision) bool {
	got.Source, want.Source = 0, 0
	return got == want
}

func fmtDecision(d throttle.Decision) string {
	return fmt.Sprintf("{Allowed:%v Limit:%d Remaining:%d RetryAfter:%v ResetAfter:%v}",
		d.Allowed, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter)
}

// checkInvariants checks what every Decision must satisfy.
func checkInvariants(t *testing.T, what string, d throttle.Decision, r throttle.Rate) {
	t.Helper()
	switch {
	case d.Limit != r.Count:
		t.Fatalf("%s: Limit = %d, want %d", what, d.Limit, r.Count)
	case d.Remaining < 0 || d.Remaining > r.Count:
		t.Fatalf("%s: Remaining = %d, outside [0, %d]", what, d.Remaining, r.Count)
	case d.Allowed && d.RetryAfter != 0:
		t.Fatalf("%s: admitted with RetryAfter %v", what, d.RetryAfter)
	case !d.Allowed && d.RetryAfter <= 0:
		t.Fatalf("%s: rejected with RetryAfter %v, want > 0", what, d.RetryAfter)
	case d.RetryAfter%time.Millisecond != 0 || d.ResetAfter%time.Millisecond != 0:
		t.Fatalf("%s: RetryAfter %v or ResetAfter %v not whole milliseconds", what, d.RetryAfter, d.ResetAfter)
	case d.ResetAfter < 0 || d.ResetAfter > throttle.CeilMillisecond(r.Per):
		t.Fatalf("%s: ResetAfter %v outside [0, %v]", what, d.ResetAfter, throttle.CeilMillisecond(r.Per))
	case !d.Allowed && d.RetryAfter > throttle.CeilMillisecond(r.Per+time.Microsecond):
		// A clock reading between two µs decides on a window one µs
		// longer, so that rounding never over-admits in real time.
		t.Fatalf("%s: RetryAfter %v > Per %v (+1µs)", what, d.RetryAfter, r.Per)
	}
}

// Admitted is an admission of N units at At (an offset from a test's
// start), for CheckWindow.
type Admitted struct {
	At time.Duration
	N  int
}

// CheckWindow fails t if some Per-long span [x, x+Per) holds more than
// Count units of adm, which is in order of At.
func CheckWindow(t testing.TB, adm []Admitted, r throttle.Rate) {
	t.Helper()
	for i, a := range adm {
		units := 0
		for _, b := range adm[i:] {
			if b.At < a.At+r.Per {
				units += b.N
			}
		}
		if units > r.Count {
			t.Fatalf("%d units admitted in [%v, %v), limit %v", units, a.At, a.At+r.Per, r)
		}
	}
}

// testRetryAfterExact presents requests at irregular instants; after each
// rejection it checks that RetryAfter-1ms later is still too early and that
// exactly RetryAfter later is admitted.
func testRetryAfterExact(t *testing.T, newLimiter NewWindowFunc) {
	r := throttle.Rate{Count: 4, Per: time.Second}
	clock := NewClock(T0)
	l := newLimiter(t, r, clock)
	const key = "retry-after-exact"
	costs := []int{1, 2, 1, 1, 3, 1, 2}
	var adm []Admitted
	allow := func(at time.Duration, n int) throttle.Decision {
		t.Helper()
		clock.Set(T0.Add(at))
		d, err := l.AllowN(context.Background(), key, n)
		if err != nil {
			t.Fatalf("at %v, n %d: %v", at, n, err)
		}
		checkInvariants(t, fmt.Sprintf("at %v, n %d", at, n), d, r)
		if d.Allowed {
			adm = append(adm, Admitted{at, n})
		}
		return d
	}
	presentAndRetry(t, allow, costs)
	CheckWindow(t, adm, r)
}

// testRejectedNeverCount retries every millisecond: rejected attempts must
// not push admissions back, so admissions come exactly at the limit's rate.
func testRejectedNeverCount(t *testing.T, newLimiter NewWindowFunc) {
	r := throttle.Rate{Count: 3, Per: time.Second}
	clock := NewClock(T0)
	l := newLimiter(t, r, clock)
	var got []time.Duration
	for at := time.Duration(0); at < 2500*ms; at += ms {
		clock.Set(T0.Add(at))
		d, err := l.AllowN(context.Background(), "retry-every-ms", 1)
		if err != nil {
			t.Fatalf("at %v: %v", at, err)
		}
		if d.Allowed {
			got = append(got, at)
		}
	}
	want := []time.Duration{0, 1 * ms, 2 * ms, 1000 * ms, 1001 * ms, 1002 * ms, 2000 * ms, 2001 * ms, 2002 * ms}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("admitted at %v, want %v", got, want)
	}
}

// testBadCost checks that n < 1 and n > Count are errors wrapping
// throttle.ErrInvalidCost that admit nothing.
func testBadCost(t *testing.T, newLimiter NewWindowFunc) {
	checkBadCost(t, newLimiter(t, throttle.Rate{Count: 3, Per: time.Second}, NewClock(T0)))
}

// checkBadCost checks that n < 1 and n > 3, the most l admits at once, are
// errors wrapping throttle.ErrInvalidCost that admit and charge nothing.
func checkBadCost(t *testing.T, l throttle.Limiter) {
	t.Helper()
	ctx := context.Background()
	for _, n := range []int{0, -1, -1 << 62, 4, 1 << 40} {
		d, err := l.AllowN(ctx, "bad-cost", n)
		if !errors.Is(err, throttle.ErrInvalidCost) {
			t.Fatalf("AllowN(n=%d) error = %v, want one wrapping throttle.ErrInvalidCost", n, err)
		}
		if d.Allowed {
			t.Fatalf("AllowN(n=%d) admitted with an error", n)
		}
	}
	d, err := l.AllowN(ctx, "bad-cost", 3)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("AllowN(n=3) after bad costs = %s, %v; want admitted with Remaining 0 (bad costs charge nothing)", fmtDecision(d), err)
	}
}

// testClockBackwards moves the clock back: stored time must never move
// backwards, so an admission made while the clock is behind counts as made
// at the newest instant seen.
func testClockBackwards(t *testing.T, newLimiter NewWindowFunc) {
	r := throttle.Rate{Count: 2, Per: time.Second}
	clock := NewClock(T0)
	l := newLimiter(t, r, clock)
	const key = "backwards"
	allow := func(at time.Duration) throttle.Decision {
		t.Helper()
		clock.Set(T0.Add(at))
		d, err := l.AllowN(context.Background(), key, 1)
		if err != nil {
			t.Fatalf("at %v: %v", at, err)
		}
		checkInvariants(t, fmt.Sprintf("at %v", at), d, r)
		return d
	}
	if d := allow(time.Second); !d.Allowed {
		t.Fatalf("at 1s: rejected: %s", fmtDecision(d))
	}
	if d := allow(500 * ms); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("at 500ms (clock went back): %s, want admitted with Remaining 0", fmtDecision(d))
	}
	if d := allow(0); d.Allowed {
		t.Fatalf("at 0 (clock further back): admitted a third in one window")
	}
	if d := allow(1999 * ms); d.Allowed {
		t.Fatal("at 1999ms: admitted, so the admission made at 500ms was stored in the past")
	}
	if d := allow(2 * time.Second); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("at 2s: %s, want admitted with Remaining 1", fmtDecision(d))
	}
}

// OddKeys are keys a limiter must accept and keep apart: empty, braces and
// colons (which a Redis key scheme may use), escapes of each other, binary
// bytes, and long keys.
func OddKeys() []string {
	long := strings.Repeat("k", 10<<10)
	sum := sha256.Sum256([]byte(long))
	return []string{
		"", "{", "}", ":", "{}", "a}b{c", "%", "%25", "%7B", "%7D", "%E", "%H",
		"\x00", "\x00\xff", "\xff", " ", "a:b", "a", "A",
		long, long[:len(long)-1] + "l", long + "{",
		hex.EncodeToString(sum[:]), "%H" + hex.EncodeToString(sum[:]), "%h" + hex.EncodeToString(sum[:]),
		strings.Repeat("{", 300), strings.Repeat("%7B", 100),
	}
}

// testOddKeys admits one unit on each of OddKeys, then a second, then
// expects a rejection: any two keys sharing state would show up as a
// Remaining of 0 on a first admission.
func testOddKeys(t *testing.T, newLimiter NewWindowFunc) {
	r := throttle.Rate{Count: 2, Per: time.Second}
	l := newLimiter(t, r, NewClock(T0))
	checkKeysApart(t, l, []throttle.Decision{
		{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Second},
		{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: time.Second},
		{Allowed: false, Limit: 2, Remaining: 0, RetryAfter: time.Second, ResetAfter: time.Second},
	})
}

// checkKeysApart decides once on each of OddKeys per round and expects
// the round's Decision for every key.
func checkKeysApart(t *testing.T, l throttle.Limiter, rounds []throttle.Decision) {
	t.Helper()
	ctx := context.Background()
	keys := OddKeys()
	for round, want := range rounds {
		for i, k := range keys {
			d, err := l.AllowN(ctx, k, 1)
			if err != nil {
				t.Fatalf("round %d, key #%d %.40q (len %d): %v", round, i, k, len(k), err)
			}
			if !sameDecision(d, want) {
				t.Fatalf("round %d, key #%d %.40q (len %d):\n got  %s\n want %s (keys share state?)", round, i, k, len(k), fmtDecision(d), fmtDecision(want))
			}
		}
	}
}
