package window

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redisscript"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestRedisExpiryMarker: plain decisions on the server's clock write the
// key's expiry and drop its old units only when the expiry marker moves
// (plain.lua), and yet, after every admission, lone or batched, with a
// process of f017374 (which drops the marker) deciding in between:
//   - the key lives until its newest unit leaves the window, and at least
//     until the marker's instant;
//   - the set holds no unit older than a window and a half (and a ms)
//     before its newest;
//   - units out of the window, still in the set, do not count: every
//     window admits exactly its limit.
func TestRedisExpiryMarker(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	rate := throttle.Rate{Count: 3, Per: 200 * time.Millisecond}
	cur := newTestRedis(t, client, rate)
	old := newTestRedis(t, client, rate, WithPrefix(cur.prefix))
	old.calls.Script, old.wholeArgs = redisscript.New(windowF017374Lua), true
	window := rate.PerMicros() + 1 // the server's TIME: a µs more (see window_head.lua)

	check := func(step string, key string) {
		t.Helper()
		units := unitsOf(ctx, client, key)
		if len(units) == 0 {
			t.Fatalf("%s: no unit in %s", step, key)
		}
		newest, oldest := int64(units[len(units)-1].Score), int64(units[0].Score)
		checkExpiry(ctx, t, client, key, rate)
		expires := client.PExpireTime(ctx, key).Val().Milliseconds()
		if e, ok := markerOf(ctx, t, client, key, rate); ok && expires < e {
			t.Fatalf("%s: %s expires at %d ms, before its marker's %d ms", step, key, expires, e)
		}
		if oldest < newest-window-window/2-1000 {
			t.Fatalf("%s: %s holds a unit at %d µs, more than a window and a half before its newest at %d", step, key, oldest, newest)
		}
	}

	// Windows one after another: each admits its limit, lone and then
	// batched, and refuses the next.
	for w := range 6 {
		l := cur
		if w%3 == 2 {
			l = old
		}
		for i := range rate.Count {
			d, err := l.Allow(ctx, "lone")
			if err != nil || !d.Allowed {
				t.Fatalf("window %d, lone %d: %+v, %v", w, i, d, err)
			}
			if l == cur {
				check("lone", cur.key("lone"))
			}
		}
		reqs := []throttle.Request{{Key: "a", N: 2}, {Key: "b", N: 1}, {Key: "a", N: 1}, {Key: "b", N: 2}}
		ds, err := l.AllowBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range ds {
			if !d.Allowed {
				t.Fatalf("window %d, batch %d: %+v", w, i, d)
			}
		}
		if l == cur {
			check("batch", cur.key("a"))
			check("batch", cur.key("b"))
		}
		for _, key := range []string{"lone", "a", "b"} {
			if d, err := l.Allow(ctx, key); err != nil || d.Allowed {
				t.Fatalf("window %d: %s admitted over its limit: %+v, %v", w, key, d, err)
			}
		}
		time.Sleep(rate.Per + 10*time.Millisecond)
	}

	// A steady key, never refused (so never dropped from by a rejection):
	// its old units go only as the marker moves.
	for i := range 15 {
		if d, err := cur.Allow(ctx, "steady"); err != nil || !d.Allowed {
			t.Fatalf("steady %d: %+v, %v", i, d, err)
		}
		check("steady", cur.key("steady"))
		time.Sleep(rate.Per / 2)
	}
}

// markerOf returns the instant (ms) key's expiry marker for rate's window
// says the key lives until (see plain.lua), and whether there is one.
func markerOf(ctx context.Context, t *testing.T, client *redis.Client, key string, rate throttle.Rate) (int64, bool) {
	t.Helper()
	score, err := client.ZScore(ctx, key, "~e"+strconv.FormatInt(rate.PerMicros(), 10)).Result()
	if err == redis.Nil {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return int64(score) + 1<<53, true
}

// checkExpiry fails t unless key lives until its newest unit leaves the
// window (on the server's clock: a µs longer).
func checkExpiry(ctx context.Context, t *testing.T, client *redis.Client, key string, rate throttle.Rate) {
	t.Helper()
	units := unitsOf(ctx, client, key)
	if len(units) == 0 {
		t.Fatalf("no unit in %s", key)
	}
	newest := int64(units[len(units)-1].Score)
	expires := client.PExpireTime(ctx, key).Val().Milliseconds()
	if need := (newest + rate.PerMicros() + 1 + 999) / 1000; expires < need {
		t.Fatalf("%s expires at %d ms, before its newest unit leaves the window (%d ms)", key, expires, need)
	}
}

// replayHook runs every EVALSHA a second time after delay, as a client
// that sends a call again (go-redis retries after a connection error)
// when its first run may have been applied.
type replayHook struct{ delay time.Duration }

func (replayHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h replayHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := next(ctx, cmd); err != nil || cmd.Name() != "evalsha" {
			return err
		}
		time.Sleep(h.delay)
		return next(ctx, cmd)
	}
}

func (replayHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedisExpiryMarkerReplayedCall: a lone AllowN run twice (the second
// run over half a window later, so that its marker moves while its unit
// is already in the set) still writes the expiry, and the admissions
// after it, which do not move the marker, stay covered: the key never
// expires while a unit counts.
func TestRedisExpiryMarkerReplayedCall(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	replaying := redis.NewClient(client.Options())
	t.Cleanup(func() { replaying.Close() })
	replaying.AddHook(replayHook{delay: 210 * time.Millisecond})
	ctx := context.Background()
	rate := throttle.Rate{Count: 5, Per: 400 * time.Millisecond}
	twice := newTestRedis(t, replaying, rate)
	once := newTestRedis(t, client, rate, WithPrefix(twice.prefix))
	if d, err := twice.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("replayed Allow: %+v, %v", d, err)
	}
	checkExpiry(ctx, t, client, twice.key("k"), rate)
	for i := range 3 {
		time.Sleep(40 * time.Millisecond)
		if d, err := once.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow %d: %+v, %v", i, d, err)
		}
		checkExpiry(ctx, t, client, twice.key("k"), rate)
	}
}

