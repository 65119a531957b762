package window

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/coalesce"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestBatchDecidesAsOneByOne sends random batches (AllowN, AllowID with ids
// reused or new, some twice in one batch, Peek, costs 1-3, horizons, two
// keys; half of them without Peek and small, as the script's fast path
// takes them) as coalesced flushes of
// window.Redis, and the same requests one after another to window.Memory
// at the same instant: every decision must be the same. So a batch
// decides exactly as its requests made one by one at the flush instant.
func TestBatchDecidesAsOneByOne(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 6, Per: time.Second}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			mem, red, clock := newTwins(t, client, r)
			var err error
			ctx := context.Background()
			costs := map[string]int{}
			kinds := map[string]int{}
			at := time.Duration(0)
			fastLike, twice := 0, 0 // batches the fast path may take; new ids twice in one
			for step := range 250 {
				small := rng.IntN(2) == 0
				k := 1 + rng.IntN(12)
				gap := 300_000
				if small {
					k, gap = 1+rng.IntN(4), 1_500_000 // room for all of them, often
				}
				at += time.Duration(rng.IntN(gap)) * time.Microsecond
				clock.Set(throttletest.T0.Add(at))
				calls := make([]*call, k)
				want := make([]throttle.Decision, k)
				fresh := map[string]int{} // new ids of this batch, and how often
				for i := range calls {
					key := []string{"a", "b"}[rng.IntN(2)]
					id := fmt.Sprint("job-", rng.IntN(40))
					if small && rng.IntN(2) == 0 {
						id = fmt.Sprint("new-", step, "-", rng.IntN(3))
						fresh[id]++
					}
					if _, ok := costs[id]; !ok {
						costs[id] = 1 + rng.IntN(3)
					}
					n := costs[id]
					horizon := []time.Duration{0, 2 * time.Second, 5 * time.Second}[rng.IntN(3)]
					var req request
					kind := rng.IntN(6)
					if small && kind == 1 {
						kind = 0 // no Peek
					}
					switch kind {
					case 0:
						want[i], err = mem.AllowN(ctx, key, n)
						if err == nil {
							req, err = red.request(key, n, "", argAllowN)
						}
					case 1:
						want[i], err = mem.Peek(ctx, key, n)
						if err == nil {
							req, err = red.request(key, n, "", argPeek)
						}
					default:
						want[i], err = mem.AllowID(ctx, key, n, id, horizon)
						if err == nil {
							req, err = red.request(key, n, id, strconv.FormatInt(horizonMicros(horizon), 10))
						}
					}
					if err != nil {
						t.Fatal(err)
					}
					kinds[[]string{"AllowN", "Peek", "AllowID", "AllowID", "AllowID", "AllowID"}[kind]]++
					calls[i] = &call{Req: req}
				}
				red.many(ctx, calls)
				allowed := 0
				for _, d := range want {
					if d.Allowed {
						allowed++
					}
				}
				if small && allowed == k {
					fastLike++
				}
				for _, times := range fresh {
					if times > 1 {
						twice++
					}
				}
				for i, c := range calls {
					if c.Err != nil {
						t.Fatalf("step %d, request %d: %v", step, i, c.Err)
					}
					got := c.Res
					got.Source, want[i].Source = 0, 0
					if got != want[i] {
						t.Fatalf("step %d at %v, request %d of %d (%+v):\n one by one %+v\n batched    %+v", step, at, i, k, c.Req, want[i], got)
					}
				}
			}
			if kinds["AllowN"] < 50 || kinds["Peek"] < 50 || fastLike < 20 || twice < 10 {
				t.Fatalf("kinds %v, %d small batches all admitted, %d new ids twice in a batch: the replay does not exercise every kind", kinds, fastLike, twice)
			}
		})
	}
}

