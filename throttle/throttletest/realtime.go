package throttletest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// TimedAdmission is an admission observed from outside the limiter: the
// request was sent at Sent and its admitting Decision came back at
// Returned, so the limiter's admission instant lies in [Sent, Returned].
type TimedAdmission struct {
	Sent, Returned time.Time
	N              int // units admitted; 0 means 1
}

// CheckTimedAdmissions fails t if the admissions prove that the limiter
// admitted more than r.Count units within one window r.Per.
//
// The check is sound despite not knowing the true admission instants: a set
// of admissions is a proven violation only if even the most favourable
// instants (each as early or as late as its [Sent, Returned] interval
// allows) leave them inside a span shorter than r.Per - slack. The span of
// a set is at most max(Returned) - min(Sent), so for each admission a taken
// as the earliest sent, the units with Sent >= a.Sent and Returned <
// a.Sent + r.Per - slack must not exceed r.Count. slack covers the
// limiter's own precision (e.g. 1ms for microsecond scores on a clock
// other than the test's).
func CheckTimedAdmissions(t testing.TB, adm []TimedAdmission, r throttle.Rate, slack time.Duration) {
	t.Helper()
	adm = slices.Clone(adm)
	slices.SortFunc(adm, func(a, b TimedAdmission) int { return a.Sent.Compare(b.Sent) })
	for i, a := range adm {
		bound := a.Sent.Add(r.Per - slack)
		units := 0
		for _, b := range adm[i:] {
			if b.Returned.Before(bound) {
				units += max(b.N, 1)
			}
		}
		if units > r.Count {
			t.Fatalf("%d units admitted between %v and %v (%v, less than the window): limit %v",
				units, a.Sent.Format(time.StampMicro), bound.Format(time.StampMicro), r.Per-slack, r)
		}
	}
}

// RunWindowRealTime runs a short sliding-window suite against a limiter on
// its own clock (the system clock, or the Redis server's TIME), with real
// sleeps of a few hundred milliseconds. Assertions hold whatever the
// scheduling delays; a scenario whose timing was too slow to assert
// anything is retried on a fresh key. newLimiter must return a limiter with
// no state for the keys used.
func RunWindowRealTime(t *testing.T, newLimiter func(t *testing.T, r throttle.Rate) throttle.Limiter) {
	t.Helper()
	t.Run("fill, wait RetryAfter, reset", func(t *testing.T) { testRealFill(t, newLimiter) })
	t.Run("retrying every millisecond", func(t *testing.T) { testRealRetry(t, newLimiter) })
}

func testRealFill(t *testing.T, newLimiter func(t *testing.T, r throttle.Rate) throttle.Limiter) {
	r := throttle.Rate{Count: 3, Per: 300 * time.Millisecond}
	l := newLimiter(t, r)
	ctx := context.Background()
	allow := func(key string) (throttle.Decision, time.Time) {
		t.Helper()
		d, err := l.AllowN(ctx, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, key, d, r)
		return d, time.Now()
	}
	for attempt := 0; attempt < 5; attempt++ {
		key := fmt.Sprintf("real-fill-%d", attempt)
		start := time.Now()
		for i := 0; i < r.Count; i++ {
			// At most Count-1 units can be counted before the Count-th call.
			if d, _ := allow(key); !d.Allowed {
				t.Fatalf("call %d of %d on a fresh key rejected: %s", i+1, r.Count, fmtDecision(d))
			}
		}
		d, end := allow(key)
		if end.Sub(start) >= r.Per {
			t.Logf("attempt %d took %v, longer than the window; retrying", attempt, end.Sub(start))
			continue
		}
		if d.Allowed || d.Remaining != 0 {
			t.Fatalf("call %d within %v: %s, want rejected with Remaining 0", r.Count+1, end.Sub(start), fmtDecision(d))
		}
		// RetryAfter is measured from the limiter's instant, which is
		// before end: sleeping it after end is always enough.
		time.Sleep(d.RetryAfter)
		d, last := allow(key)
		if !d.Allowed {
			t.Fatalf("rejected after sleeping RetryAfter: %s", fmtDecision(d))
		}
		// Every admission so far happened before last.
		time.Sleep(time.Until(last.Add(r.Per + time.Millisecond)))
		if d, _ := allow(key); !d.Allowed || d.Remaining != r.Count-1 {
			t.Fatalf("a window after the last admission: %s, want admitted with Remaining %d", fmtDecision(d), r.Count-1)
		}
		return
	}
	t.Skip("the machine was too slow to fill a 300ms window in 5 attempts")
}

func testRealRetry(t *testing.T, newLimiter func(t *testing.T, r throttle.Rate) throttle.Limiter) {
	r := throttle.Rate{Count: 2, Per: 200 * time.Millisecond}
	l := newLimiter(t, r)
	ctx := context.Background()
	var adm []TimedAdmission
	start := time.Now()
	for time.Since(start) < 700*time.Millisecond {
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
	CheckTimedAdmissions(t, adm, r, time.Millisecond)
	// 2 at once, 2 more once they leave the window at about 200ms, 2 more at
	// about 400ms: 4 is a floor that tolerates a stall of a window.
	if len(adm) < 4 {
		t.Fatalf("%d admissions in 700ms at %v while retrying every millisecond, want >= 4", len(adm), r)
	}
}
