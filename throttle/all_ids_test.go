package throttle_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// stacked is All of a tenant's limit and a partner's keyed "global".
func stacked(t *testing.T, tenant, partner throttle.Limiter) throttle.Limiter {
	t.Helper()
	lim, err := throttle.All(throttle.Part{Limiter: tenant}, throttle.Part{Limiter: partner, Key: global})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// slotStep is one AllowID of a stacked limit at T0+at.
type slotStep struct {
	at       time.Duration
	key, id  string
	allowed  bool
	reserved bool
	retry    time.Duration // the rejection's RetryAfter
}

func runSlotSteps(t *testing.T, lim throttle.Limiter, clock *throttletest.Clock, horizon time.Duration, steps []slotStep) {
	t.Helper()
	ids, ok := lim.(throttle.IDLimiter)
	if !ok {
		t.Fatalf("All over SlotLimiters (%T) is not an IDLimiter", lim)
	}
	for i, s := range steps {
		clock.Set(throttletest.T0.Add(s.at))
		d, err := ids.AllowID(context.Background(), s.key, 1, s.id, horizon)
		if err != nil {
			t.Fatalf("step %d (%s %s at %v): %v", i, s.key, s.id, s.at, err)
		}
		if d.Allowed != s.allowed || d.Reserved != s.reserved || (!s.allowed && d.RetryAfter != s.retry) {
			t.Fatalf("step %d (%s %s at %v): %+v; want allowed %v, reserved %v, retry %v", i, s.key, s.id, s.at, d, s.allowed, s.reserved, s.retry)
		}
	}
}

// TestAllReservesOneSlot: a stacked limit with ids reserves a rejected
// request's slot, the latest of its parts', in every part at once (the
// parts with room are not charged now), and admits it in every part when it
// comes back; when a part finds that slot taken, the others move to its
// next one. A tenant window (1/s) under a partner window (10/s, then 1/s),
// for every family.
func TestAllReservesOneSlot(t *testing.T) {
	for _, fam := range allFamilies(t) {
		t.Run(fam.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			partner := fam.window(t, throttle.Rate{Count: 10, Per: time.Second}, clock)
			lim := stacked(t, fam.window(t, throttle.Rate{Count: 1, Per: time.Second}, clock), partner)
			runSlotSteps(t, lim, clock, time.Minute, []slotStep{
				{key: "a", id: "m1", allowed: true},
				{key: "a", id: "m2", reserved: true, retry: time.Second},
				{key: "a", id: "m2", reserved: true, retry: time.Second}, // a redelivery: the same slot
			})
			// The partner holds m1 now and m2 at T0+1s only: 9 more fit
			// now, not 8.
			for i := range 10 {
				d, err := lim.AllowN(context.Background(), "tenant"+string(rune('b'+i)), 1)
				if err != nil || d.Allowed != (i < 9) {
					t.Fatalf("other tenant %d at T0: %+v, %v; the partner must not be charged for m2 before its slot, nor admit beyond 10", i, d, err)
				}
			}
			runSlotSteps(t, lim, clock, time.Minute, []slotStep{
				{at: time.Second, key: "a", id: "m2", allowed: true},
				{at: time.Second, key: "a", id: "m2", allowed: true}, // idempotent
				{at: 1500 * time.Millisecond, key: "a", id: "m3", reserved: true, retry: 500 * time.Millisecond},
			})
		})
	}
}

// TestAllSlotTakenMovesParts: when the partner's earliest slot is later
// than the tenant's, the tenant's reservation moves to it; both come back
// admitted there, and nothing else fits beside them.
func TestAllSlotTakenMovesParts(t *testing.T) {
	for _, fam := range allFamilies(t) {
		t.Run(fam.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			lim := stacked(t, fam.window(t, throttle.Rate{Count: 1, Per: time.Second}, clock), fam.window(t, throttle.Rate{Count: 1, Per: time.Second}, clock))
			runSlotSteps(t, lim, clock, time.Minute, []slotStep{
				{key: "a", id: "m1", allowed: true},
				{key: "b", id: "m2", reserved: true, retry: time.Second},     // the partner's slot; b moves to it
				{key: "a", id: "m3", reserved: true, retry: 2 * time.Second}, // a's slot is taken at the partner
				{at: time.Second, key: "c", id: "m4", reserved: true, retry: 2 * time.Second},
				{at: time.Second, key: "b", id: "m2", allowed: true},
				{at: 2 * time.Second, key: "a", id: "m3", allowed: true},
				{at: 3 * time.Second, key: "c", id: "m4", allowed: true},
			})
		})
	}
}

