package bucket

import (
	"context"
	"errors"
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
	throttletest.CheckBatchCalls(t, l, func() int { return redistest.ScriptCalls(t, client) })
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