// TestRedisExpiryMarkerWindowShrinks: a busy key whose quota's window
// shrinks from 10 s to 200 ms keeps a window and a half of the new window
// in its set (a marker of its own per window), not the old window's.
func TestRedisExpiryMarkerWindowShrinks(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	short := throttle.Rate{Count: 1000, Per: 200 * time.Millisecond}
	l, shrink := newShrinkingRedis(t, client, throttle.Rate{Count: 1000, Per: 10 * time.Second}, short)
	if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	shrink()
	end := time.Now().Add(3 * short.Per)
	for time.Now().Before(end) {
		if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
		time.Sleep(time.Millisecond)
	}
	units := unitsOf(ctx, client, l.key("k"))
	oldest, newest := int64(units[0].Score), int64(units[len(units)-1].Score)
	if span := newest - oldest; span > short.PerMicros()*3/2+1000 {
		t.Fatalf("the set spans %d µs of units (%d of them) after the window shrank to %v: want at most a window and a half", span, len(units), short.Per)
	}
	checkExpiry(ctx, t, client, l.key("k"), short)
}

// TestRedisExpiryMarkersBounded: a key whose window changes at every
// decision (as adaptive.Limit's fractions of a call make it) keeps a
// single marker: a marker that moves drops the others.
func TestRedisExpiryMarkersBounded(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	base := throttle.Rate{Count: 100000, Per: 200 * time.Millisecond}
	var per atomic.Int64
	per.Store(int64(base.Per))
	l := newTestRedis(t, client, base, WithQuotas(func(string) throttle.Quota {
		return throttle.Quota{Rate: throttle.Rate{Count: base.Count, Per: time.Duration(per.Load())}}
	}))
	for i := range 600 {
		per.Store(int64(base.Per) + int64(i%300)*int64(time.Microsecond))
		if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow %d: %+v, %v", i, d, err)
		}
	}
	markers := client.ZCount(ctx, l.key("k"), "-inf", "(0").Val()
	if markers > 1 {
		t.Fatalf("%d expiry markers after 600 decisions under as many windows: want them dropped as markers move", markers)
	}
}

// newShrinkingRedis returns a Redis whose quota is long until shrink is
// called, short after.
func newShrinkingRedis(t *testing.T, client *redis.Client, long, short throttle.Rate) (l *Redis, shrink func()) {
	t.Helper()
	var shrunk atomic.Bool
	l = newTestRedis(t, client, long, WithQuotas(func(string) throttle.Quota {
		if shrunk.Load() {
			return throttle.Quota{Rate: short}
		}
		return throttle.Quota{Rate: long}
	}))
	return l, func() { shrunk.Store(true) }
}

// TestRedisSparseKeyWrites: a plain decision on a set with no unit in the
// window (a key seen less than once a window) deletes it and writes it
// anew, its units, marker and expiry, three writes and no drop, lone or
// batched, of one unit or more, keeping the expiry when it was later; a
// key that is gone is written without the DEL. The sets it leaves are
// the units and the marker, covered.
func TestRedisSparseKeyWrites(t *testing.T) {
	server := redistest.Start(t) // its own: INFO commandstats counts every call
	client := server.Client(t)
	ctx := context.Background()
	rate := throttle.Rate{Count: 2, Per: 100 * time.Millisecond}
	l := newTestRedis(t, client, rate)
	decide := func(reqs ...throttle.Request) {
		t.Helper()
		if d, err := l.Allow(ctx, "a"); err != nil || !d.Allowed {
			t.Fatalf("Allow(a) = %+v, %v", d, err)
		}
		ds, err := l.AllowBatch(ctx, reqs)
		if err != nil || !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("AllowBatch = %+v, %v", ds, err)
		}
	}
	decide(throttle.Request{Key: "b", N: 1}, throttle.Request{Key: "c", N: 2})
	later := map[string]time.Duration{} // an expiry later than the marker's, as a longer window's
	for _, key := range []string{"a", "b", "c"} {
		if err := client.PExpire(ctx, l.key(key), 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		later[key] = client.PExpireTime(ctx, l.key(key)).Val()
	}
	time.Sleep(rate.Per + 20*time.Millisecond) // every unit leaves the window
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	decide(throttle.Request{Key: "b", N: 1}, throttle.Request{Key: "c", N: 2}, throttle.Request{Key: "new", N: 1})
	calls := redistest.CommandCalls(t, client)
	want := map[string]int{"del": 3, "zadd": 4, "pexpireat": 4, "zremrangebyscore": 0}
	for name, n := range want {
		if calls[name] != n {
			t.Errorf("%s: %d calls, want %d (all: %v)", name, calls[name], n, calls)
		}
	}
	for key, n := range map[string]int{"a": 1, "b": 1, "c": 2, "new": 1} {
		k := l.key(key)
		if got := len(unitsOf(ctx, client, k)); got != n {
			t.Errorf("%s holds %d units, want %d", key, got, n)
		}
		if all := client.ZCard(ctx, k).Val(); all != int64(n+1) {
			t.Errorf("%s holds %d members, want its %d units and one marker", key, all, n)
		}
		checkExpiry(ctx, t, client, k, rate)
		if e := client.PExpireTime(ctx, k).Val(); e < later[key] {
			t.Errorf("%s expires at %v, sooner than its %v before", key, e, later[key])
		}
	}
}
