package window

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestRedisBatchConformance(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	throttletest.RunBatch(t, func(t *testing.T, r throttle.Rate, c throttle.Clock, q throttle.QuotaFunc) throttle.BatchLimiter {
		opts := []Option{WithClock(c)}
		if q != nil {
			opts = append(opts, WithQuotas(q))
		}
		return newTestRedis(t, client, r, opts...)
	})
}

// TestBatchOneCall: a batch over many keys is one script call, and a key
// of another type under the prefix fails only its own requests.
func TestBatchOneCall(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	l := newTestRedis(t, client, throttle.Rate{Count: 2, Per: time.Minute})
	if err := client.Set(ctx, l.key("poison"), "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "warm"); err != nil { // loads the script
		t.Fatal(err)
	}
	throttletest.CheckBatchCalls(t, l, func() int { return redistest.ScriptCalls(t, client) })

	// 600 requests: three calls of at most 256; three of cost just over
	// MaxCost/2: a call each (at most MaxCost units, so that a call ends
	// within the timeout).
	heavy := throttle.Request{Key: "heavy", N: MaxCost/2 + 1}
	for _, tc := range []struct {
		reqs  []throttle.Request
		calls int
	}{
		{slices.Repeat([]throttle.Request{{Key: "many", N: 1}}, 600), 3},
		{[]throttle.Request{heavy, heavy, heavy}, 3},
	} {
		big := newTestRedis(t, client, throttle.Rate{Count: 2 * MaxCost, Per: time.Minute})
		before := redistest.ScriptCalls(t, client)
		if _, err := big.AllowBatch(ctx, tc.reqs); err != nil {
			t.Fatal(err)
		}
		if calls := redistest.ScriptCalls(t, client) - before; calls != tc.calls {
			t.Fatalf("a batch of %d requests of cost %d took %d script calls; want %d", len(tc.reqs), tc.reqs[0].N, calls, tc.calls)
		}
	}
}
