package bucket

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestHybridIsNoIDLimiter(t *testing.T) {
	var l throttle.Limiter = (*Hybrid)(nil)
	if _, ok := l.(throttle.IDLimiter); ok {
		t.Fatal("Hybrid implements throttle.IDLimiter; its doc says it does not")
	}
}

// mustAllowID calls AllowID and checks the outcome.
func mustAllowID(t *testing.T, l throttle.IDLimiter, key, id string, n int, horizon time.Duration, allowed, reserved bool) throttle.Decision {
	t.Helper()
	d, err := l.AllowID(context.Background(), key, n, id, horizon)
	if err != nil {
		t.Fatalf("AllowID(%q, %q): %v", key, id, err)
	}
	if d.Allowed != allowed || d.Reserved != reserved {
		t.Fatalf("AllowID(%q, %q) = %+v, want Allowed %v, Reserved %v", key, id, d, allowed, reserved)
	}
	return d
}

// TestRedisIDKeysExpire checks the layout and the expiry of a key's ids set
// beside its bucket: the bucket expires when it is full again, counting
// the debt of reservations; the ids set when its newest id is forgotten.
func TestRedisIDKeysExpire(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	// 2 per second, burst 2: a token per 500 ms, ids remembered 1 s.
	l, client := newTestRedis(t, throttle.PerSecond(2), 2, WithClock(clock))
	ctx := ctxT(t)
	k := rediskey.Key(l.prefix, "k")
	ids := k + idsSuffix
	pttl := func(key string) time.Duration {
		t.Helper()
		d, err := client.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	within := func(what string, got, want time.Duration) {
		t.Helper()
		// Redis counts real time since the script set the expiry.
		if got > want || got < want-500*time.Millisecond {
			t.Fatalf("PTTL of %s = %v, want %v (less the real time since)", what, got, want)
		}
	}

	mustAllowID(t, l, "k", "a", 1, 5*time.Second, true, false)
	within("bucket", pttl(k), 500*time.Millisecond)
	within("ids", pttl(ids), time.Second)

	mustAllowID(t, l, "k", "b", 1, 5*time.Second, true, false)
	mustAllowID(t, l, "k", "c", 1, 5*time.Second, false, true) // slot +500 ms
	mustAllowID(t, l, "k", "d", 1, 5*time.Second, false, true) // slot +1 s
	within("bucket", pttl(k), 2*time.Second)                   // 2 tokens of debt + 2 to full
	within("ids", pttl(ids), 2*time.Second)                    // d's slot + 1 s

	got, err := client.ZRangeWithScores(ctx, ids, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	t0 := float64(throttletest.T0.UnixMicro())
	want := []redis.Z{{Score: t0, Member: "A:a"}, {Score: t0, Member: "A:b"}, {Score: t0 + 5e5, Member: "R:c"}, {Score: t0 + 1e6, Member: "R:d"}}
	if len(got) != len(want) {
		t.Fatalf("ids set = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ids set = %v, want %v", got, want)
		}
	}
	if credit, _, _, ok := storedBucket(t, client, k); !ok || credit != -2_000_000 {
		t.Fatalf("credit = %d (stored %v); want -2000000 (a debt of two tokens)", credit, ok)
	}

	// Claiming c records it as admitted, remembered until 1.5 s: that does
	// not shorten the ids set's life, which d's slot sets (Redis counts
	// real time, which the fake clock's 500 ms did not take).
	clock.Set(throttletest.T0.Add(500 * time.Millisecond))
	mustAllowID(t, l, "k", "c", 1, 5*time.Second, true, false)
	if s, err := client.ZScore(ctx, ids, "A:c").Result(); err != nil || s != t0+5e5 {
		t.Fatalf("ZSCORE A:c = %v, %v; want the claim's instant %v", s, err, t0+5e5)
	}
	within("ids", pttl(ids), 2*time.Second)
	within("bucket", pttl(k), 2*time.Second) // claims write nothing

	// With the server's TIME, both keys are gone once forgotten: 100 per
	// second, burst 1, so ids are remembered 10 ms.
	fast, _ := newTestRedis(t, throttle.PerSecond(100), 1)
	fk := rediskey.Key(fast.prefix, "k")
	mustAllowID(t, fast, "k", "x", 1, time.Second, true, false)
	mustAllowID(t, fast, "k", "y", 1, time.Second, false, true)
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := client.Exists(ctx, fk, fk+idsSuffix).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the bucket and its ids set still exist after 5 s", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRedisIDStalledAppliesNothingLate presents an id whose first call
// timed out while Redis was stopped: Redis ran the script after the client
// gave up, and it applied nothing, so the id presented again is admitted
// then, charged once (not admitted free on a decision nobody saw, which
// would let a redelivery run at any later instant).
func TestRedisIDStalledAppliesNothingLate(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	l, err := NewRedis(client, throttle.PerSecond(1), 3, WithPrefix(freshPrefix()), WithTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	twin := patient(t, client, l)
	ctx := ctxT(t)
	if _, err := twin.AllowN(ctx, "k", 1); err != nil { // connect, load the script
		t.Fatal(err)
	}
	mustAllowID(t, twin, "k", "warm", 1, 0, true, false) // and the id script
	direct := srv.Client(t)
	scripts := redistest.ScriptCalls(t, direct)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	_, err = l.AllowID(ctx, "k", 1, "m", 0)
	if rerr := srv.Resume(); rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AllowID while Redis is stopped: %v, want a deadline error", err)
	}
	for deadline := time.Now().Add(5 * time.Second); redistest.ScriptCalls(t, direct) < scripts+1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stalled call never ran")
		}
	}
	ids := rediskey.Key(l.prefix, "k") + idsSuffix
	if err := direct.ZScore(ctx, ids, "A:m").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("ZSCORE A:m: %v; want nil: the stalled call admitted m after its caller's deadline", err)
	}
	d := mustAllowID(t, l, "k", "m", 1, 0, true, false)
	if d.Remaining != 0 {
		t.Fatalf("m again: Remaining %d, want 0 (3 tokens, 3 admissions: charged once)", d.Remaining)
	}
	if d, err := l.AllowN(ctx, "k", 1); err != nil || d.Allowed {
		t.Fatalf("AllowN after m: %+v, %v; want rejected", d, err)
	}
}

