package window

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// fits reports, by brute force, whether n more units at s keep every
// window [x, x+window) within limit.
func fits(es []entry, s int64, n, limit int, window int64) bool {
	for x := s - window + 1; x <= s; x++ {
		units := n
		for _, e := range es {
			if e.at >= x && e.at < x+window {
				units += e.n
			}
		}
		if units > limit {
			return false
		}
	}
	return true
}

// TestFirstFitIsTheEarliestFit compares firstFit with a brute-force scan
// on small random schedules (a window of 10 µs).
func TestFirstFitIsTheEarliestFit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const window, limit = 10, 4
	for round := range 3000 {
		// A valid schedule: entries placed where they fit.
		var es []entry
		for range rng.IntN(12) {
			at, n := rng.Int64N(50), 1+rng.IntN(3)
			if fits(es, at, n, limit, window) {
				l := windowLog{es: es}
				l.insert(entry{at: at, n: n})
				es = l.es
			}
		}
		now, n := rng.Int64N(30), 1+rng.IntN(limit)
		want := int64(-1)
		for s := now; s < now+200; s++ {
			if fits(es, s, n, limit, window) {
				want = s
				break
			}
		}
		const far = 1 << 40
		if got := firstFit(es, now, now+200, far, n, limit, window); got != want {
			t.Fatalf("round %d: firstFit(now %d, n %d) over %v = %d, want %d", round, now, n, es, got, want)
		}
	}
}

// TestMemoryAndRedisDecideAlike replays random requests, with ids reused,
// costs 1-3, horizons and late or early claims, on window.Memory and
// window.Redis at the same instants: every decision must be the same, and
// the admissions (each at the instant it was decided) must never put more
// than Count units in any window.
func TestMemoryAndRedisDecideAlike(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 5, Per: time.Second}
	// In seeds 5, 30 and 31 a claim re-reserves later while a slot-search
	// hint is stored: the instants its units left must be searched again
	// (window.lua's vacated), or a later search skips a gap that Memory
	// finds; in seeds 57 and 123, up to a whole window after them.
	//
	// With quiet gaps, about one step in 40 comes after 11 s of nothing:
	// longer than the window and the late-claim grace, so window.lua drops
	// an id's admitted units with their window until a reservation is made
	// again.
	for _, gaps := range []bool{false, true} {
		for _, seed := range []uint64{0, 1, 2, 3, 5, 30, 31, 57, 123} {
			name := fmt.Sprint("seed ", seed)
			if gaps {
				name += " with quiet gaps"
			}
			t.Run(name, func(t *testing.T) { replayOnMemoryAndRedis(t, client, r, seed, gaps) })
		}
	}
}

// replayOnMemoryAndRedis is one replay of TestMemoryAndRedisDecideAlike.
func replayOnMemoryAndRedis(t *testing.T, client redis.Scripter, r throttle.Rate, seed uint64, gaps bool) {
	rng := rand.New(rand.NewPCG(seed, 7))
	quiet := rand.New(rand.NewPCG(seed, 8)) // apart from rng: the same requests with gaps or without
	mem, red, clock := newTwins(t, client, r)
	ctx := context.Background()
	var adm []throttletest.Admitted
	at := time.Duration(0)
	costs := map[string]int{}
	admittedAt := map[string]time.Duration{} // ids admitted, and when they were charged
	reserved := map[string]bool{}
	var pending []string // reserved ids, in order
	var reservations, claims int
	for i := range 400 {
		at += time.Duration(rng.IntN(400_000)) * time.Microsecond
		if gaps && quiet.IntN(40) == 0 {
			at += 11 * time.Second
		}
		clock.Set(throttletest.T0.Add(at))
		id := fmt.Sprint("job-", rng.IntN(60))
		if len(pending) > 0 && rng.IntN(2) == 0 {
			id = pending[rng.IntN(len(pending))] // a reserved one comes back, early, on time or late
		}
		if _, ok := costs[id]; !ok {
			costs[id] = 1 + rng.IntN(3)
		}
		n := costs[id]
		horizon := []time.Duration{0, 2 * time.Second, 5 * time.Second}[rng.IntN(3)]
		var dm, dr throttle.Decision
		var errM, errR error
		anonymous := rng.IntN(5) == 0
		if anonymous {
			dm, errM = mem.AllowN(ctx, "k", n)
			dr, errR = red.AllowN(ctx, "k", n)
		} else {
			dm, errM = mem.AllowID(ctx, "k", n, id, horizon)
			dr, errR = red.AllowID(ctx, "k", n, id, horizon)
		}
		if errM != nil || errR != nil {
			t.Fatalf("step %d: errors %v, %v", i, errM, errR)
		}
		dm.Source, dr.Source = 0, 0
		if dm != dr {
			t.Fatalf("step %d at %v (id %s, n %d, horizon %v):\n memory %+v\n redis  %+v", i, at, id, n, horizon, dm, dr)
		}
		switch {
		case dm.Reserved:
			reservations++
			if !reserved[id] {
				reserved[id] = true
				pending = append(pending, id)
			}
		case dm.Allowed && !anonymous && reserved[id]:
			claims++
			delete(reserved, id)
			pending = slices.DeleteFunc(pending, func(p string) bool { return p == id })
		}
		if last, ok := admittedAt[id]; dm.Allowed && (anonymous || !ok || at >= last+r.Per) {
			// Charged (an id still counted is admitted again for free).
			adm = append(adm, throttletest.Admitted{At: at, N: n})
			if !anonymous {
				admittedAt[id] = at
			}
		}
	}
	if reservations < 30 || claims < 20 {
		t.Fatalf("only %d reservations and %d claims: the replay does not exercise them", reservations, claims)
	}
	throttletest.CheckWindow(t, adm, r)
}

