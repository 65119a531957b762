package throttletest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// NewBucketFunc returns the token bucket under test, refilling r.Count
// tokens per r.Per up to burst, starting full, and reading time from c.
// Every call must return a limiter with no state for any key (for a shared
// store: a fresh key prefix).
type NewBucketFunc func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.Limiter

type bucketTable struct {
	name  string
	rate  throttle.Rate
	burst int
	steps []step
}

// bucketTables are the token-bucket rules as step tables. The expected
// values are exact: tokens = min(burst, tokens + elapsed × Count/Per);
// RetryAfter = (n - tokens) / rate and ResetAfter = (burst - tokens) /
// rate, both rounded up to the millisecond.
var bucketTables = []bucketTable{
	{
		// 10/1s: a token every 100ms.
		name:  "burst then refill",
		rate:  throttle.Rate{Count: 10, Per: time.Second},
		burst: 3,
		steps: []step{
			{at: 0, allowed: true, remaining: 2, resetAfter: 100 * ms},
			{at: 0, allowed: true, remaining: 1, resetAfter: 200 * ms},
			{at: 0, allowed: true, remaining: 0, resetAfter: 300 * ms},
			{at: 0, allowed: false, remaining: 0, retryAfter: 100 * ms, resetAfter: 300 * ms},
			{at: 50 * ms, allowed: false, remaining: 0, retryAfter: 50 * ms, resetAfter: 250 * ms},
			{at: 99 * ms, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 201 * ms},
			{at: 100 * ms, allowed: true, remaining: 0, resetAfter: 300 * ms},
			{at: 250 * ms, allowed: true, remaining: 0, resetAfter: 250 * ms}, // half a token left
			{at: 300 * ms, allowed: true, remaining: 0, resetAfter: 300 * ms}, // exactly one more by 300ms
			{at: time.Second, allowed: true, remaining: 2, resetAfter: 100 * ms},
		},
	},
	{
		// 5/2s: a token every 400ms; the waits are fractions of a second
		// and must not come back as 0.
		name:  "fractional waits 5/2s",
		rate:  throttle.Rate{Count: 5, Per: 2 * time.Second},
		burst: 1,
		steps: []step{
			{at: 0, allowed: true, remaining: 0, resetAfter: 400 * ms},
			{at: 0, allowed: false, remaining: 0, retryAfter: 400 * ms, resetAfter: 400 * ms},
			{at: 150 * ms, allowed: false, remaining: 0, retryAfter: 250 * ms, resetAfter: 250 * ms},
			{at: 399 * ms, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 1 * ms},
			{at: 399*ms + 500*time.Microsecond, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 1 * ms},
			{at: 400 * ms, allowed: true, remaining: 0, resetAfter: 400 * ms},
			{at: 400 * ms, allowed: false, remaining: 0, retryAfter: 400 * ms, resetAfter: 400 * ms},
			{at: 1200 * ms, allowed: true, remaining: 0, resetAfter: 400 * ms},
		},
	},
	{
		// 3/1s: a token every 333.333...ms; waits round up, never down.
		name:  "fractional waits 3/1s",
		rate:  throttle.Rate{Count: 3, Per: time.Second},
		burst: 1,
		steps: []step{
			{at: 0, allowed: true, remaining: 0, resetAfter: 334 * ms},
			{at: 0, allowed: false, remaining: 0, retryAfter: 334 * ms, resetAfter: 334 * ms},
			{at: 333 * ms, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 1 * ms},
			{at: 333333 * time.Microsecond, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 1 * ms},
			{at: 333334 * time.Microsecond, allowed: true, remaining: 0, resetAfter: 334 * ms},
			// The bucket was full (capped at 1 token) at 333334µs, so the
			// next token comes at 333334µs + 333333.3µs = 666667.3µs.
			{at: 666667 * time.Microsecond, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 1 * ms},
			{at: 666668 * time.Microsecond, allowed: true, remaining: 0, resetAfter: 334 * ms},
			{at: 666668 * time.Microsecond, allowed: false, remaining: 0, retryAfter: 334 * ms, resetAfter: 334 * ms},
		},
	},
	{
		// 10/100ms: a token every 10ms.
		name:  "sub-second refill 10/100ms",
		rate:  throttle.Rate{Count: 10, Per: 100 * ms},
		burst: 5,
		steps: []step{
			{at: 0, n: 5, allowed: true, remaining: 0, resetAfter: 50 * ms},
			{at: 0, allowed: false, remaining: 0, retryAfter: 10 * ms, resetAfter: 50 * ms},
			{at: 10 * ms, allowed: true, remaining: 0, resetAfter: 50 * ms},
			{at: 25 * ms, allowed: true, remaining: 0, resetAfter: 45 * ms},
			{at: 25 * ms, n: 2, allowed: false, remaining: 0, retryAfter: 15 * ms, resetAfter: 45 * ms},
			{at: 40 * ms, n: 2, allowed: true, remaining: 0, resetAfter: 50 * ms},
			{at: 40*ms + 500*time.Microsecond, allowed: false, remaining: 0, retryAfter: 10 * ms, resetAfter: 50 * ms},
			{at: 90 * ms, allowed: true, remaining: 4, resetAfter: 10 * ms},
		},
	},
	{
		// 2 per 1000.5ms: a token every 500.25ms.
		name:  "period with a sub-millisecond part 2/1000.5ms",
		rate:  throttle.Rate{Count: 2, Per: time.Second + 500*time.Microsecond},
		burst: 2,
		steps: []step{
			{at: 0, allowed: true, remaining: 1, resetAfter: 501 * ms},
			{at: 0, allowed: true, remaining: 0, resetAfter: 1001 * ms},
			{at: 0, allowed: false, remaining: 0, retryAfter: 501 * ms, resetAfter: 1001 * ms},
			{at: 500 * ms, allowed: false, remaining: 0, retryAfter: 1 * ms, resetAfter: 501 * ms},
			{at: 500250 * time.Microsecond, allowed: true, remaining: 0, resetAfter: 1001 * ms},
		},
	},
	{
		name:  "long idle caps at burst",
		rate:  throttle.Rate{Count: 1, Per: time.Second},
		burst: 3,
		steps: []step{
			{at: 0, n: 3, allowed: true, remaining: 0, resetAfter: 3 * time.Second},
			{at: time.Hour, allowed: true, remaining: 2, resetAfter: time.Second},
			{at: time.Hour, n: 3, allowed: false, remaining: 2, retryAfter: time.Second, resetAfter: time.Second},
			{at: time.Hour, n: 2, allowed: true, remaining: 0, resetAfter: 3 * time.Second},
			{at: 25 * time.Hour, n: 3, allowed: true, remaining: 0, resetAfter: 3 * time.Second},
			{at: 25 * time.Hour, allowed: false, remaining: 0, retryAfter: time.Second, resetAfter: 3 * time.Second},
		},
	},
	{
		// 4/1s: a token every 250ms.
		name:  "cost n > 1",
		rate:  throttle.Rate{Count: 4, Per: time.Second},
		burst: 10,
		steps: []step{
			{at: 0, n: 4, allowed: true, remaining: 6, resetAfter: time.Second},
			{at: 0, n: 4, allowed: true, remaining: 2, resetAfter: 2 * time.Second},
			{at: 0, n: 4, allowed: false, remaining: 2, retryAfter: 500 * ms, resetAfter: 2 * time.Second},
			{at: 100 * ms, n: 4, allowed: false, remaining: 2, retryAfter: 400 * ms, resetAfter: 1900 * ms},
			{at: 100 * ms, n: 2, allowed: true, remaining: 0, resetAfter: 2400 * ms},
			{at: 500 * ms, n: 10, allowed: false, remaining: 2, retryAfter: 2 * time.Second, resetAfter: 2 * time.Second},
			{at: 2500 * ms, n: 10, allowed: true, remaining: 0, resetAfter: 2500 * ms},
		},
	},
	{
		name:  "keys are independent",
		rate:  throttle.Rate{Count: 1, Per: time.Second},
		burst: 1,
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
}

// RunBucket runs the token-bucket conformance suite against the limiters
// newLimiter returns. Each subtest uses a fresh limiter, a fresh Clock
// starting at T0 and keys of its own. It checks, at fixed instants:
//
//   - a full bucket admits burst, then refills at Count per Per;
//   - RetryAfter = (n - tokens) / rate and ResetAfter = (burst - tokens) /
//     rate, rounded up to the millisecond, with fractional waits kept (5
//     per 2s waits 400ms, not 0); RetryAfter-1ms later is still too early
//     and exactly RetryAfter later is admitted;
//   - rejected attempts neither take tokens nor move the refill timeline:
//     a client retrying every millisecond is admitted at the refill rate;
//   - refills below a second and periods with a sub-millisecond part;
//   - a long idle caps the bucket at burst;
//   - costs n > 1; n < 1 or n > burst is an error wrapping
//     throttle.ErrInvalidCost that takes nothing;
//   - keys are independent, including [OddKeys];
//   - a clock going backwards counts as no time passing and never moves
//     stored time backwards.
func RunBucket(t *testing.T, newLimiter NewBucketFunc) {
	t.Helper()
	for _, tc := range bucketTables {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(T0)
			runSteps(t, newLimiter(t, tc.rate, tc.burst, clock), clock, "bucket/"+tc.name, tc.rate.Count, tc.steps)
		})
	}
	t.Run("retrying faster than the refill", func(t *testing.T) { testBucketRetryFaster(t, newLimiter) })
	t.Run("RetryAfter is exact", func(t *testing.T) { testBucketRetryAfterExact(t, newLimiter) })
	t.Run("bad cost", func(t *testing.T) { testBucketBadCost(t, newLimiter) })
	t.Run("clock going backwards", func(t *testing.T) { testBucketClockBackwards(t, newLimiter) })
	t.Run("odd keys", func(t *testing.T) { testBucketOddKeys(t, newLimiter) })
}