// TestCoalescedLoad puts 500 goroutines on one key at once, beside two
// CPU-bound goroutines: no call may fail, exactly Count are admitted, and
// Redis runs far fewer script calls than there are decisions. The
// limiter's timeout is the tests' generous one: whether the default 50 ms
// suffices is a matter of speed, measured by BenchmarkCoalescedLoad.
func TestCoalescedLoad(t *testing.T) {
	srv := redistest.Shared(t)
	client := srv.Client(t)
	r := throttle.Rate{Count: 100, Per: time.Minute}
	l := newTestRedis(t, client, r)
	ctx := context.Background()
	// Warm, as a running service is: the script loaded, a connection open.
	if _, err := l.Allow(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	calls0 := redistest.ScriptCalls(t, client)

	const goroutines = 500
	admitted := throttletest.Burst(t, l, "hot", goroutines)
	if admitted != r.Count {
		t.Fatalf("%d admitted of %d at a limit of %v, want exactly %d", admitted, goroutines, r, r.Count)
	}
	scripts := redistest.ScriptCalls(t, client) - calls0
	if scripts > goroutines/4 {
		t.Fatalf("%d script calls for %d decisions: not coalesced", scripts, goroutines)
	}
	t.Logf("%d decisions in %d script calls", goroutines, scripts)
}

// TestQueuedCallerWithdraws: a caller whose context ends while its request
// is queued behind a flush gets its context's error and is charged
// nothing.
func TestQueuedCallerWithdraws(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	r := throttle.Rate{Count: 10, Per: time.Minute}
	l := newTestRedis(t, client, r, WithTimeout(2*time.Second))
	ctx := context.Background()
	if _, err := l.Allow(ctx, "k"); err != nil { // loads the script
		t.Fatal(err)
	}
	// A paused server holds the flushes in flight; the next caller queues.
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	for range coalesce.MaxInFlight {
		held.Add(1)
		go func() { defer held.Done(); _, _ = l.Allow(ctx, "k") }()
	}
	waitInFlight(t, l, coalesce.MaxInFlight)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := l.Allow(short, "k")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued Allow = %v, want context.DeadlineExceeded", err)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	held.Wait()
	d, err := l.Peek(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if used := r.Count - d.Remaining - 1; used != 1+coalesce.MaxInFlight { // Peek's Remaining counts its own unit
		t.Fatalf("%d units used, want %d: the withdrawn caller was charged", used, 1+coalesce.MaxInFlight)
	}
}

// waitInFlight waits until l has n flushes in flight.
func waitInFlight(t *testing.T, l *Redis, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); l.batch.InFlight() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d flushes in flight after 5s, want %d", l.batch.InFlight(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPoisonKeyFailsAlone sends flushes whose keys include one holding a
// string (another program's key under the prefix): that key's requests
// get Redis's error, every other key's are decided as if it were not
// there, and charged once.
func TestPoisonKeyFailsAlone(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 3, Per: time.Minute}
	l := newTestRedis(t, client, r)
	ctx := context.Background()
	if err := client.Set(ctx, l.key("poison"), "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "poison", "b", "poison", "c"}
	for round := range 5 {
		calls := make([]*call, len(keys))
		for i, key := range keys {
			req, err := l.request(key, 1, "", argAllowN)
			if err != nil {
				t.Fatal(err)
			}
			calls[i] = &call{Req: req}
		}
		l.many(ctx, calls)
		for i, c := range calls {
			switch {
			case keys[i] == "poison":
				if c.Err == nil || !strings.Contains(c.Err.Error(), "WRONGTYPE") {
					t.Fatalf("round %d: poison key: %+v, %v; want its WRONGTYPE error", round, c.Res, c.Err)
				}
			case c.Err != nil || c.Res.Allowed != (round < r.Count):
				t.Fatalf("round %d, key %q: %+v, %v; want allowed %v", round, keys[i], c.Res, c.Err, round < r.Count)
			}
		}
	}
	for _, key := range []string{"a", "b", "c"} {
		if n := client.ZCard(ctx, l.key(key)).Val(); n != int64(r.Count) {
			t.Errorf("key %q holds %d units, want %d", key, n, r.Count)
		}
	}
}

// TestKeyTwiceInAFlush sends one flush holding a key under two quotas (it
// changed while the requests were queued) beside another key: the
// requests of the second quota see what the first wrote, the reservation
// included, as one by one.
func TestKeyTwiceInAFlush(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	var limit atomic.Int64
	limit.Store(1)
	quotas := func(string) throttle.Quota {
		return throttle.Quota{Rate: throttle.Rate{Count: int(limit.Load()), Per: time.Second}}
	}
	l, _ := newClockedRedis(t, client, throttle.Rate{Count: 1, Per: time.Second}, WithQuotas(quotas))
	ctx := context.Background()
	var calls []*call
	add := func(key string, id string) {
		horizon := argAllowN
		if id != "" {
			horizon = strconv.FormatInt(horizonMicros(time.Minute), 10)
		}
		req, err := l.request(key, 1, id, horizon)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, &call{Req: req})
	}
	add("k", "first")  // admitted at a limit of 1
	add("k", "second") // reserved one window later
	limit.Store(5)
	add("k", "") // AllowN at a limit of 5: admitted, reset after the reservation's window
	add("other", "")
	l.many(ctx, calls)
	for i, c := range calls {
		if c.Err != nil {
			t.Fatalf("request %d: %v", i, c.Err)
		}
	}
	if !calls[0].Res.Allowed || !calls[1].Res.Reserved || !calls[2].Res.Allowed {
		t.Fatalf("decisions %+v %+v %+v: want admitted, reserved, admitted", calls[0].Res, calls[1].Res, calls[2].Res)
	}
	if want := calls[1].Res.RetryAfter + time.Second; calls[2].Res.ResetAfter < want {
		t.Fatalf("AllowN after the reservation: ResetAfter %v, want %v (the reservation's window)", calls[2].Res.ResetAfter, want)
	}
}

// TestCompactForm: a flush of keys with AllowN requests of one unit
// under one quota goes in one of window.lua's compact forms ("p": one
// request a key, two arguments; "q": several on a key, 2 + m arguments),
// answered compactly, and decides as the whole form does, also when a key
// in it is not plain and the script hands the rest to its general path: a
// paused key, a full one, one with a reservation, one of another type, one
// whose requests fit only in part, at the first place, in the middle and
// at the last.
func TestCompactForm(t *testing.T) {
	server := redistest.Shared(t)
	client := server.Client(t)
	sent := redistest.CountArgv(client, 2, "p") // the compact calls
	sentGrouped := redistest.CountArgv(client, 2, "q")
	rate := throttle.Rate{Count: 3, Per: time.Minute}
	compact := newTestRedis(t, client, rate)
	whole := newTestRedis(t, server.Client(t), rate)
	whole.wholeArgs = true
	ctx := context.Background()
	for _, l := range []*Redis{compact, whole} {
		for _, step := range []struct {
			key string
			n   int
		}{{"b", 2}, {"d", 3}, {"e", 3}} {
			if d, err := l.AllowN(ctx, step.key, step.n); err != nil || !d.Allowed {
				t.Fatalf("AllowN(%s, %d) = %+v, %v", step.key, step.n, d, err)
			}
		}
		if d, err := l.AllowID(ctx, "e", 1, "job", time.Hour); err != nil || !d.Reserved {
			t.Fatalf("AllowID(e) = %+v, %v; want a reservation", d, err)
		}
		if err := l.Pause(ctx, "c", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := client.Set(ctx, l.key("f"), "not a sorted set", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	batches := [][]string{
		{"a", "b", "c", "d", "e", "f", "g"},
		{"c", "a", "g"},
		{"a", "g", "d"},
		{"h", "i", "b", "j"},
		// The "q" form: several requests on a key.
		{"k", "k", "l", "c", "l", "k"}, // k fits exactly; stops at c (paused)
		{"m", "m", "n", "m", "m"},      // m fits in part (3 of 4): stops at once
		{"n", "n", "d", "n"},           // n fits in part; d is full
		{"o", "o", "f"},                // f is of another type, at the last place
		{"p", "q", "p", "q", "p"},      // every key plain
		{"r", "r", "e"},                // e holds a reservation
		{"s", "t", "t", "u"},           // one request, then two, then one: every key plain
	}
	grouped := 7 // the batches with a key twice
	before, beforeGrouped := sent.Load(), sentGrouped.Load()
	for bi, keys := range batches {
		var got [2][]*call
		for li, l := range []*Redis{compact, whole} {
			for _, key := range keys {
				req, err := l.request(key, 1, "", argAllowN)
				if err != nil {
					t.Fatal(err)
				}
				got[li] = append(got[li], &call{Req: req})
			}
			l.many(ctx, got[li])
		}
		for i, key := range keys {
			c, w := got[0][i], got[1][i]
			if (c.Err == nil) != (w.Err == nil) || (key == "f") != (c.Err != nil) {
				t.Fatalf("batch %d, key %s: compact %v, whole %v", bi, key, c.Err, w.Err)
			}
			if c.Err != nil {
				continue
			}
			if c.Res.Allowed != w.Res.Allowed || c.Res.Remaining != w.Res.Remaining ||
				(c.Res.RetryAfter == 0) != (w.Res.RetryAfter == 0) || c.Res.Reserved != w.Res.Reserved {
				t.Fatalf("batch %d, key %s:\n compact %+v\n whole   %+v", bi, key, c.Res, w.Res)
			}
		}
	}
	if n := sent.Load() - before; n < int64(len(batches)-grouped) {
		t.Fatalf("%d compact calls for %d batches", n, len(batches)-grouped)
	}
	if n := sentGrouped.Load() - beforeGrouped; n < int64(grouped) {
		t.Fatalf("%d calls in the \"q\" form for %d batches", n, grouped)
	}
	for _, key := range []string{"a", "g", "h", "k", "l", "o", "p", "q", "r", "s", "t", "u"} { // admitted in a compact form
		checkExpiry(ctx, t, client, compact.key(key), rate)
	}
}
