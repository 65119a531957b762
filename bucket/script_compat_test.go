package bucket

import (
	"context"
	_ "embed"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// oldTakeLua is bucket.lua as the processes of commit f017374 send it
// (see the file's header).
//
//go:embed testdata/bucket_f017374.lua
var oldTakeLua string

// oldCommand returns the old script's call (EVALSHA of oldSHA) deciding
// groups, each the requests of one key of l (one quota per group), at now
// (µs; "" for the server's TIME): KEYS bucket and pause per key, ARGV now,
// then per key per, count, cap, held (none), m and m requests of min and
// max.
func oldCommand(ctx context.Context, l *Redis, oldSHA, now string, groups [][]takeReq) *redis.IntSliceCmd {
	args := []any{"evalsha", oldSHA, strconv.Itoa(2 * len(groups))}
	for _, g := range groups {
		args = append(args, g[0].key, g[0].pause)
	}
	args = append(args, now)
	for _, g := range groups {
		lim := g[0].lim
		args = append(args, lim.argPer, lim.argCount, lim.argCap, "0", strconv.Itoa(len(g)))
		for _, r := range g {
			args = append(args, strconv.Itoa(r.min), strconv.Itoa(r.max))
		}
	}
	return redis.NewIntSliceCmd(ctx, args...)
}

// TestOldAndNewScriptsShareKeys is a rolling upgrade: processes running
// the script of commit f017374 and the current one take from the same
// buckets (a random mix of AllowN costs and leases, on two keys, now and
// then with key a paused), and every answer must be what the current
// script alone gives for the same requests on two other keys.
func TestOldAndNewScriptsShareKeys(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, client := newTestRedis(t, throttle.Rate{Count: 5, Per: time.Second}, 8, WithClock(clock))
	ctx := ctxT(t)
	oldSHA, err := client.ScriptLoad(ctx, oldTakeLua).Result()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 8))
	old, granted := 0, 0
	at := time.Duration(0)
	for step := range 300 {
		at += time.Duration(rng.IntN(400_000)) * time.Microsecond
		clock.Set(throttletest.T0.Add(at))
		if step%25 == 0 {
			d := time.Duration(100+rng.IntN(500)) * time.Millisecond
			for _, key := range []string{"alone a", "shared a"} {
				if err := l.Pause(ctx, key, d); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A flush of 1-6 requests on keys a and b, in order.
		var alone, shared []*takeCall
		for range 1 + rng.IntN(6) {
			key := []string{"a", "b"}[rng.IntN(2)]
			min := 1 + rng.IntN(3)
			max := min
			if rng.IntN(3) == 0 {
				max += rng.IntN(6)
			}
			alone = append(alone, &takeCall{Req: l.takeReq("alone "+key, l.lims.def, min, max)})
			shared = append(shared, &takeCall{Req: l.takeReq("shared "+key, l.lims.def, min, max)})
		}
		l.takeMany(ctx, alone)
		if rng.IntN(2) == 0 {
			l.takeMany(ctx, shared)
		} else { // an old process: the same flush through the old script
			old++
			var groups [][]takeReq
			var order [][]*takeCall
			for _, c := range shared {
				i := 0
				for i < len(groups) && groups[i][0].key != c.Req.key {
					i++
				}
				if i == len(groups) {
					groups, order = append(groups, nil), append(order, nil)
				}
				groups[i], order[i] = append(groups[i], c.Req), append(order[i], c)
			}
			cmd := oldCommand(ctx, l, oldSHA, strconv.FormatInt(clock.Now().UnixMicro(), 10), groups)
			if err := client.Process(ctx, cmd); err != nil {
				t.Fatal(err)
			}
			v := cmd.Val()
			for i, g := range groups {
				res := make([]taken, len(g))
				if err := l.results(v[:2*len(g)], res, g); err != nil {
					t.Fatalf("step %d: old script: %v", step, err)
				}
				v = v[2*len(g):]
				for j, c := range order[i] {
					c.Res = res[j]
				}
			}
		}
		for i := range alone {
			if alone[i].Err != nil || shared[i].Err != nil || alone[i].Res != shared[i].Res {
				t.Fatalf("step %d, request %d (%+v): shared keys %+v, %v; current script alone %+v, %v",
					step, i, shared[i].Req, shared[i].Res, shared[i].Err, alone[i].Res, alone[i].Err)
			}
			granted += alone[i].Res.granted
		}
	}
	if old < 100 || old > 200 || granted < 200 {
		t.Fatalf("%d of 300 flushes by the old script, %d tokens granted: the replay does not mix the two", old, granted)
	}
}