// TestAllNeverGivesBackAnEarlierAdmission: a part that admitted the id
// before (AlreadyAdmitted: the message ran) keeps that admission when
// another part, which forgot it, rejects the redelivery beyond the
// horizon; what the request itself took is given back.
func TestAllNeverGivesBackAnEarlierAdmission(t *testing.T) {
	for _, fam := range allFamilies(t) {
		t.Run(fam.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			partner := fam.window(t, throttle.Rate{Count: 3, Per: 10 * time.Second}, clock)
			lim := stacked(t, fam.window(t, throttle.Rate{Count: 1, Per: time.Second}, clock), partner)
			runSlotSteps(t, lim, clock, 500*time.Millisecond, []slotStep{
				{key: "a", id: "m", allowed: true},
				{at: 1500 * time.Millisecond, key: "a", id: "x", allowed: true},
				// The tenant forgot m (out of its 1 s window) and is full
				// until T0+2.5s, beyond the 500 ms horizon; the partner
				// still counts m's run at T0.
				{at: 1500 * time.Millisecond, key: "a", id: "m", retry: time.Second},
			})
			peekRemaining(t, "after m's redelivery (m's earlier admission and x held, nothing given back)", partner, "global", 1)
			d, err := lim.(throttle.IDLimiter).AllowID(context.Background(), "a", 1, "x", time.Minute)
			if err != nil || !d.Allowed || !d.AlreadyAdmitted {
				t.Fatalf("x again: %+v, %v; want admitted, AlreadyAdmitted in every part", d, err)
			}
		})
	}
}

// TestAllBeyondHorizonHoldsNothing: a slot beyond the horizon in one part
// leaves nothing held in any: the partner's charge is given back.
func TestAllBeyondHorizonHoldsNothing(t *testing.T) {
	for _, fam := range allFamilies(t) {
		t.Run(fam.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			partner := fam.bucket(t, throttle.Rate{Count: 10, Per: time.Second}, 10, clock)
			lim := stacked(t, fam.window(t, throttle.Rate{Count: 1, Per: 10 * time.Second}, clock), partner)
			runSlotSteps(t, lim, clock, time.Second, []slotStep{
				{key: "a", id: "m1", allowed: true},
				{key: "a", id: "m2", retry: 10 * time.Second},
			})
			peekRemaining(t, "after m2 (m1 only held)", partner, "global", 9)
		})
	}
}

// TestAllBucketPartOpen: a token bucket that will be full again by the
// slot takes nothing ahead of it (that would add to a burst there), and
// the request still has its slot (Reserved): the window keeps it, and
// both admit it then. A bucket in debt reserves the slot.
func TestAllBucketPartOpen(t *testing.T) {
	for _, fam := range allFamilies(t) {
		t.Run(fam.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			partner := fam.bucket(t, throttle.Rate{Count: 10, Per: time.Second}, 10, clock)
			lim := stacked(t, fam.window(t, throttle.Rate{Count: 1, Per: time.Second}, clock), partner)
			runSlotSteps(t, lim, clock, time.Minute, []slotStep{
				{key: "a", id: "m1", allowed: true},
				{key: "a", id: "m2", reserved: true, retry: time.Second}, // open at the bucket
			})
			runSlotSteps(t, lim, clock, time.Minute, []slotStep{
				{key: "a", id: "m3", reserved: true, retry: 2 * time.Second}, // the window kept m2's slot
				{at: time.Second, key: "a", id: "m2", allowed: true},
			})
			// m2 took its token at its slot, from a full bucket: 9 left, not
			// the 10 a token taken at T0 would have left beside it.
			peekRemaining(t, "after m2 at its slot", partner, "global", 9)

			clock.Set(throttletest.T0)
			tight := stacked(t, fam.window(t, throttle.Rate{Count: 10, Per: time.Second}, clock), fam.bucket(t, throttle.Rate{Count: 1, Per: time.Second}, 1, clock))
			runSlotSteps(t, tight, clock, time.Minute, []slotStep{
				{key: "a", id: "m1", allowed: true},
				{key: "b", id: "m2", reserved: true, retry: time.Second},
				{at: time.Second, key: "b", id: "m2", allowed: true},
			})
		})
	}
}

