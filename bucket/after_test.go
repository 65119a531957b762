package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestAllowIDAfterGivesBackToFull: moving a reservation past a bucket that
// its give-back fills again (the slot came and went) decides anew, in
// Local and Redis alike: nothing reserved (the bucket will be full by
// then), RetryAfter the after asked for.
func TestAllowIDAfterGivesBackToFull(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 1, Per: time.Second}
	clock := throttletest.NewClock(throttletest.T0)
	local, err := NewLocal(r, 1, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	red, err := NewRedis(client, r, 1, WithClock(clock), WithPrefix(redistest.Prefix("bucketafter")), WithTimeout(redistest.CallTimeout))
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]throttle.SlotLimiter{"Local": local, "Redis": red} {
		clock.Set(throttletest.T0)
		ctx := context.Background()
		if d, err := l.AllowID(ctx, "k", 1, "a", 0); err != nil || !d.Allowed {
			t.Fatalf("%s a: %+v, %v", name, d, err)
		}
		if d, err := l.AllowID(ctx, "k", 1, "b", 10*time.Second); err != nil || !d.Reserved || d.RetryAfter != time.Second {
			t.Fatalf("%s b: %+v, %v; want reserved 1s ahead", name, d, err)
		}
		clock.Advance(1500 * time.Millisecond)
		d, err := l.AllowIDAfter(ctx, "k", 1, "b", 10*time.Second, time.Second)
		if err != nil || d.Allowed || d.Reserved || d.RetryAfter != time.Second {
			t.Fatalf("%s b after 1s: %+v, %v; want open in 1s, nothing reserved", name, d, err)
		}
		if d, err := l.AllowN(ctx, "k", 1); err != nil || !d.Allowed {
			t.Fatalf("%s: the bucket is full again: %+v, %v", name, d, err)
		}
	}
}