// checkBucketInvariants checks what every bucket Decision must satisfy.
func checkBucketInvariants(t *testing.T, what string, d throttle.Decision, r throttle.Rate, burst int) {
	t.Helper()
	// From empty to full: burst tokens at Count per Per, rounded up.
	fill := throttle.CeilMillisecond(time.Duration(burst)*r.Per/time.Duration(r.Count) + time.Millisecond)
	switch {
	case d.Limit != r.Count:
		t.Fatalf("%s: Limit = %d, want %d", what, d.Limit, r.Count)
	case d.Remaining < 0 || d.Remaining > burst:
		t.Fatalf("%s: Remaining = %d, outside [0, %d]", what, d.Remaining, burst)
	case d.Allowed && d.RetryAfter != 0:
		t.Fatalf("%s: admitted with RetryAfter %v", what, d.RetryAfter)
	case !d.Allowed && d.RetryAfter <= 0:
		t.Fatalf("%s: rejected with RetryAfter %v, want > 0", what, d.RetryAfter)
	case d.RetryAfter%time.Millisecond != 0 || d.ResetAfter%time.Millisecond != 0:
		t.Fatalf("%s: RetryAfter %v or ResetAfter %v not whole milliseconds", what, d.RetryAfter, d.ResetAfter)
	case d.ResetAfter < 0 || d.ResetAfter > fill || d.RetryAfter > fill:
		t.Fatalf("%s: RetryAfter %v or ResetAfter %v beyond the time to fill from empty %v", what, d.RetryAfter, d.ResetAfter, fill)
	case d.Allowed && d.Remaining < burst && d.ResetAfter == 0:
		t.Fatalf("%s: Remaining %d < burst %d with ResetAfter 0", what, d.Remaining, burst)
	}
}