// TestAllGate: a Gate with reservations over All reserves one slot for a
// rejected message; NewGate refuses WithReservations over an All with a
// part that cannot reserve after an instant, naming it.
func TestAllGate(t *testing.T) {
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	lim, err := throttle.All(
		throttle.Part{Limiter: localBucket(t, throttle.Rate{Count: 1, Per: time.Second}, 1, clock), Key: global},
		throttle.Part{Limiter: memoryWindow(t, throttle.Rate{Count: 5, Per: time.Second}, clock)},
	)
	if err != nil {
		t.Fatal(err)
	}
	g, err := throttle.NewGate(lim, throttle.WithReservations(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := g.AdmitID(ctx, "a", 1, "m1"); err != nil || !d.Allowed {
		t.Fatalf("first AdmitID: %+v, %v", d, err)
	}
	if d, err := g.AdmitID(ctx, "a", 1, "m2"); err != nil || d.Allowed || !d.Reserved || d.RetryAfter != time.Second {
		t.Fatalf("second AdmitID: %+v, %v; want a reservation 1s ahead", d, err)
	}
	clock.Advance(time.Second)
	if d, err := g.AdmitID(ctx, "a", 1, "m2"); err != nil || !d.Allowed {
		t.Fatalf("m2 at its slot: %+v, %v", d, err)
	}

	plain := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{Allowed: true}, nil
	})
	mixed, err := throttle.All(throttle.Part{Limiter: memoryWindow(t, throttle.Rate{Count: 5, Per: time.Second}, clock)}, throttle.Part{Limiter: plain})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := mixed.(throttle.IDLimiter); ok {
		t.Fatal("All with a plain part is an IDLimiter")
	}
	if _, err := throttle.NewGate(mixed, throttle.WithReservations(time.Minute)); !errors.Is(err, throttle.ErrInvalidOption) ||
		!strings.Contains(err.Error(), "WithReservations") || !strings.Contains(err.Error(), "parts[1] (throttle.LimiterFunc)") {
		t.Fatalf("NewGate(All(window, LimiterFunc), WithReservations): %v; want an error naming the part", err)
	}
}

// TestAllowIDAfterNegative: every SlotLimiter refuses a negative after,
// naming it, before deciding.
func TestAllowIDAfterNegative(t *testing.T) {
	for _, fam := range allFamilies(t) {
		clock := throttletest.NewClock(throttletest.T0)
		for _, l := range []throttle.Limiter{
			fam.window(t, throttle.Rate{Count: 1, Per: time.Second}, clock),
			fam.bucket(t, throttle.Rate{Count: 1, Per: time.Second}, 1, clock),
		} {
			_, err := l.(throttle.SlotLimiter).AllowIDAfter(context.Background(), "k", 1, "m", time.Second, -time.Millisecond)
			if !errors.Is(err, throttle.ErrInvalidOption) || !strings.Contains(err.Error(), "after") {
				t.Errorf("%s %T: AllowIDAfter(after -1ms): %v; want an ErrInvalidOption naming after", fam.name, l, err)
			}
		}
	}
}

// TestAllReservationsConcurrent: goroutines race messages of three
// tenants (5 per 200 ms each) under a partner (8 per 200 ms) through All
// with reservations, each message presented again at its slot until
// admitted, on the system clock: every message is admitted once, and
// neither a tenant nor the partner admits over its limit in any window
// (counting the admissions whose calls lay wholly inside it).
func TestAllReservationsConcurrent(t *testing.T) {
	per := 200 * time.Millisecond
	for _, fam := range allFamilies(t) {
		t.Run(fam.name, func(t *testing.T) {
			lim := stacked(t, fam.window(t, throttle.Rate{Count: 5, Per: per}, nil), fam.window(t, throttle.Rate{Count: 8, Per: per}, nil))
			ids := lim.(throttle.IDLimiter)
			const goroutines, each = 8, 8
			var mu sync.Mutex
			at := map[string][]span{}
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						tenant := "t" + strconv.Itoa((g+i)%3)
						id := strconv.Itoa(g) + "-" + strconv.Itoa(i)
						for try := 0; ; try++ {
							start := time.Now()
							d, err := ids.AllowID(context.Background(), tenant, 1, id, 10*time.Second)
							if err != nil || try == 10 {
								t.Errorf("%s %s: %+v, %v after %d tries", tenant, id, d, err, try)
								return
							}
							if d.Allowed {
								mu.Lock()
								at[tenant] = append(at[tenant], span{start, time.Now()})
								mu.Unlock()
								break
							}
							time.Sleep(d.RetryAfter)
						}
					}
				}()
			}
			wg.Wait()
			var every []span
			for tenant, ts := range at {
				if n := maxIn(ts, per); n > 5 {
					t.Errorf("%s: %d admissions within %v, want <= 5", tenant, n, per)
				}
				every = append(every, ts...)
			}
			if len(every) != goroutines*each {
				t.Errorf("%d admitted, want %d", len(every), goroutines*each)
			}
			if n := maxIn(every, per); n > 8 {
				t.Errorf("partner: %d admissions within %v, want <= 8", n, per)
			}
		})
	}
}

// span is a call that admitted: its decision's instant lies in [start, end].
type span struct{ start, end time.Time }

