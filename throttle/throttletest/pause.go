package throttletest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// NewPauserFunc returns the limiter under test, enforcing r (token
// buckets: with a burst of r.Count) and reading time from c, with no
// state for any key. For a limiter kept in a store it also returns peer, a
// second limiter over the same store and keys, as another process would
// have; nil otherwise.
type NewPauserFunc func(t *testing.T, r throttle.Rate, c throttle.Clock) (l, peer throttle.Pauser)

// peeker is the Peek of window.Memory and window.Redis.
type peeker interface {
	Peek(ctx context.Context, key string, n int) (throttle.Decision, error)
}

// resetter is the Reset of window.Memory and window.Redis.
type resetter interface {
	Reset(ctx context.Context, key string) error
}

// RunPause checks Pause (throttle.Pauser) with the Clock at fixed
// instants, each subtest on a fresh limiter, for windows and token buckets
// alike (4 per 10 s, so that the refill during a pause of 1 s brings less
// than a token):
//
//   - while paused, AllowN (any cost), AllowID and Peek (when the limiter
//     has them) are rejections with Remaining 0, RetryAfter the time left
//     of the pause (rounded up to the millisecond, at most 1 ms more; for
//     a cost that will not fit when the pause ends, at least that),
//     ResetAfter at least as long, and Reserved false;
//   - they charge and reserve nothing: once the pause ends, what the
//     limiter held before it is admitted, and no more;
//   - a longer pause extends the one in force, a shorter one never
//     shortens it;
//   - other keys are not paused;
//   - d <= 0 is an error wrapping throttle.ErrInvalidOption whose
//     *throttle.OptionError names the field "d", and pauses nothing;
//   - Reset (when the limiter has it) ends a pause;
//   - with a peer, a pause made by one limiter holds in the other.
func RunPause(t *testing.T, newLimiter NewPauserFunc) {
	t.Helper()
	ctx := context.Background()
	r := throttle.Rate{Count: 4, Per: 10 * time.Second}
	t.Run("every decision rejected, nothing charged", func(t *testing.T) {
		clock := NewClock(T0)
		l, _ := newLimiter(t, r, clock)
		mustAdmit(t, "before the pause", l, "k", 1)
		if err := l.Pause(ctx, "k", time.Second); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		for _, at := range []time.Duration{0, 300 * ms, 999 * ms} {
			clock.Set(T0.Add(at))
			left := time.Second - at
			for n := 1; n <= r.Count; n++ {
				d, err := l.AllowN(ctx, "k", n)
				if n == r.Count {
					// Does not fit when the pause ends: a bucket's
					// RetryAfter is then the refill's wait, longer.
					d.RetryAfter = min(d.RetryAfter, left)
				}
				checkPaused(t, fmt.Sprintf("AllowN(%d) at %v", n, at), d, err, left)
				if p, ok := l.(peeker); ok {
					pd, err := p.Peek(ctx, "k", n)
					if n == r.Count {
						pd.RetryAfter = min(pd.RetryAfter, left)
					}
					checkPaused(t, fmt.Sprintf("Peek(%d) at %v", n, at), pd, err, left)
					pd.Source, d.Source = 0, 0
					if pd != d {
						t.Fatalf("at %v: Peek %s, AllowN %s: Peek must say what AllowN says", at, fmtDecision(pd), fmtDecision(d))
					}
				}
			}
			if il, ok := l.(throttle.IDLimiter); ok {
				d, err := il.AllowID(ctx, "k", 1, fmt.Sprint("id-", at), time.Minute)
				checkPaused(t, fmt.Sprintf("AllowID at %v", at), d, err, left)
			}
		}
		// The pause ended: the 3 units left before it, and no more.
		clock.Set(T0.Add(time.Second))
		for i := range r.Count - 1 {
			mustAdmit(t, fmt.Sprintf("after the pause, %d", i+1), l, "k", 1)
		}
		if d, err := l.AllowN(ctx, "k", 1); err != nil || d.Allowed {
			t.Fatalf("after the pause, 4th: %s, %v; want a rejection (the pause charged nothing, and gave nothing)", fmtDecision(d), err)
		}
	})
	t.Run("longer extends, shorter never shortens", func(t *testing.T) {
		clock := NewClock(T0)
		l, _ := newLimiter(t, r, clock)
		pause := func(d time.Duration) {
			t.Helper()
			if err := l.Pause(ctx, "k", d); err != nil {
				t.Fatalf("Pause(%v): %v", d, err)
			}
		}
		pause(10 * time.Second)
		clock.Set(T0.Add(2 * time.Second))
		pause(time.Second)
		d, err := l.AllowN(ctx, "k", 1)
		checkPaused(t, "after a shorter pause", d, err, 8*time.Second)
		pause(20 * time.Second)
		d, err = l.AllowN(ctx, "k", 1)
		checkPaused(t, "after a longer pause", d, err, 20*time.Second)
		clock.Set(T0.Add(21 * time.Second))
		d, err = l.AllowN(ctx, "k", 1)
		checkPaused(t, "at 21s", d, err, time.Second)
		clock.Set(T0.Add(22 * time.Second))
		mustAdmit(t, "at 22s", l, "k", 1)
	})
	t.Run("other keys", func(t *testing.T) {
		clock := NewClock(T0)
		l, _ := newLimiter(t, r, clock)
		if err := l.Pause(ctx, "a", time.Minute); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"b", "", "a:pause", "{a}"} {
			mustAdmit(t, fmt.Sprintf("key %q", k), l, k, 1)
		}
	})
	t.Run("bad duration", func(t *testing.T) {
		l, _ := newLimiter(t, r, NewClock(T0))
		for _, d := range []time.Duration{0, -time.Second} {
			err := l.Pause(ctx, "k", d)
			var oe *throttle.OptionError
			if !errors.Is(err, throttle.ErrInvalidOption) || !errors.As(err, &oe) || oe.Field != "d" {
				t.Fatalf("Pause(%v) = %v; want an error wrapping throttle.ErrInvalidOption naming the field \"d\"", d, err)
			}
		}
		mustAdmit(t, "after refused pauses", l, "k", 1)
	})
	t.Run("Reset ends a pause", func(t *testing.T) {
		l, _ := newLimiter(t, r, NewClock(T0))
		rs, ok := l.(resetter)
		if !ok {
			t.Skip("the limiter has no Reset")
		}
		if err := l.Pause(ctx, "k", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := rs.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		mustAdmit(t, "after Reset", l, "k", 1)
	})
	t.Run("seen by every process", func(t *testing.T) {
		clock := NewClock(T0)
		l, peer := newLimiter(t, r, clock)
		if peer == nil {
			t.Skip("the limiter shares no store")
		}
		if err := l.Pause(ctx, "k", 5*time.Second); err != nil {
			t.Fatal(err)
		}
		clock.Set(T0.Add(time.Second))
		d, err := peer.AllowN(ctx, "k", 1)
		checkPaused(t, "the peer's AllowN", d, err, 4*time.Second)
		// And the peer's longer pause reaches back.
		if err := peer.Pause(ctx, "k", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		clock.Set(T0.Add(6 * time.Second))
		d, err = l.AllowN(ctx, "k", 1)
		checkPaused(t, "AllowN after the peer's longer pause", d, err, 25*time.Second)
	})
}

// checkPaused fails t unless d, err is the decision of a key paused for
// left more.
func checkPaused(t *testing.T, what string, d throttle.Decision, err error, left time.Duration) {
	t.Helper()
	switch {
	case err != nil:
		t.Fatalf("%s: %v", what, err)
	case d.Allowed || d.Reserved || d.Remaining != 0:
		t.Fatalf("%s: %s (Reserved %v); want a paused rejection: Remaining 0, nothing reserved", what, fmtDecision(d), d.Reserved)
	case d.RetryAfter < left || d.RetryAfter > left+time.Millisecond:
		t.Fatalf("%s: RetryAfter %v; want the %v left of the pause", what, d.RetryAfter, left)
	case d.ResetAfter < left:
		t.Fatalf("%s: ResetAfter %v; want at least the %v left of the pause", what, d.ResetAfter, left)
	}
}

func mustAdmit(t *testing.T, what string, l throttle.Limiter, key string, n int) {
	t.Helper()
	d, err := l.AllowN(context.Background(), key, n)
	if err != nil || !d.Allowed {
		t.Fatalf("%s: %s, %v; want admitted", what, fmtDecision(d), err)
	}
}