// testBucketRetryFaster retries every millisecond: rejected attempts must
// not push the refill back, so after the burst, admissions come exactly
// every token period.
func testBucketRetryFaster(t *testing.T, newLimiter NewBucketFunc) {
	r := throttle.Rate{Count: 10, Per: time.Second}
	clock := NewClock(T0)
	l := newLimiter(t, r, 2, clock)
	var got []time.Duration
	for at := time.Duration(0); at < time.Second; at += ms {
		clock.Set(T0.Add(at))
		d, err := l.AllowN(context.Background(), "retry-every-ms", 1)
		if err != nil {
			t.Fatalf("at %v: %v", at, err)
		}
		checkBucketInvariants(t, fmt.Sprintf("at %v", at), d, r, 2)
		if d.Allowed {
			got = append(got, at)
		}
	}
	// Two at once from the burst (the second at 1ms), then one per 100ms:
	// the 10 µs refilled by 1ms count towards the token at 100ms.
	want := []time.Duration{0, 1 * ms, 100 * ms, 200 * ms, 300 * ms, 400 * ms, 500 * ms, 600 * ms, 700 * ms, 800 * ms, 900 * ms}
	if !slices.Equal(got, want) {
		t.Fatalf("admitted at %v, want %v", got, want)
	}
}

// testBucketRetryAfterExact presents requests at irregular instants and
// costs; after each rejection it checks that RetryAfter-1ms later is still
// too early and that exactly RetryAfter later is admitted.
func testBucketRetryAfterExact(t *testing.T, newLimiter NewBucketFunc) {
	r := throttle.Rate{Count: 7, Per: 3 * time.Second}
	const burst = 4
	clock := NewClock(T0)
	l := newLimiter(t, r, burst, clock)
	const key = "retry-after-exact"
	costs := []int{1, 2, 1, 1, 3, 1, 2, 4}
	allow := func(at time.Duration, n int) throttle.Decision {
		t.Helper()
		clock.Set(T0.Add(at))
		d, err := l.AllowN(context.Background(), key, n)
		if err != nil {
			t.Fatalf("at %v, n %d: %v", at, n, err)
		}
		checkBucketInvariants(t, fmt.Sprintf("at %v, n %d", at, n), d, r, burst)
		return d
	}
	presentAndRetry(t, allow, costs)
}