// maxIn returns the most admissions certainly within one window of length
// w: whose calls lay wholly inside [s, s+w) for the start s of one of them.
func maxIn(ss []span, w time.Duration) int {
	best := 0
	for _, a := range ss {
		n := 0
		for _, b := range ss {
			if !b.start.Before(a.start) && b.end.Before(a.start.Add(w)) {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

// TestAllPause: pausing All pauses every part at its own key: a partner's
// pause holds back every tenant.
func TestAllPause(t *testing.T) {
	for _, fam := range allFamilies(t) {
		t.Run(fam.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			lim := stacked(t, fam.window(t, throttle.Rate{Count: 10, Per: time.Second}, clock), fam.bucket(t, throttle.Rate{Count: 10, Per: time.Second}, 10, clock))
			if err := lim.(throttle.Pauser).Pause(context.Background(), "a", 2*time.Second); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"a", "b"} {
				d, err := lim.AllowN(context.Background(), key, 1)
				if err != nil || d.Allowed || d.RetryAfter < 2*time.Second {
					t.Fatalf("%s during the pause: %+v, %v; want a rejection for the pause's 2s", key, d, err)
				}
			}
			clock.Advance(2 * time.Second)
			if d, err := lim.AllowN(context.Background(), "b", 1); err != nil || !d.Allowed {
				t.Fatalf("after the pause: %+v, %v", d, err)
			}
		})
	}
}

// TestAllSameLimiterTwice: one limiter twice, asked with the request's key
// both times, is refused (a request would be charged once); with a key of
// its own it is another limit.
func TestAllSameLimiterTwice(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	w := memoryWindow(t, throttle.Rate{Count: 5, Per: time.Second}, clock)
	_, err := throttle.All(throttle.Part{Limiter: w}, throttle.Part{Limiter: w})
	if !errors.Is(err, throttle.ErrInvalidOption) || !strings.Contains(err.Error(), "parts[1]") {
		t.Fatalf("All(w, w): %v; want an error naming parts[1]", err)
	}
	if _, err := throttle.All(throttle.Part{Limiter: w}, throttle.Part{Limiter: w, Key: global}); err != nil {
		t.Fatalf("All(w, w keyed global): %v", err)
	}
}

// slowPart is a SlotLimiter whose store decides each AllowIDAfter a
// latency after the call starts, on a fake clock: a round trip.
type slowPart struct {
	throttle.SlotLimiter
	clock   *throttletest.Clock
	latency time.Duration
}

func (s *slowPart) AllowIDAfter(ctx context.Context, key string, n int, id string, horizon, after time.Duration) (throttle.Decision, error) {
	s.clock.Advance(s.latency)
	return s.SlotLimiter.AllowIDAfter(ctx, key, n, id, horizon, after)
}

func (s *slowPart) Clock() throttle.Clock { return s.clock }

// TestAllKeepsSlotsApartByLatency: a part moved to the latest slot over a
// slow round trip gets one a little later than the others' (the store
// decided after the call started). Back before its slot, the request keeps
// every part's place: the others are early only by that latency, and
// moving them would send them to the tail of a full schedule. Without the
// tolerance, a request back early loses its place (here, by 2 s).
func TestAllKeepsSlotsApartByLatency(t *testing.T) {
	for _, fam := range allFamilies(t) {
		t.Run(fam.name, func(t *testing.T) {
			ctx := context.Background()
			clock := throttletest.NewClock(throttletest.T0)
			tenant := &slowPart{SlotLimiter: fam.window(t, throttle.Rate{Count: 10, Per: time.Second}, clock).(throttle.SlotLimiter), clock: clock}
			partner := fam.window(t, throttle.Rate{Count: 2, Per: time.Second}, clock)
			lim := stacked(t, tenant, partner).(throttle.IDLimiter)
			allow := func(key, id string) throttle.Decision {
				t.Helper()
				d, err := lim.AllowID(ctx, key, 1, id, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			allow("b", "b1") // the partner is full until T0+1s
			allow("b", "b2")
			tenant.latency = 3 * time.Millisecond
			first := allow("a", "m")
			if !first.Reserved || first.RetryAfter < 990*time.Millisecond || first.RetryAfter > 1010*time.Millisecond {
				t.Fatalf("m at T0: %+v; want its slot reserved at about T0+1s", first)
			}
			tenant.latency = 0
			slot := clock.Now().Add(first.RetryAfter)
			for _, id := range []string{"q1", "q2", "q3"} { // the partner's schedule after m is full
				if d := allow("c", id); !d.Reserved {
					t.Fatalf("%s: %+v; want a reservation", id, d)
				}
			}
			clock.Set(slot.Add(-500 * time.Millisecond)) // m back before its slot
			back := allow("a", "m")
			if !back.Reserved || back.RetryAfter > 505*time.Millisecond {
				t.Fatalf("m back 500ms early: %+v; want its slot kept (RetryAfter about 500ms), not a later one", back)
			}
			clock.Set(slot)
			if d := allow("a", "m"); !d.Allowed {
				t.Fatalf("m at its slot: %+v; want admitted", d)
			}
		})
	}
}
