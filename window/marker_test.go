package window

import (
	"context"
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
		expires := client.PExpireTime(ctx, key).Val().Milliseconds()
		if need := (newest + window + 999) / 1000; expires < need {
			t.Fatalf("%s: %s expires at %d ms, before its newest unit leaves the window (%d ms)", step, key, expires, need)
		}
		if marker, err := client.ZScore(ctx, key, "~e").Result(); err == nil && expires < int64(-marker) {
			t.Fatalf("%s: %s expires at %d ms, before its marker's %d ms", step, key, expires, int64(-marker))
		} else if err != nil && err != redis.Nil {
			t.Fatal(err)
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