// TestSubMicrosecondReadings: two admissions whose clock readings round to
// whole microseconds exactly Per apart, but lie less than Per apart in
// real time, must not both be admitted (the worker's count found 101 in a
// second at a limit of 100 that way).
func TestSubMicrosecondReadings(t *testing.T) {
	r := throttle.Rate{Count: 1, Per: time.Second}
	client := redistest.Shared(t).Client(t)
	clock := throttletest.NewClock(throttletest.T0)
	mem, err := NewMemory(r, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	limiters := map[string]throttle.Limiter{"memory": mem, "redis": newTestRedis(t, client, r, WithClock(clock))}
	for name, l := range limiters {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			steps := []struct {
				at      time.Duration
				allowed bool
			}{
				{900 * time.Nanosecond, true},
				{time.Second + 100*time.Nanosecond, false},        // 999,999.2 µs later
				{time.Second + time.Microsecond + 900, true},      // 1,000,001 µs later
				{2*time.Second + time.Microsecond + 500, false},   // 999,999.6 µs later
				{2*time.Second + 3*time.Microsecond, true},        // 1,000,001.1 µs later
				{3*time.Second + 2*time.Microsecond + 999, false}, // 999,999.999 µs later
			}
			for i, s := range steps {
				clock.Set(throttletest.T0.Add(s.at))
				d, err := l.AllowN(ctx, "sub-µs", 1)
				if err != nil || d.Allowed != s.allowed {
					t.Fatalf("step %d at %v: %+v, %v; want allowed %v", i, s.at, d, err, s.allowed)
				}
			}
		})
	}
}

// TestSweepKeepsLateReservations: Memory's sweep of idle keys does not
// forget a key whose unclaimed reservations left their window but can
// still be claimed late (they reach the late slots only at the next
// decision): both late claims keep their priority, as in window.lua.
func TestSweepKeepsLateReservations(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 1, Per: time.Second}
	mem, red, clock := newTwins(t, client, r)
	ctx := context.Background()
	step := func(at time.Duration, id string) {
		t.Helper()
		clock.Set(throttletest.T0.Add(at))
		dm, errM := mem.AllowID(ctx, "k", 1, id, 5*time.Second)
		dr, errR := red.AllowID(ctx, "k", 1, id, 5*time.Second)
		dm.Source, dr.Source = 0, 0
		if errM != nil || errR != nil || dm != dr {
			t.Fatalf("at %v, id %s:\n memory %+v, %v\n redis  %+v, %v", at, id, dm, errM, dr, errR)
		}
	}
	step(0, "x")                     // admitted
	step(0, "y")                     // reserved at 1 s
	step(0, "w")                     // reserved at 2 s
	step(3500*time.Millisecond, "z") // admitted; the sweep runs first
	step(3500*time.Millisecond, "w") // a late claim: reserved again at 4.5 s
	step(3500*time.Millisecond, "y") // a late claim, ahead of w's: 4.5 s as well, not behind as a newcomer
}

// TestBackfillFarAhead: a small request takes the earliest gap of the
// schedule however far ahead it lies, in Memory and in window.lua alike
// (a gap was looked for only within 16 windows, so a request of cost 1
// arriving with a gap 18 s ahead took the tail at 20 s). At 2/1s, all at
// one instant: a admitted, b1..b(k-1) (cost 2) reserved at 1..k-1 s, c
// (cost 1) at k s, d (cost 2) at k+1 s; then e (cost 1) fits beside c at
// k s, and f (cost 1) at the tail, k+2 s. k = 15, 16 and 17 put the gap
// around the end of window.lua's first 16-window step of the search.
func TestBackfillFarAhead(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 2, Per: time.Second}
	for _, k := range []int{3, 15, 16, 17, 18, 40} {
		t.Run(fmt.Sprintf("gap at %d s", k), func(t *testing.T) {
			mem, red, clock := newTwins(t, client, r)
			clock.Set(throttletest.T0)
			key := fmt.Sprint("backfill-", k)
			type step struct {
				id   string
				n    int
				slot time.Duration // 0: admitted now
			}
			steps := []step{{"a", 2, 0}}
			for i := 1; i < k; i++ {
				steps = append(steps, step{fmt.Sprint("b", i), 2, time.Duration(i) * time.Second})
			}
			at := time.Duration(k) * time.Second
			steps = append(steps, step{"c", 1, at}, step{"d", 2, at + time.Second}, step{"e", 1, at}, step{"f", 1, at + 2*time.Second})
			for _, l := range []throttle.IDLimiter{mem, red} {
				for _, s := range steps {
					d, err := l.AllowID(context.Background(), key, s.n, s.id, time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					if s.slot == 0 && !d.Allowed || s.slot > 0 && (!d.Reserved || d.RetryAfter != s.slot) {
						t.Fatalf("%T: %s (cost %d): %+v; want its slot at %v", l, s.id, s.n, d, s.slot)
					}
				}
			}
		})
	}
}
