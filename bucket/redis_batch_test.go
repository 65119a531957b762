package bucket

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestBatchTakesAsOneByOne sends random batches of takes (AllowN costs and
// leases of min..max) on two keys as coalesced flushes, and the same
// requests one by one on two other keys at the same instant, now and then
// with key a paused: every answer must be the same.
func TestBatchTakesAsOneByOne(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, _ := newTestRedis(t, throttle.Rate{Count: 5, Per: time.Second}, 8, WithClock(clock))
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(3, 5))
	granted, paused := 0, 0
	at := time.Duration(0)
	for step := range 200 {
		at += time.Duration(rng.IntN(400_000)) * time.Microsecond
		clock.Set(throttletest.T0.Add(at))
		if step%20 == 0 { // pause key a for a while: its requests in a batch are answered apart from b's
			d := time.Duration(100+rng.IntN(500)) * time.Millisecond
			for _, key := range []string{"one-by-one a", "batched a"} {
				if err := l.Pause(ctx, key, d); err != nil {
					t.Fatal(err)
				}
			}
		}
		k := 1 + rng.IntN(10)
		calls := make([]*takeCall, k)
		want := make([]taken, k)
		for i := range calls {
			key := []string{"a", "b"}[rng.IntN(2)]
			min := 1 + rng.IntN(3)
			max := min
			if rng.IntN(3) == 0 {
				max += rng.IntN(6)
			}
			var err error
			want[i], err = l.batch.Do(ctx, l.takeReq("one-by-one "+key, l.lims.def, min, max))
			if err != nil {
				t.Fatal(err)
			}
			granted += want[i].granted
			if want[i].paused > 0 {
				paused++
			}
			calls[i] = &takeCall{Req: l.takeReq("batched "+key, l.lims.def, min, max)}
		}
		l.takeMany(ctx, calls)
		for i, c := range calls {
			if c.Err != nil || c.Res != want[i] {
				t.Fatalf("step %d, request %d of %d (%+v): batched %+v, %v; one by one %+v", step, i, k, c.Req, c.Res, c.Err, want[i])
			}
		}
	}
	if granted < 200 || paused < 20 {
		t.Fatalf("only %d tokens granted, %d requests paused: the replay does not exercise takes and pauses", granted, paused)
	}
}

// TestCoalescedLoad puts 500 goroutines on one key at once, beside two
// CPU-bound goroutines: no call may fail, exactly the burst is admitted,
// and Redis runs far fewer script calls than there are decisions. The
// limiter's timeout is the tests' generous one: whether the default 50 ms
// suffices is a matter of speed, measured by BenchmarkCoalescedLoad.
func TestCoalescedLoad(t *testing.T) {
	r := throttle.Rate{Count: 1, Per: time.Hour}
	const burst = 100
	l, client := newTestRedis(t, r, burst)
	ctx := context.Background()
	// Warm, as a running service is: the script loaded, a connection open.
	if _, err := l.Allow(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	calls0 := redistest.ScriptCalls(t, client)
	const goroutines = 500
	admitted := throttletest.Burst(t, l, "hot", goroutines)
	if admitted != burst {
		t.Fatalf("%d admitted of %d with a burst of %d and no refill to speak of, want exactly %d", admitted, goroutines, burst, burst)
	}
	if scripts := redistest.ScriptCalls(t, client) - calls0; scripts > goroutines/4 {
		t.Fatalf("%d script calls for %d decisions: not coalesced", scripts, goroutines)
	}
}

// TestPoisonKeyFailsAlone sends flushes whose keys include one holding a
// string (another program's key under the prefix): that key's requests
// get Redis's error, every other bucket's are decided as if it were not
// there, and taken from once.
func TestPoisonKeyFailsAlone(t *testing.T) {
	const burst = 3
	l, client := newTestRedis(t, throttle.Rate{Count: 1, Per: time.Hour}, burst)
	ctx := ctxT(t)
	if err := client.RPush(ctx, l.key("poison"), "not a bucket").Err(); err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "poison", "b", "poison", "c"}
	for round := range 5 {
		calls := make([]*takeCall, len(keys))
		for i, key := range keys {
			max := 1
			if key == "poison" { // a lease: its arguments are skipped over too
				max = 2
			}
			calls[i] = &takeCall{Req: l.takeReq(key, l.lims.def, 1, max)}
		}
		l.takeMany(ctx, calls)
		for i, c := range calls {
			switch {
			case keys[i] == "poison":
				if c.Err == nil || !strings.Contains(c.Err.Error(), "WRONGTYPE") {
					t.Fatalf("round %d: poison key: %+v, %v; want its WRONGTYPE error", round, c.Res, c.Err)
				}
			case c.Err != nil || (c.Res.granted == 1) != (round < burst):
				t.Fatalf("round %d, key %q: %+v, %v; want granted %v", round, keys[i], c.Res, c.Err, round < burst)
			}
		}
	}
}

