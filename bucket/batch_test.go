package bucket

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestRedisBatchConformance(t *testing.T) {
	throttletest.RunBatch(t, func(t *testing.T, r throttle.Rate, c throttle.Clock, q throttle.QuotaFunc) throttle.BatchLimiter {
		opts := []Option{WithClock(c)}
		if q != nil {
			opts = append(opts, WithQuotas(q))
		}
		l, _ := newTestRedis(t, r, r.Count, opts...)
		return l
	})
}

// TestBatchOneCall: a batch over many keys is one script call, and a key
// of another type under the prefix fails only its own requests.
func TestBatchOneCall(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	l, err := NewRedis(client, throttle.PerHour(2), 2, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
	if err != nil {
		t.Fatal(err)
	}
	if err := client.RPush(ctx, l.key("poison"), "not a bucket").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "warm"); err != nil { // loads the script
		t.Fatal(err)
	}
	var reqs []throttle.Request
	for i := range 90 {
		reqs = append(reqs, throttle.Request{Key: fmt.Sprint("k", i%30), N: 1})
	}
	before := redistest.ScriptCalls(t, client)
	ds, err := l.AllowBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if calls := redistest.ScriptCalls(t, client) - before; calls != 1 {
		t.Fatalf("a batch of 90 requests over 30 keys took %d script calls; want 1", calls)
	}
	for i, d := range ds {
		if want := i < 60; d.Allowed != want || d.Source != throttle.SourceRedis {
			t.Fatalf("reqs[%d] (%q, its %d. request): %+v; want allowed %v (burst 2 per key)", i, reqs[i].Key, i/30+1, d, want)
		}
	}

	reqs = []throttle.Request{{Key: "x", N: 1}, {Key: "poison", N: 1}, {Key: "y", N: 2}, {Key: "poison", N: 1}}
	ds, err = l.AllowBatch(ctx, reqs)
	be, failed := throttletest.BatchErrorOf(t, err)
	if failed != "1,3" || !strings.Contains(be.Errs[1].Error(), "WRONGTYPE") {
		t.Fatalf("batch with a foreign key: %v (failed %s); want reqs 1 and 3 failed with WRONGTYPE", err, failed)
	}
	if !ds[0].Allowed || !ds[2].Allowed || ds[1] != (throttle.Decision{}) {
		t.Fatalf("batch with a foreign key: %+v; want x and y admitted, the foreign key's Decisions zero", ds)
	}
}

// TestBatchQuotaError: a key whose quota is invalid fails the call, naming
// its request, before anything is decided.
func TestBatchQuotaError(t *testing.T) {
	quotas := func(key string) throttle.Quota {
		if key == "bad" {
			return throttle.Quota{Rate: throttle.Rate{Count: -1, Per: 0}}
		}
		return throttle.Quota{}
	}
	l, _ := newTestRedis(t, throttle.PerSecond(5), 5, WithQuotas(quotas))
	ctx := context.Background()
	_, err := l.AllowBatch(ctx, []throttle.Request{{Key: "good", N: 5}, {Key: "bad", N: 1}})
	if !errors.Is(err, throttle.ErrInvalidOption) || !strings.Contains(err.Error(), "reqs[1]") {
		t.Fatalf("AllowBatch with an invalid quota at reqs[1]: %v; want an error naming reqs[1], wrapping ErrInvalidOption", err)
	}
	if d, err := l.AllowN(ctx, "good", 5); err != nil || !d.Allowed {
		t.Fatalf("AllowN(good, 5) after the refused batch = %+v, %v; want admitted (nothing charged)", d, err)
	}
}
