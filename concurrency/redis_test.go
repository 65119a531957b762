package concurrency

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestNewRedisBadInput(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	tests := []struct {
		name   string
		client redis.Scripter
		limit  int
		opts   []Option
		field  string
	}{
		{"nil client", nil, 1, nil, "client"},
		{"nil *redis.Client", (*redis.Client)(nil), 1, nil, "client"},
		{"nil *redis.ClusterClient", (*redis.ClusterClient)(nil), 1, nil, "client"},
		{"zero limit", client, 0, nil, "limit"},
		{"negative limit", client, -1, nil, "limit"},
		{"brace in prefix", client, 1, []Option{WithPrefix("a{b")}, "WithPrefix"},
		{"closing brace in prefix", client, 1, []Option{WithPrefix("a}")}, "WithPrefix"},
		{"zero timeout", client, 1, []Option{WithTimeout(0)}, "WithTimeout"},
		{"negative timeout", client, 1, []Option{WithTimeout(-time.Second)}, "WithTimeout"},
		{"limit above 2^53", client, 1<<53 + 1, nil, "limit"},
		{"Client without ContextTimeoutEnabled", redistest.NoContextClient(t), 1, nil, "client"},
		{"ClusterClient without ContextTimeoutEnabled", redistest.NoContextCluster(t), 1, nil, "client"},
		{"Ring without ContextTimeoutEnabled", redistest.NoContextRing(t), 1, nil, "client"},
		{"Read/WriteTimeout above WithTimeout", redistest.ShortTimeoutsClient(t), 1, []Option{WithTimeout(10 * time.Millisecond)}, "client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := NewRedis(tt.client, tt.limit, tt.opts...)
			if l != nil || !errors.Is(err, throttle.ErrInvalidOption) {
				t.Fatalf("NewRedis = %v, %v; want nil and an error wrapping ErrInvalidOption", l, err)
			}
			var oe *throttle.OptionError
			if !errors.As(err, &oe) || oe.Field != tt.field {
				t.Fatalf("error %v does not name field %q", err, tt.field)
			}
		})
	}
	t.Run("defaults and nil options", func(t *testing.T) {
		l, err := NewRedis(client, 3, nil, WithClock(nil))
		if err != nil || l.clock != nil || l.prefix != defaultPrefix || l.timeout != defaultTimeout || l.limit != 3 {
			t.Fatalf("NewRedis with nil options = %+v, %v", l, err)
		}
	})
}

// TestRedisBadLeaseNoCall checks that a bad lease is refused before any
// Redis call (the client points at a closed port), as a usage error, and
// that a store failure is wrapped and is not one.
func TestRedisBadLeaseNoCall(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	l, err := NewRedis(client, 1)
	if err != nil {
		t.Fatal(err)
	}
	checkBadLease(t, l)
	ctx := context.Background()
	if _, err := l.Acquire(ctx, "k", "id", time.Second); err == nil || throttle.IsUsageError(err) || !strings.HasPrefix(err.Error(), "concurrency: redis: ") {
		t.Fatalf("Acquire against a closed port = %v, want a wrapped redis error", err)
	}
	if err := l.Renew(ctx, "k", "id", time.Second); err == nil || errors.Is(err, ErrNotHeld) || !strings.HasPrefix(err.Error(), "concurrency: redis: ") {
		t.Fatalf("Renew against a closed port = %v, want a wrapped redis error", err)
	}
	if err := l.Release(ctx, "k", "id"); err == nil || !strings.HasPrefix(err.Error(), "concurrency: redis: ") {
		t.Fatalf("Release against a closed port = %v, want a wrapped redis error", err)
	}
}

// checkBadLease expects every bad lease to be refused by Acquire and Renew
// with an error wrapping throttle.ErrInvalidCost.
func checkBadLease(t *testing.T, l limiter) {
	t.Helper()
	ctx := context.Background()
	for _, lease := range []time.Duration{0, -time.Nanosecond, -time.Hour, 1<<62 - 1, 1<<63 - 1} {
		d, err := l.Acquire(ctx, "k", "id", lease)
		if !errors.Is(err, throttle.ErrInvalidCost) || !throttle.IsUsageError(err) || d != (throttle.Decision{}) {
			t.Fatalf("Acquire(lease %v) = %+v, %v; want a usage error wrapping ErrInvalidCost", lease, d, err)
		}
		if !strings.Contains(err.Error(), "lease") {
			t.Fatalf("Acquire(lease %v): error %q does not name the lease", lease, err)
		}
		if err := l.Renew(ctx, "k", "id", lease); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Fatalf("Renew(lease %v) = %v, want ErrInvalidCost", lease, err)
		}
	}
}