// TestCompactForm: a flush of buckets with one request of one token each,
// under one quota, goes in bucket.lua's compact form (held alone for each
// bucket), and takes as the same requests one by one: from a fresh
// bucket, an empty one, a paused one, one of another type and one partly
// taken; and a lost bucket (the server's clock) is taken as empty.
func TestCompactForm(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, client := newTestRedis(t, throttle.Rate{Count: 1, Per: time.Minute}, 3, WithClock(clock))
	sent := redistest.CountArgv(client, 2, "-1")
	ctx := ctxT(t)
	for _, prefix := range []string{"one-by-one ", "batched "} {
		for key, n := range map[string]int{"empty": 3, "part": 1, "lost": 1} {
			if d, err := l.AllowN(ctx, prefix+key, n); err != nil || !d.Allowed {
				t.Fatalf("AllowN(%s, %d) = %+v, %v", prefix+key, n, d, err)
			}
		}
		if err := client.Del(ctx, l.key(prefix+"lost")).Err(); err != nil {
			t.Fatal(err)
		}
		if err := l.Pause(ctx, prefix+"paused", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := client.RPush(ctx, l.key(prefix+"poison"), "not a bucket").Err(); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{"fresh", "empty", "paused", "poison", "part", "lost"}
	for round := range 3 {
		clock.Set(throttletest.T0.Add(time.Duration(round+1) * 10 * time.Second))
		calls := make([]*takeCall, len(keys))
		want := make([]takeCall, len(keys)) // one by one, on twin keys
		for i, key := range keys {
			want[i].Res, want[i].Err = l.batch.Do(ctx, l.takeReq("one-by-one "+key, l.lims.def, 1, 1))
			calls[i] = &takeCall{Req: l.takeReq("batched "+key, l.lims.def, 1, 1)}
		}
		l.takeMany(ctx, calls)
		for i, c := range calls {
			w := want[i]
			if (c.Err != nil) != (w.Err != nil) || (keys[i] == "poison") != (c.Err != nil) || c.Res != w.Res {
				t.Fatalf("round %d, %s: batched %+v, %v; one by one %+v, %v", round, keys[i], c.Res, c.Err, w.Res, w.Err)
			}
		}
	}
	if sent.Load() < 3 {
		t.Fatalf("%d calls in the compact form, want one a round", sent.Load())
	}

	served, client := newTestRedis(t, throttle.Rate{Count: 1, Per: time.Minute}, 3)
	sent = redistest.CountArgv(client, 2, "-1")
	if d, err := served.Allow(ctx, "lost"); err != nil || !d.Allowed {
		t.Fatalf("Allow(lost) = %+v, %v", d, err)
	}
	if err := client.Del(ctx, served.key("lost")).Err(); err != nil {
		t.Fatal(err)
	}
	calls := []*takeCall{{Req: served.takeReq("lost", served.lims.def, 1, 1)}, {Req: served.takeReq("new", served.lims.def, 1, 1)}}
	served.takeMany(ctx, calls)
	if calls[0].Err != nil || calls[0].Res.granted != 0 || calls[1].Err != nil || calls[1].Res.granted != 1 || sent.Load() != 1 {
		t.Fatalf("lost, then a new bucket, in %d compact calls: %+v, %v; %+v, %v; want the lost one empty", sent.Load(), calls[0].Res, calls[0].Err, calls[1].Res, calls[1].Err)
	}
}