// testBucketBadCost checks that n < 1 and n > burst are errors wrapping
// throttle.ErrInvalidCost that take nothing.
func testBucketBadCost(t *testing.T, newLimiter NewBucketFunc) {
	checkBadCost(t, newLimiter(t, throttle.Rate{Count: 1, Per: time.Second}, 3, NewClock(T0)))
}

// testBucketClockBackwards moves the clock back: that must count as no
// time passing (no negative refill), and stored time must not move back
// (no refill counted twice).
func testBucketClockBackwards(t *testing.T, newLimiter NewBucketFunc) {
	r := throttle.Rate{Count: 1, Per: time.Second}
	clock := NewClock(T0)
	l := newLimiter(t, r, 2, clock)
	const key = "backwards"
	steps := []step{
		{at: 10 * time.Second, allowed: true, remaining: 1, resetAfter: time.Second},
		{at: 9 * time.Second, allowed: true, remaining: 0, resetAfter: 2 * time.Second}, // back 1s: no time passed
		{at: 0, allowed: false, remaining: 0, retryAfter: time.Second, resetAfter: 2 * time.Second},
		{at: 10500 * ms, allowed: false, remaining: 0, retryAfter: 500 * ms, resetAfter: 1500 * ms}, // refill from 10s, not 9s
		{at: 11 * time.Second, allowed: true, remaining: 0, resetAfter: 2 * time.Second},
	}
	runSteps(t, l, clock, key, r.Count, steps)
}

// testBucketOddKeys takes one token from each of OddKeys, then a second,
// then expects a rejection: any two keys sharing state would show up as a
// Remaining of 0 on a first admission.
func testBucketOddKeys(t *testing.T, newLimiter NewBucketFunc) {
	r := throttle.Rate{Count: 1, Per: time.Second}
	l := newLimiter(t, r, 2, NewClock(T0))
	checkKeysApart(t, l, []throttle.Decision{
		{Allowed: true, Limit: 1, Remaining: 1, ResetAfter: time.Second},
		{Allowed: true, Limit: 1, Remaining: 0, ResetAfter: 2 * time.Second},
		{Allowed: false, Limit: 1, Remaining: 0, RetryAfter: time.Second, ResetAfter: 2 * time.Second},
	})
}

// CheckBucketAdmissions fails t if the admissions prove that a token
// bucket refilling r.Count per r.Per up to burst admitted more than it
// can: in any span of length d, at most burst + d × Count/Per units.
//
// As with [CheckTimedAdmissions], true admission instants are only known to
// lie in [Sent, Returned], so the check is conservative: for each
// admission a taken as the earliest sent, the units with Sent >= a.Sent
// and Returned <= a.Sent + span certainly fell within a span of that
// length, and must not exceed burst + span × Count/Per (+ slack of refill
// for the limiter's own clock precision).
func CheckBucketAdmissions(t testing.TB, adm []TimedAdmission, r throttle.Rate, burst int, span, slack time.Duration) {
	t.Helper()
	adm = slices.Clone(adm)
	slices.SortFunc(adm, func(a, b TimedAdmission) int { return a.Sent.Compare(b.Sent) })
	limit := burst + int(int64(span+slack)*int64(r.Count)/int64(r.Per))
	for i, a := range adm {
		end := a.Sent.Add(span)
		units := 0
		for _, b := range adm[i:] {
			if !b.Returned.After(end) {
				units += max(b.N, 1)
			}
		}
		if units > limit {
			t.Fatalf("%d units admitted between %v and %v (%v): more than burst %d + refill at %v = %d",
				units, a.Sent.Format(time.StampMicro), end.Format(time.StampMicro), span, burst, r, limit)
		}
	}
}