func TestRedisDecisionFields(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	l := newTestRedis(t, client, 10)
	d, err := l.Acquire(context.Background(), "fields", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := throttle.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Minute, Source: throttle.SourceRedis}
	if d != want {
		t.Fatalf("Acquire = %+v, want %+v", d, want)
	}
}

// TestRedisServerClock checks that by default a lease ends lease after
// the Redis server's TIME, kept in microseconds.
func TestRedisServerClock(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	l := newTestRedis(t, client, 2)
	before, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "srv", "a", time.Hour); err != nil {
		t.Fatal(err)
	}
	after, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	score, err := client.ZScore(ctx, l.key("srv"), "a").Result()
	if err != nil {
		t.Fatal(err)
	}
	end := int64(score)
	lo, hi := before.Add(time.Hour).UnixMicro(), after.Add(time.Hour).UnixMicro()
	if end < lo || end > hi {
		t.Fatalf("lease ends at %d µs, want within [%d, %d] (server TIME + 1h)", end, lo, hi)
	}
	if n := client.Exists(ctx, l.key("srv")+clockSuffix).Val(); n != 0 {
		t.Fatal("a clock floor key exists without WithClock")
	}
}

// TestRedisExpiry checks that the key expires when its last lease ends,
// follows Renew and Release, and is gone after the last Release; with a
// client clock the clock floor key expires and goes with it.
func TestRedisExpiry(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	for _, clocked := range []bool{false, true} {
		var opts []Option
		if clocked {
			opts = append(opts, WithClock(throttle.SystemClock))
		}
		l := newTestRedis(t, client, 3, opts...)
		key := l.key("ttl")
		keys := []string{key}
		if clocked {
			keys = append(keys, key+clockSuffix)
		}
		pttl := func(lo, hi time.Duration) {
			t.Helper()
			for _, k := range keys {
				got, err := client.PTTL(ctx, k).Result()
				if err != nil || got < lo || got > hi {
					t.Fatalf("clock %v: PTTL %s = %v, %v; want within [%v, %v]", clocked, k, got, err, lo, hi)
				}
			}
		}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		acquire := func(id string, lease time.Duration) {
			t.Helper()
			d, err := l.Acquire(ctx, "ttl", id, lease)
			if err != nil || !d.Allowed {
				t.Fatalf("Acquire(%q) = %+v, %v", id, d, err)
			}
		}
		acquire("a", 10*time.Second)
		pttl(9*time.Second, 10*time.Second+2*ms)
		acquire("b", 20*time.Second)
		pttl(19*time.Second, 20*time.Second+2*ms)
		acquire("a", 10*time.Second) // not the last lease: the expiry stays
		pttl(19*time.Second, 20*time.Second+2*ms)
		must(l.Renew(ctx, "ttl", "a", 30*time.Second))
		pttl(29*time.Second, 30*time.Second+2*ms)
		// From here the key lives until the latest lease it gave ends (its
		// "\0alive" member), shortened or released: deleted sooner, it
		// would look lost to a process that was given that lease.
		must(l.Renew(ctx, "ttl", "a", 5*time.Second))
		pttl(29*time.Second, 30*time.Second+2*ms)
		must(l.Release(ctx, "ttl", "b"))
		pttl(29*time.Second, 30*time.Second+2*ms)
		if d, err := l.Acquire(ctx, "ttl", "c", 3*time.Second); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("Acquire(c) = %+v, %v", d, err)
		}
		must(l.Release(ctx, "ttl", "a"))
		must(l.Release(ctx, "ttl", "c"))
		pttl(29*time.Second, 30*time.Second+2*ms)
		if d, err := l.Acquire(ctx, "ttl", "d", time.Second); err != nil || !d.Allowed || d.Remaining != 2 {
			t.Fatalf("Acquire(d) after every release = %+v, %v; want every slot free (Remaining 2 of 3)", d, err)
		}
	}
}