// TestIDConcurrency has many goroutines take ids from one key, claiming
// their reservations when due and re-presenting admitted ids: the distinct
// ids admitted never exceed burst + rate × elapsed.
func TestIDConcurrency(t *testing.T) {
	const (
		burst   = 20
		perSec  = 100
		workers = 16
		run     = 400 * time.Millisecond
		horizon = 100 * time.Millisecond
	)
	r := throttle.PerSecond(perSec)
	local, err := NewLocal(r, burst)
	if err != nil {
		t.Fatal(err)
	}
	red, _ := newTestRedis(t, r, burst, WithTimeout(5*time.Second))
	for _, tc := range []struct {
		name string
		l    throttle.IDLimiter
	}{{"local", local}, {"redis", red}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			var (
				admitted, reserved, again atomic.Int64
				wg                        sync.WaitGroup
			)
			start := time.Now()
			for w := range workers {
				wg.Go(func() {
					for i := 0; time.Since(start) < run; i++ {
						id := strconv.Itoa(w) + "/" + strconv.Itoa(i)
						d, err := tc.l.AllowID(ctx, "k", 1, id, horizon)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Reserved {
							reserved.Add(1)
							time.Sleep(d.RetryAfter)
							if d, err = tc.l.AllowID(ctx, "k", 1, id, horizon); err != nil || !d.Allowed {
								t.Errorf("claim of %s after its RetryAfter: %+v, %v", id, d, err)
								return
							}
						}
						if !d.Allowed {
							time.Sleep(d.RetryAfter)
							continue
						}
						admitted.Add(1)
						// Re-presented well within its memory (burst/rate =
						// 200 ms): admitted, charged nothing.
						if d, err := tc.l.AllowID(ctx, "k", 1, id, horizon); err != nil || !d.Allowed {
							t.Errorf("%s again at once: %+v, %v; want admitted", id, d, err)
							return
						}
						again.Add(1)
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			limit := burst + int64(elapsed.Seconds()*perSec) + 1
			t.Logf("%d admitted (%d by reservation) and %d re-presented in %v; at most %d", admitted.Load(), reserved.Load(), again.Load(), elapsed, limit)
			if admitted.Load() > limit {
				t.Fatalf("%d admitted in %v: over burst + rate × elapsed = %d", admitted.Load(), elapsed, limit)
			}
			if reserved.Load() == 0 {
				t.Fatal("no reservations: the test did not exercise them")
			}
		})
	}
}

// TestLocalForgetsIDs feeds one key many ids, admitted and reserved: the
// Local remembers only those of the last burst × Per / Count, and a key
// whose bucket is full and whose ids are all forgotten can be forgotten.
func TestLocalForgetsIDs(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	// 1000 per second, burst 10: ids remembered 10 ms.
	l, err := NewLocal(throttle.PerSecond(1000), 10, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	most := 0
	for i := range 100_000 {
		clock.Advance(500 * time.Microsecond) // twice the refill: half are reserved
		id := strconv.Itoa(i)
		if _, err := l.AllowID(context.Background(), "k", 1, id, time.Second); err != nil {
			t.Fatal(err)
		}
		most = max(most, l.idCount("k"))
	}
	// 10 ms of admissions (at most 10 + 10) and the reservations ahead,
	// at most horizon × rate = 1000.
	st := l.state("k")
	if most > 1050 {
		t.Fatalf("up to %d ids remembered", most)
	}
	st.mu.Lock()
	queued := len(st.ids.queue[0].items) + len(st.ids.queue[1].items)
	st.mu.Unlock()
	t.Logf("at most %d ids remembered, %d queued at the end", most, queued)

	// After all slots and memories have passed, one more id is all there is.
	clock.Advance(5 * time.Second)
	mustAllowID(t, l, "k", "last", 1, 0, true, false)
	if n := l.idCount("k"); n != 1 {
		t.Fatalf("%d ids remembered, want 1", n)
	}
	st.mu.Lock()
	queued = len(st.ids.queue[0].items) + len(st.ids.queue[1].items)
	forgettable := st.forgettable(clock.Now().UnixMicro())
	st.mu.Unlock()
	if queued != 1 || forgettable {
		t.Fatalf("%d ids queued, forgettable %v; want 1 and false (last is remembered)", queued, forgettable)
	}
	clock.Advance(10 * time.Millisecond)
	st.mu.Lock()
	forgettable = st.forgettable(clock.Now().UnixMicro())
	st.mu.Unlock()
	if !forgettable {
		t.Fatal("full, with every id forgotten: not forgettable")
	}
}

// TestLocalIDsBounded checks the steady state exactly: at one admission per
// refill, a key remembers the ids of one time-to-full and no more.
func TestLocalIDsBounded(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, err := NewLocal(throttle.PerSecond(1000), 10, WithClock(clock)) // remembered 10 ms
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		clock.Advance(time.Millisecond)
		mustAllowID(t, l, "k", strconv.Itoa(i), 1, 0, true, false)
		if n := l.idCount("k"); n > 10 {
			t.Fatalf("after %d ids: %d remembered, want at most 10", i+1, n)
		}
	}
	st := l.state("k")
	st.mu.Lock()
	defer st.mu.Unlock()
	if c := cap(st.ids.queue[0].items); c > 256 {
		t.Fatalf("admitted queue capacity %d: not reused", c)
	}
}

// state returns key's bucket (for tests).
func (l *Local) state(key string) *localState {
	v, _ := l.shards[l.shardOf(key)].index.Load(key)
	st, _ := v.(*localState)
	return st
}