// RunBucketRealTime runs a short token-bucket suite against a limiter on
// its own clock (the system clock, or the Redis server's TIME), with real
// sleeps of a few hundred milliseconds. Assertions hold whatever the
// scheduling delays; a scenario too slow to assert anything is retried on
// a fresh key.
func RunBucketRealTime(t *testing.T, newLimiter func(t *testing.T, r throttle.Rate, burst int) throttle.Limiter) {
	t.Helper()
	t.Run("drain, wait RetryAfter, refill", func(t *testing.T) { testBucketRealDrain(t, newLimiter) })
	t.Run("retrying every millisecond", func(t *testing.T) { testBucketRealRetry(t, newLimiter) })
}

func testBucketRealDrain(t *testing.T, newLimiter func(t *testing.T, r throttle.Rate, burst int) throttle.Limiter) {
	// 10 per 200ms: a token every 20ms.
	r := throttle.Rate{Count: 10, Per: 200 * time.Millisecond}
	const burst = 10
	l := newLimiter(t, r, burst)
	ctx := context.Background()
	allow := func(key string) throttle.Decision {
		t.Helper()
		d, err := l.AllowN(ctx, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		checkBucketInvariants(t, key, d, r, burst)
		return d
	}
	for attempt := 0; attempt < 5; attempt++ {
		key := fmt.Sprintf("real-drain-%d", attempt)
		start := time.Now()
		for i := 0; i < burst; i++ {
			if d := allow(key); !d.Allowed {
				t.Fatalf("call %d of %d on a fresh key rejected: %s", i+1, burst, fmtDecision(d))
			}
		}
		d := allow(key)
		if took := time.Since(start); took >= 20*time.Millisecond {
			t.Logf("attempt %d took %v, longer than a token period; retrying", attempt, took)
			continue
		}
		if d.Allowed || d.Remaining != 0 || d.RetryAfter > 20*time.Millisecond {
			t.Fatalf("call %d within a token period: %s, want rejected with Remaining 0 and RetryAfter <= 20ms", burst+1, fmtDecision(d))
		}
		time.Sleep(d.RetryAfter)
		if d := allow(key); !d.Allowed {
			t.Fatalf("rejected after sleeping RetryAfter: %s", fmtDecision(d))
		}
		// Full again after a whole period.
		time.Sleep(r.Per + 5*time.Millisecond)
		if d := allow(key); !d.Allowed || d.Remaining != burst-1 {
			t.Fatalf("a period after draining: %s, want admitted with Remaining %d", fmtDecision(d), burst-1)
		}
		return
	}
	t.Skip("the machine was too slow to drain a bucket within a token period in 5 attempts")
}

func testBucketRealRetry(t *testing.T, newLimiter func(t *testing.T, r throttle.Rate, burst int) throttle.Limiter) {
	// 10 per 200ms, burst 2: a token every 20ms.
	r := throttle.Rate{Count: 10, Per: 200 * time.Millisecond}
	const burst = 2
	l := newLimiter(t, r, burst)
	ctx := context.Background()
	var adm []TimedAdmission
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		sent := time.Now()
		d, err := l.AllowN(ctx, "real-retry", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			adm = append(adm, TimedAdmission{Sent: sent, Returned: time.Now()})
		}
		time.Sleep(time.Millisecond)
	}
	for _, span := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		CheckBucketAdmissions(t, adm, r, burst, span, time.Millisecond)
	}
	// 2 + 25 in 500ms if nothing stalls; rejected retries must not starve
	// the client, so well over half of that must get through.
	if len(adm) < 12 {
		t.Fatalf("%d admissions in 500ms at %v burst %d while retrying every millisecond, want >= 12", len(adm), r, burst)
	}
}