// TestRedisLeaseEnds uses a short real lease on the Redis server clock: a
// holder that never releases is reclaimed when its lease ends, and the key
// expires then.
func TestRedisLeaseEnds(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	l := newTestRedis(t, client, 1)
	const lease = 200 * time.Millisecond
	start := time.Now()
	if d, err := l.Acquire(ctx, "short", "dead", lease); err != nil || !d.Allowed {
		t.Fatalf("Acquire(dead) = %+v, %v", d, err)
	}
	d, err := l.Acquire(ctx, "short", "next", time.Second)
	if err != nil || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > lease {
		t.Fatalf("Acquire(next) while held = %+v, %v; want rejected with RetryAfter in (0, %v]", d, err, lease)
	}
	if elapsed := time.Since(start); elapsed < lease/2 {
		// Not yet ended: still held (the check is skipped on a machine too
		// slow to make it in time).
		if d, err := l.Acquire(ctx, "short", "next", time.Second); err != nil || d.Allowed {
			t.Fatalf("Acquire(next) %v into the lease = %+v, %v; want rejected", elapsed, d, err)
		}
	}
	// RetryAfter is rounded up, and so is the expiry (by less than 1 ms):
	// the key is gone 2 ms after the RetryAfter, untouched since.
	time.Sleep(d.RetryAfter + 2*time.Millisecond)
	if n := client.Exists(ctx, l.key("short")).Val(); n != 0 {
		t.Fatalf("key still exists %v after the lease ended", time.Since(start))
	}
	if err := l.Renew(ctx, "short", "dead", lease); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Renew after the lease ended = %v, want ErrNotHeld", err)
	}
	if d, err := l.Acquire(ctx, "short", "next", time.Second); err != nil || !d.Allowed {
		t.Fatalf("Acquire(next) after the lease ended = %+v, %v; want admitted", d, err)
	}

	// Releasing the last live slot of a key whose other holder's lease
	// ended frees every slot; the key itself lives until the minute lease
	// it gave would have ended.
	l2 := newTestRedis(t, client, 2)
	for _, h := range []struct {
		id    string
		lease time.Duration
	}{{"dead", 100 * time.Millisecond}, {"live", time.Minute}} {
		if d, err := l2.Acquire(ctx, "mixed", h.id, h.lease); err != nil || !d.Allowed {
			t.Fatalf("Acquire(%s) = %+v, %v", h.id, d, err)
		}
	}
	time.Sleep(110 * time.Millisecond)
	if err := l2.Release(ctx, "mixed", "live"); err != nil {
		t.Fatal(err)
	}
	if d, err := l2.Acquire(ctx, "mixed", "new", time.Second); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("Acquire after the last live lease's Release = %+v, %v; want admitted with both slots free", d, err)
	}
}

func TestRedisNoScript(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	l := newTestRedis(t, client, 5)
	for i := range 3 {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := l.Acquire(ctx, "noscript", string(rune('a'+i)), time.Minute)
		if err != nil || !d.Allowed || d.Remaining != 4-i {
			t.Fatalf("Acquire after SCRIPT FLUSH = %+v, %v", d, err)
		}
	}
	ok, err := client.ScriptExists(ctx, slotsScript.Hash()).Result()
	if err != nil || !ok[0] {
		t.Fatalf("script not reloaded: %v, %v", ok, err)
	}
}

// TestRedisRejectionWritesNothing compares the key's DUMP around
// rejections.
func TestRedisRejectionWritesNothing(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	l := newTestRedis(t, client, 1, WithClock(clock))
	if d, err := l.Acquire(ctx, "full", "a", time.Minute); err != nil || !d.Allowed {
		t.Fatalf("Acquire = %+v, %v", d, err)
	}
	before := client.Dump(ctx, l.key("full")).Val()
	clock.Advance(time.Second)
	for _, id := range []string{"b", "c", ""} {
		if d, err := l.Acquire(ctx, "full", id, time.Minute); err != nil || d.Allowed {
			t.Fatalf("Acquire(%q) on a full key = %+v, %v", id, d, err)
		}
	}
	if after := client.Dump(ctx, l.key("full")).Val(); after != before {
		t.Fatal("a rejection changed the sorted set")
	}
}

// TestRedisTimeout pauses a private server: a call returns an error within
// about the WithTimeout deadline.
func TestRedisTimeout(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	prefix := freshPrefix()
	l, err := NewRedis(client, 1, WithPrefix(prefix), WithTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Warm with a patient twin (same keys, the tests' timeout): a loaded
	// machine may not dial and load the script within 100 ms.
	if _, err := newTestRedis(t, client, 1, WithPrefix(prefix)).Acquire(ctx, "k", "a", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	start := time.Now()
	_, err = l.Acquire(ctx, "k", "b", time.Second)
	elapsed := time.Since(start)
	if err == nil || throttle.IsUsageError(err) || !strings.HasPrefix(err.Error(), "concurrency: redis: ") {
		t.Fatalf("Acquire on a paused server = %v, want a wrapped timeout", err)
	}
	if elapsed > 2*time.Second {
		t.Fatalf("Acquire on a paused server took %v with a 100ms timeout", elapsed)
	}
}
